"""`TrajectoryBuilder`: one episode as ONE token stream, token-exact, never re-tokenized.

The collector feeds it, in order:

    ids = b.start(agent.messages)                 # prompt ids (chat template + generation prompt)
    completion = await engine.generate(ids, ...)
    reply = b.add_completion(completion)          # generated ids appended as-is (loss mask 1)
    action = agent.act(reply)
    result = await env.step(action); b.record_step(action, result)
    ids = b.add_observation(agent.observe(result.observation))   # suffix to feed next (mask 0)
    ...
    trajectory = b.build(reward, status, task_id=task.id)

The generated ids are kept exactly as the engine sampled them (with their logprobs and policy
versions); only observation tokens are produced by templating, and only the *new* part of the
conversation is encoded each turn.

How the observation suffix is found (the rule documented in docs/agents.md):

1. *Prefix-stable* (the normal case): render the whole conversation, with each assistant turn
   as the verbatim text the model generated, plus the new messages and the generation prompt.
   If that text starts with the text emitted so far, the suffix is the remainder. The stream
   then equals, id for id, what the chat template renders for the same conversation.
2. *Divergent* templates rewrite earlier turns (Qwen3 drops the reasoning of earlier assistant
   turns; Llama 3 trims whitespace). The stream is NOT rewritten: the training stream is what
   the model saw and generated. The suffix is what the template writes after the *same-
   numbered* end-of-turn token (`agentax.text.render_continuation`): the rest of the turn end,
   the new messages, the generation prompt. A reply cut by max_tokens gets the template's
   end-of-turn token from the suffix (mask 0). Each divergence is recorded in `Trajectory.info["template_divergence"]` (turn, character
   offset, the two texts around it) and counted in `info["template_divergences"]`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agentax.records import (
    Action,
    Completion,
    Message,
    Observation,
    StepResult,
    Trajectory,
    TrajectoryStatus,
    Turn,
)
from agentax.text import render_continuation

__all__ = ["TrajectoryBuilder", "decode_reply"]



def decode_reply(tokenizer: Any, token_ids: Sequence[int] | np.ndarray, *, stop_ids: Sequence[int] = ()) -> str:
    """Reply text of generated ids: special tokens kept (tool-call markers are special in some
    vocabularies), a final eos / stop id dropped."""
    ids = [int(i) for i in np.asarray(token_ids).reshape(-1)]
    if ids and (ids[-1] in tuple(tokenizer.eos_token_ids) or ids[-1] in tuple(stop_ids)):
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=False)


@dataclasses.dataclass
class _Turn:
    prompt_ids: np.ndarray
    completion: Completion | None = None
    reply: str = ""
    action: Action | None = None
    reward: float = 0.0
    observation: Observation | None = None
    env_time_s: float = 0.0


class TrajectoryBuilder:
    """Assembles one episode's token stream with its loss mask, logprobs and versions.

    Args:
      tokenizer: an `agentax.text.Tokenizer` (its `chat_template` renders the conversation).
      tools: OpenAI tool schemas rendered into the prompt (use `agent.tools`), or None.
      task_id: default `task_id` for `build`.
      stop_ids: extra ids (besides the tokenizer's eos ids) that end an assistant turn.
      template_kwargs: extra variables for the template (e.g. `enable_thinking=False`).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        task_id: str = "",
        stop_ids: Sequence[int] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = [dict(t) for t in tools] if tools else None
        self.task_id = task_id
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.template_kwargs = dict(template_kwargs or {})
        self._ids: list[np.ndarray] = []
        self._mask: list[np.ndarray] = []
        self._logprobs: list[np.ndarray] = []
        self._versions: list[np.ndarray] = []
        self._messages: list[Message] = []
        self._text = ""  # everything emitted so far, as text
        self._turns: list[_Turn] = []
        self._pending_prompt: np.ndarray | None = None
        self._divergences: list[dict[str, Any]] = []
        self._started = False

    # ------------------------------------------------------------------ rendering

    def _render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.chat_template.render(
            [m.to_dict() for m in messages],
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def _encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False), dtype=np.int32)

    def _append(self, ids: np.ndarray, mask: int, logprobs: np.ndarray | None = None, versions: np.ndarray | None = None) -> None:
        n = ids.shape[0]
        self._ids.append(ids.astype(np.int32, copy=False))
        self._mask.append(np.full(n, mask, dtype=np.int8))
        self._logprobs.append(np.zeros(n, np.float32) if logprobs is None else np.asarray(logprobs, np.float32))
        self._versions.append(np.full(n, -1, np.int32) if versions is None else np.asarray(versions, np.int32))

    # ------------------------------------------------------------------ the episode

    @property
    def num_tokens(self) -> int:
        """Tokens in the stream so far (prompt + generated + observations)."""
        return int(sum(a.shape[0] for a in self._ids))

    @property
    def started(self) -> bool:
        """True once `start` rendered the first prompt."""
        return self._started

    @property
    def messages(self) -> list[Message]:
        """The conversation as rendered: assistant turns are the verbatim generated text."""
        return list(self._messages)

    @property
    def divergences(self) -> list[dict[str, Any]]:
        return [dict(d) for d in self._divergences]

    def start(self, messages: Sequence[Message]) -> np.ndarray:
        """Render the first prompt (with the generation prompt); returns its ids [P] int32."""
        if self._started:
            raise RuntimeError("TrajectoryBuilder.start() was already called; use one builder per episode")
        self._started = True
        self._messages = list(messages)
        self._text = self._render(self._messages, add_generation_prompt=True)
        ids = self._encode(self._text)
        self._append(ids, 0)
        self._pending_prompt = ids
        return ids

    def add_completion(self, completion: Completion) -> str:
        """Append the model's generated ids (mask 1, with logprobs and versions) as they are.

        Returns:
          The reply text for `agent.act` (special tokens kept, final eos / stop id dropped).
        """
        if self._pending_prompt is None:
            raise RuntimeError("add_completion() needs a prompt first: call start() or add_observation()")
        ids = np.asarray(completion.token_ids, dtype=np.int32).reshape(-1)
        n = ids.shape[0]
        if np.shape(completion.logprobs) != (n,) or np.shape(completion.versions) != (n,):
            raise ValueError(
                f"Completion has {n} token ids but logprobs {np.shape(completion.logprobs)} and versions "
                f"{np.shape(completion.versions)}; the engine must return one logprob and version per token"
            )
        self._append(ids, 1, completion.logprobs, completion.versions)
        reply = decode_reply(self.tokenizer, ids, stop_ids=self.stop_ids)
        self._text += self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        self._messages.append(Message(role="assistant", content=reply))
        self._turns.append(_Turn(prompt_ids=self._pending_prompt, completion=completion, reply=reply))
        self._pending_prompt = None
        return reply

    def record_step(self, action: Action, result: StepResult | None = None, *, env_time_s: float = 0.0) -> None:
        """Attach the parsed action and the environment's answer to the latest turn (optional;
        fills `Trajectory.turns`)."""
        if not self._turns:
            raise RuntimeError("record_step() needs a completion first")
        turn = self._turns[-1]
        turn.action = action
        turn.env_time_s = env_time_s
        if result is not None:
            turn.reward = float(result.reward)
            turn.observation = result.observation

    def add_observation(self, messages: Sequence[Message]) -> np.ndarray:
        """Append the templated tokens of new messages (tool results, user turns) and the
        generation prompt, mask 0. Returns the ids to feed the model next."""
        if not self._turns or self._pending_prompt is not None:
            raise RuntimeError("add_observation() follows a completion; call add_completion() first")
        new = list(messages)
        full = self._render([*self._messages, *new], add_generation_prompt=True)
        if full.startswith(self._text):
            suffix = full[len(self._text) :]
            ids = self._encode(suffix)
        else:
            suffix, ids = self._divergent_suffix(full, new)
        self._append(ids, 0)
        self._text += suffix
        self._messages.extend(new)
        self._pending_prompt = ids
        return ids

    def _divergent_suffix(self, full: str, new: Sequence[Message]) -> tuple[str, np.ndarray]:
        at = len(os.path.commonprefix((full, self._text)))
        self._divergences.append(
            {
                "turn": len(self._turns),
                "at_char": at,
                "template": full[max(0, at - 40) : at + 40],
                "stream": self._text[max(0, at - 40) : at + 40],
                "rule": "kept_generated_stream",
            }
        )
        last = self._turns[-1].completion
        last_id = int(last.token_ids[-1]) if last is not None and last.num_tokens else None
        ended = last_id is not None and (last_id in tuple(self.tokenizer.eos_token_ids) or last_id in self.stop_ids)
        try:
            # Cut after the same-numbered end-of-turn token (agentax.text's rule).
            ids = render_continuation(
                self.tokenizer,
                self._messages,
                new,
                tools=self.tools,
                assistant_ended=ended,
                **self.template_kwargs,
            )
        except ValueError as e:
            raise ValueError(
                f"this chat template cannot be continued token-exactly ({e}); use a template that "
                "ends every turn with an end-of-turn token from tokenizer.eos_token_ids"
            ) from e
        ids = np.asarray(ids, dtype=np.int32)
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False), ids

    def build(
        self,
        reward: float,
        status: TrajectoryStatus,
        *,
        task_id: str | None = None,
        sample_index: int = 0,
        group_id: str = "",
        timings: Mapping[str, float] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> Trajectory:
        """The finished `Trajectory`: arrays of length T, loss mask 1 exactly on generated ids;
        `info["messages"]` holds the conversation (`Message`s, assistant turns verbatim).

        May be called at any point (an episode that failed early builds what it has; before
        `start` the stream is empty)."""
        out_info = dict(info or {})
        # The conversation as the model saw it, with roles (transcripts show it; the
        # messages already exist, so keeping them costs nothing).
        out_info["messages"] = tuple(self._messages)
        out_info["template_divergences"] = len(self._divergences)
        if self._divergences:
            out_info["template_divergence"] = self.divergences
        turns = tuple(
            Turn(
                prompt_ids=t.prompt_ids,
                completion=t.completion,
                action=t.action if t.action is not None else Action(text=t.reply),
                reward=t.reward,
                observation=t.observation,
                env_time_s=t.env_time_s,
            )
            for t in self._turns
        )
        def cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
            # An episode that failed before its first prompt has an empty stream (T = 0).
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

        return Trajectory(
            task_id=self.task_id if task_id is None else task_id,
            token_ids=cat(self._ids, np.int32),
            loss_mask=cat(self._mask, np.int8),
            logprobs=cat(self._logprobs, np.float32),
            versions=cat(self._versions, np.int32),
            reward=float(reward),
            status=TrajectoryStatus(status),
            turns=turns,
            sample_index=sample_index,
            group_id=group_id,
            timings=dict(timings or {}),
            info=out_info,
        )
