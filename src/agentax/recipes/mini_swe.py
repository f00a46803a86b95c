"""The bash tasks solved by a mini-swe-agent agent, trained unchanged (`mini_swe`).

The agent is mini-swe-agent's own (`minisweagent`, https://mini-swe-agent.com): its
`DefaultAgent` loop with its `LitellmTextbasedModel` (the classic format: each reply holds one
```` ```mswea_bash_command ```` block, the command's output comes back as a user message
rendered by the model's `observation_template`, and the agent submits by running
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). Nothing in the harness is changed: the model
is LiteLLM's `openai/agentax` pointed at the engine's endpoint (`api_base` / `api_key` of the
episode's session, as `OPENAI_BASE_URL` / `OPENAI_API_KEY` would give it), and the commands
run in agentax's sandbox through `SandboxEnvironment`, a mini-swe-agent environment (its
`LocalEnvironment` with `execute` sending each command to an `agentax.tools.Sandbox`, one per
episode, holding the task's files). `make_env` wraps the whole in an `OpenAIAgentEnvironment`,
which records each episode token-exactly (the trajectory's tokens are the engine's).

mini-swe-agent is synchronous (`litellm.completion`, `subprocess`): each episode runs in a
worker thread of this module's own pool (`MAX_EPISODE_THREADS`), and each command is handed
to the sandbox on the collector's event loop. Settings given to the harness, all through its
own configuration: short `SYSTEM_TEMPLATE` / `INSTANCE_TEMPLATE` (every byte is a token for the
tiny byte-level model; mini-swe-agent's default prompts are ~3,000 bytes), `step_limit=
MAX_STEPS`, `cost_tracking="ignore_errors"` (the endpoint's model has no price), and the
environment variables `MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT=1` (no retry with 4-60 s back-off
after the endpoint's 400 for a spent episode budget: the episode ends, truncated),
`MSWEA_SILENT_STARTUP=1` and `LITELLM_LOCAL_MODEL_COST_MAP=True` (no network at import), each
set only when unset.

Reward: 1.0 when the agent submitted (exit status `Submitted`) and out.txt in the sandbox is
then exactly right (the bash recipe's check), else 0. Tasks of `agentax.envs.swebench_tasks`
(SWE-bench-format instances, e.g. the swe_real recipe's) run in a sandbox holding the
instance's repository instead, and score 1.0 when SWE-bench's check finds the submitted tree
resolved (`evaluate_in_sandbox`; repositories from `SWE_SNAPSHOTS`). A reply with no command block, or two,
is the harness's `FormatError`: it drops the reply from its history and sends its format
message instead, so the next request is not a continuation and the trajectory starts a new
segment (`segment_breaks`); after 3 in a row it exits (`RepeatedFormatError`). The warm start renders demonstrations as the harness's requests
render (`demos`): the system and instance templates, the command blocks, and the observation
as `observation_template` writes it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import threading
from collections.abc import Sequence
from typing import Any

from agentax.envs import RepoSnapshots, SWEInstance, evaluate_in_sandbox
from agentax.recipes import bash as _bash
from agentax.recipes import swe_real as _swe_real
from agentax.recipes._tasks import PromptToolAgent
from agentax.records import Message, Task
from agentax.serve import OpenAIAgentEnvironment, Reward
from agentax.tools import Sandbox, SandboxConfig

__all__ = ["INSTANCE_TEMPLATE", "MAX_STEPS", "SUBMIT", "SWE_SNAPSHOTS", "SYSTEM_TEMPLATE", "build_agent",
           "demos", "make_agent", "make_env", "run_agent", "sandbox_environment", "tasks"]

SYSTEM_TEMPLATE = "Reply with one mswea_bash_command block. Then submit."
"""mini-swe-agent's `system_template` (the first message of every request)."""

INSTANCE_TEMPLATE = "{{task}}"
"""mini-swe-agent's `instance_template` (the task's message)."""

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The command with which a mini-swe-agent agent says it is done."""

MAX_STEPS = 3
"""`DefaultAgent(step_limit=...)`: model calls an episode may make."""

MAX_EPISODE_THREADS = 64
"""Worker threads for episodes (each holds one for its whole length)."""

SANDBOX = SandboxConfig(timeout_s=10.0)
"""Limits of each command's sandboxed run."""

_HARNESS_ENV = {"MSWEA_SILENT_STARTUP": "1", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _need_harness() -> None:
    for key, value in _HARNESS_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import litellm
        import minisweagent  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the install
        raise ImportError("the mini_swe recipe needs mini-swe-agent: "
                          "pip install 'agentax[mini-swe]'") from None
    # LiteLLM prints a banner for each exception it handles, such as its failed price lookup
    # of every reply (the endpoint's model has no price; cost_tracking ignores it).
    litellm.suppress_debug_info = True


def _episode_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(MAX_EPISODE_THREADS,
                                                          thread_name_prefix="mini-swe")
        return _pool


def sandbox_environment(sandbox: Sandbox, loop: asyncio.AbstractEventLoop) -> Any:
    """A mini-swe-agent environment that runs each command in `sandbox` (on `loop`).

    It is mini-swe-agent's `LocalEnvironment` with `execute` replaced: the command runs as
    `bash -c` in the sandbox's workdir (stdout then stderr, as one output), a run the sandbox
    killed reports why in `exception_info`, and the harness's own check for the submit line
    follows. It must be called from a thread other than `loop`'s.
    """
    from minisweagent.environments.local import LocalEnvironment

    class SandboxEnvironment(LocalEnvironment):
        def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
            command = action.get("command", "")
            limit = float(timeout or sandbox.config.timeout_s)
            future = asyncio.run_coroutine_threadsafe(sandbox.run_bash(command, timeout_s=limit), loop)
            # bounded: a loop that has stopped (the run's end) must not hold the thread forever
            result = future.result(timeout=limit + 30.0)
            output: dict[str, Any] = {
                "output": result.stdout + result.stderr,
                "returncode": -1 if result.exit_code is None else result.exit_code,
                "exception_info": "",
            }
            if result.killed_reason:
                output["exception_info"] = f"the command was killed: {result.killed_reason}"
            self._check_finished(output)
            return output

    return SandboxEnvironment(timeout=int(sandbox.config.timeout_s))


def build_agent(base_url: str, api_key: str, env: Any, *, timeout_s: float | None = None) -> Any:
    """mini-swe-agent's `DefaultAgent`, its model LiteLLM's `openai/agentax` at `base_url`."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    kwargs: dict[str, Any] = {"api_base": base_url, "api_key": api_key}
    if timeout_s is not None:
        kwargs["timeout"] = timeout_s
    model = LitellmTextbasedModel(model_name="openai/agentax", model_kwargs=kwargs,
                                  cost_tracking="ignore_errors")
    return DefaultAgent(model, env, system_template=SYSTEM_TEMPLATE,
                        instance_template=INSTANCE_TEMPLATE, step_limit=MAX_STEPS, cost_limit=0.0)


SWE_SNAPSHOTS: RepoSnapshots | None = None
"""Where SWE-bench-format tasks' repositories come from; None: `swe_real.snapshots()` (the
sdist cache; a row's absolute `snapshot` path is used as it is)."""


def _swe_episode(base_url: str, api_key: str, timeout_s: float | None, task: Task,
                 loop: asyncio.AbstractEventLoop) -> float:
    """A SWE-bench-format task (`swebench_tasks`): the repository at its base state in the
    sandbox, the agent's run, then SWE-bench's resolved check on what it left there."""
    inst = SWEInstance.from_row(task.meta["swe_instance"], where=f"task {task.id}")
    base = (SWE_SNAPSHOTS or _swe_real.snapshots()).path(inst)
    with Sandbox(SANDBOX, workdir=base) as sandbox:
        agent = build_agent(base_url, api_key, sandbox_environment(sandbox, loop), timeout_s=timeout_s)
        exit_info = agent.run(task.prompt)
        if exit_info.get("exit_status") != "Submitted":
            return 0.0
        score = asyncio.run_coroutine_threadsafe(evaluate_in_sandbox(sandbox, inst, base), loop)
        return 1.0 if score.result(timeout=inst.timeout_s + 30.0).resolved else 0.0


def _episode(base_url: str, api_key: str, timeout_s: float | None, task: Task,
             loop: asyncio.AbstractEventLoop) -> float:
    """One episode, in a worker thread: the sandbox, the agent's run, the out.txt check (or, for
    a SWE-bench-format task, SWE-bench's check)."""
    if "swe_instance" in task.meta:
        return _swe_episode(base_url, api_key, timeout_s, task, loop)
    with Sandbox(SANDBOX, files=dict(task.meta.get("files", {}))) as sandbox:
        agent = build_agent(base_url, api_key, sandbox_environment(sandbox, loop), timeout_s=timeout_s)
        exit_info = agent.run(task.prompt)
        if exit_info.get("exit_status") != "Submitted":
            return 0.0
        return _bash._check(sandbox, task, "")


async def run_agent(client: Any, task: Task) -> Reward:
    """One episode at the endpoint behind `client` (only its URL, key and timeout are used:
    LiteLLM makes its own connection). The reward is the out.txt check."""
    loop = asyncio.get_running_loop()
    timeout = client.timeout if isinstance(client.timeout, (int, float)) else None
    return Reward(await loop.run_in_executor(_episode_pool(), _episode, str(client.base_url).rstrip("/"),
                                             client.api_key, timeout, task, loop))


def make_env(**kwargs: Any) -> OpenAIAgentEnvironment:
    """The mini-swe-agent agent as an environment (kwargs: `OpenAIAgentEnvironment`'s)."""
    _need_harness()
    return OpenAIAgentEnvironment(run_agent, **kwargs)


def make_agent(*, tool_format: str = "hermes") -> PromptToolAgent:
    """Not an agent of the episodes (mini-swe-agent is its own): it tells the warm start that
    the requests list no tools (the text-based model sends none)."""
    return PromptToolAgent([_bash.BASH_SCHEMA], list_tools=False, tool_format=tool_format)


tasks = _bash.tasks
"""The bash recipe's tasks: out.txt from in.txt or a word (echo, sort, uniq, count, reverse)."""


def _block(command: str) -> str:
    return f"```mswea_bash_command\n{command}\n```"


def _observation(output: str, returncode: int = 0) -> str:
    """The observation as `LitellmTextbasedModel`'s default `observation_template` renders it."""
    return f"<returncode>{returncode}</returncode>\n<output>\n{output}</output>"


def demos(train_tasks: Sequence[Task], n: int, seed: int, *,
          right_rate: float = 0.6) -> list[list[Message]]:
    """What the harness's episodes look like: the system and task messages, one command block
    (the right command with probability `right_rate`, else the bash recipe's near miss), its
    observation, and the submit block."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = train_tasks[i % len(train_tasks)]
        _, right, wrong, _ = _bash._KINDS[task.meta["kind"]]
        word = task.meta.get("word")
        command = (right if rng.random() < right_rate else wrong).format(w=word)
        printed = f"{word}\n" if command == f"echo {word}" else ""
        out.append([
            Message(role="system", content=SYSTEM_TEMPLATE),
            Message(role="user", content=task.prompt),
            Message(role="assistant", content=_block(command)),
            Message(role="user", content=_observation(printed)),
            Message(role="assistant", content=_block(SUBMIT)),
        ])
    return out
