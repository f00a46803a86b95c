"""`Session`: one agent's conversation with the endpoint, recorded token-exactly.

A session is one episode of one agent (its own API key or base-URL path). It keeps the engine
sequence between calls and a `TrajectoryBuilder` per *segment*:

* **Continuation rule.** A request continues the current segment when its tools are the same
  and its messages start with exactly the previous request's messages followed by the
  assistant message this endpoint returned (choice 0: same content, same tool calls), and add
  at least one message after it. Only the templated tokens of the added messages are
  prefilled (`Engine.generate(..., sequence_id=...)`); the generated ids, behaviour logprobs
  and policy versions come from the engine and are never re-tokenized.
* **Anything else is a history rewrite** (dropped or edited messages, changed tools, a
  different choice picked after n > 1, a retried prompt): the segment is closed, the engine
  sequence released, and a new segment starts from a fresh render. The trajectory records
  the break (`info["segment_breaks"]`, earlier segments under `info["earlier_segments"]`).

The trajectory of the session is its *last* segment: a token stream in which every token the
model generated was generated in exactly that context. Earlier segments are kept whole in
`info` (token ids, loss mask, logprobs, versions), never dropped silently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import numpy as np

from agentax.agents import TrajectoryBuilder
from agentax.engine import EngineClosed, PromptTooLong
from agentax.records import (
    Action,
    Completion,
    FinishReason,
    Message,
    SamplingParams,
    ToolCall,
    ToolCallError,
    Trajectory,
    TrajectoryStatus,
)
from agentax.serve._deltas import ContentDeltas, delivered_content
from agentax.serve._protocol import APIError, ChatRequest, Choice, check_response_format
from agentax.serve._scoring import can_score, top_logprobs
from agentax.text import parse_tool_calls
from agentax.trace import get_tracer, names

__all__ = ["Session", "SessionLimits"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionLimits:
    """Budgets of a training session (the collector's limits); None = no limit."""

    max_turns: int | None = None
    """Model calls (choice 0) per session."""
    max_tokens: int | None = None
    """Tokens of the current segment's stream (prompt + generated + observations)."""
    model_timeout_s: float | None = None
    """Limit of one engine call."""


def _canonical(m: Message) -> tuple:
    calls = tuple((c.id, c.name, json.dumps(dict(c.arguments), sort_keys=True)) for c in m.tool_calls)
    return (m.role, m.content, calls, m.name if m.role == "tool" else None, m.tool_call_id)


def _finish(reason: FinishReason) -> str:
    if reason in (FinishReason.EOS, FinishReason.STOP):
        return "stop"
    if reason in (FinishReason.LENGTH, FinishReason.SLOT_FULL):
        return "length"
    raise APIError(500, f"the engine ended the completion with {reason.value}", type="server_error")


class Session:
    """One agent's session: serializes its calls, continues its engine sequence, records it.

    Args:
      session_id: the key (API key or path segment) that names the session.
      engine: an `agentax.engine.Engine` (anything with `generate` / `release`).
      tokenizer: the model's tokenizer (its chat template renders requests).
      tool_format: tool-call parser name (`agentax.text.get_tool_parser`).
      template_kwargs: extra chat-template variables.
      sampling: in a training session, the run's sampling (temperature, top-p, top-k, seed and
        max_tokens cap govern; a request's temperature/top_p are recorded, not applied). None
        for a serving session: the request's values apply.
      limits: budgets (training sessions).
      context_hint: what a `context_length_exceeded` error tells the caller to raise (the knob
        that sets the engine's slot length where this session is served).
    """

    def __init__(self, session_id: str, engine: Any, tokenizer: Any, *, tool_format: str = "hermes",
                 template_kwargs: Mapping[str, Any] | None = None,
                 sampling: SamplingParams | None = None, limits: SessionLimits = SessionLimits(),
                 default_max_tokens: int = 256,
                 context_hint: str = "raise EngineConfig.max_seq_len",
                 role: str | None = None) -> None:
        self.id = session_id
        self.role = role
        self.context_hint = context_hint
        self.engine, self.tokenizer = engine, tokenizer
        self.tool_format = tool_format
        self.template_kwargs = dict(template_kwargs or {})
        self.sampling, self.limits = sampling, limits
        self.default_max_tokens = default_max_tokens
        self.lock = asyncio.Lock()
        self.closed = False
        self._stopping = asyncio.Event()  # the server is stopping: no new turn starts
        self.truncated: str | None = None
        """Why the session's budget ran out (then further calls get a 400)."""
        self.prompt_too_long: str | None = None
        """Why the episode's first prompt got no reply (it does not fit the budget or a slot)."""
        self.timed_out = False
        """A model call ran past `limits.model_timeout_s`."""
        self.reward: float | None = None
        """A reward POSTed to the session's reward route."""
        self.final_answer = ""
        """Content of the latest reply that made no tool call."""
        self.rejected: str | None = None
        """The error code when the latest reply failed its request's tool_choice /
        response_format (the call got a 400); None once a reply passes."""
        self.last_used = time.monotonic()
        self._builder: TrajectoryBuilder | None = None
        self._expected: list[tuple] | None = None
        self._tools_key = ""
        self._sequence_id: int | None = None
        self._earlier: list[dict[str, Any]] = []
        self._calls = 0
        # A training session is opened inside its episode's span: its model calls are traced
        # on that episode's track, as the collector's own, so `agentax doctor` counts them as
        # the episode's model time (the HTTP handler that runs them is another task).
        # A role's session (several agents in one episode): its own track under the
        # episode's, `episode/<group>/<sample>/<role>`, as the collector's roles.
        track = get_tracer().current_track()
        self._trace_track = track if isinstance(track, str) and track.startswith(
            names.EPISODE_TRACK_PREFIX) else None
        if self._trace_track is not None and role is not None:
            self._trace_track = f"{self._trace_track}/{role}"
        self._counts = {"calls": 0, "segment_breaks": 0, "parse_errors": 0, "sampling_overridden": 0}

    # ------------------------------------------------------------------ requests

    async def complete(self, req: ChatRequest, *, on_delta: Callable[[str], None] | None = None
                       ) -> tuple[list[Choice], int]:
        """Runs one chat-completions request; returns (choices, prompt tokens).

        Args:
          req: the validated request.
          on_delta: a streamed request's sink of choice 0's content, called with each piece
            as soon as it is final (see `agentax.serve._deltas`). The returned choice 0's
            content then starts with the pieces given; the rest (and any tool calls) is the
            caller's to send. Pieces flow only where they cannot be taken back: n == 1,
            no logprobs, a text response_format, tool_choice auto / none, and an engine with
            `stream`; otherwise nothing is given before the end.

        Raises:
          APIError: a budget is spent, the prompt does not fit, or the engine failed.
        """
        async with _Turn(self):
            if self.closed:
                raise APIError(404, f"session {self.id!r} is closed", code="session_closed")
            self.last_used = time.monotonic()
            self.rejected = None
            if self.truncated:
                raise APIError(400, f"this episode's budget is spent ({self.truncated})",
                               code="episode_budget_exhausted")
            lim = self.limits
            if lim.max_turns is not None and self._counts["calls"] >= lim.max_turns:
                self.truncated = f"max_turns={lim.max_turns}"
                raise APIError(400, f"this episode's budget is spent ({self.truncated})",
                               code="episode_budget_exhausted")
            prompt_ids = self._prompt(req)
            builder = self._builder
            assert builder is not None
            if lim.max_tokens is not None and builder.num_tokens >= lim.max_tokens:
                self._over_budget(builder.num_tokens, lim.max_tokens)
            params = self._params(req, builder.num_tokens)
            if req.top_logprobs and not can_score(self.engine):
                raise APIError(400, "top_logprobs > 0 needs an agentax Engine to score the reply "
                               "with (this server's engine cannot)", param="top_logprobs",
                               code="unsupported_parameter")
            context = None
            # the other choices start from the same context, on fresh sequences; top_logprobs
            # scores every choice's tokens after it
            if req.n > 1 or req.top_logprobs:
                context = builder.build(0.0, TrajectoryStatus.OK).token_ids
            deltas = self._deltas(req) if on_delta is not None else None
            try:
                if self._trace_track is None:
                    completions = await self._generate(prompt_ids, params, req.n, context,
                                                       deltas, on_delta)
                else:
                    args: dict[str, Any] = {"prompt_tokens": int(len(prompt_ids))}
                    if self.role is not None:
                        args[names.ARG_ROLE] = self.role
                    with get_tracer().span(names.MODEL_CALL, track=self._trace_track, args=args):
                        completions = await self._generate(prompt_ids, params, req.n, context,
                                                           deltas, on_delta)
            except BaseException:
                self._break_segment()
                raise
            first = completions[0]
            self._sequence_id = first.sequence_id
            self._counts["calls"] += 1
            reply = builder.add_completion(first)
            choices = [self._choice(i, c, req, reply if i == 0 else None)
                       for i, c in enumerate(completions)]
            if deltas is not None and deltas.sent:  # the client holds these pieces already
                choices[0] = dataclasses.replace(
                    choices[0], content=delivered_content(deltas.sent, choices[0].content))
            if req.top_logprobs:
                assert context is not None
                choices = [await self._add_top_logprobs(ch, co, context, params, req.top_logprobs)
                           for ch, co in zip(choices, completions)]
            failed = next(((ch.index, *f) for ch in choices
                           if (f := self._unsatisfied(ch, req)) is not None), None)
            c0 = choices[0]
            builder.record_step(Action(
                text=reply, tool_calls=c0.tool_calls, parse_errors=c0.parse_errors,
                final_answer=None if c0.tool_calls or failed else (c0.content or "")))
            if first.finish_reason == FinishReason.SLOT_FULL:
                self.truncated = "context_full"
            elif lim.max_tokens is not None and builder.num_tokens >= lim.max_tokens:
                self.truncated = f"max_episode_tokens={lim.max_tokens}"
            if failed is not None:
                # The reply stays the segment's last: an episode that ends on it (the agent
                # raises the 400) trains on it. The agent never saw it, so its next call starts
                # a new segment (`_expected` is unset). A reply the budget cut short leaves the
                # episode truncated, as any other.
                index, field, why = failed
                self._expected = None
                self.rejected = f"{field}_not_satisfied"
                raise APIError(400, f"choice {index}: {field} {why} (the endpoint validates the "
                               "reply, it does not constrain decoding; retry the call)",
                               param=field, code=self.rejected)
            if not c0.tool_calls:
                self.final_answer = c0.content or ""
            self._expected = [_canonical(m) for m in req.messages] + [_canonical(Message(
                role="assistant", content=c0.content or "", tool_calls=c0.tool_calls))]
            return choices, int(context.shape[0]) if context is not None else builder.num_tokens - first.num_tokens

    def _over_budget(self, used: int, limit: int) -> NoReturn:
        """No room for a reply, as the collector decides it: a first prompt fails the episode,
        a later one ends it truncated (its earlier turns train). The model is not called."""
        if not self._counts["calls"]:
            self.prompt_too_long = (f"the first prompt is {used} tokens and max_episode_tokens="
                                    f"{limit} leaves no room for a reply")
            raise APIError(400, f"{self.prompt_too_long}: shorten the messages and tools, or raise "
                           "the run's collector.max_episode_tokens", param="messages",
                           code="context_length_exceeded")
        self.truncated = f"max_episode_tokens={limit}"
        raise APIError(400, f"this episode's budget is spent ({self.truncated}): the conversation "
                       f"is {used} tokens", code="episode_budget_exhausted")

    def _prompt(self, req: ChatRequest) -> np.ndarray:
        """Ids to feed: the new messages' suffix on a continuation, else a fresh segment's prompt."""
        tools_key = json.dumps(req.tools, sort_keys=True)
        canon = [_canonical(m) for m in req.messages]
        exp = self._expected
        if (self._builder is not None and exp is not None and tools_key == self._tools_key
                and len(canon) > len(exp) and canon[: len(exp)] == exp):
            return self._builder.add_observation(list(req.messages[len(exp):]))
        if self._builder is not None:
            self._break_segment()
        self._builder = TrajectoryBuilder(self.tokenizer, tools=req.tools,
                                          template_kwargs=self.template_kwargs)
        self._tools_key = tools_key
        return self._builder.start(list(req.messages))

    def _break_segment(self) -> None:
        """Closes the current segment (kept in info) and releases its engine sequence."""
        if self._sequence_id is not None:
            self.engine.release(self._sequence_id)
            self._sequence_id = None
        if self._builder is not None and self._builder.num_tokens:
            t = self._builder.build(0.0, TrajectoryStatus.OK)
            if t.num_generated:
                # A serving session (no episode end) only counts its breaks: kept arrays would
                # grow without bound over a long-lived key.
                if self.sampling is not None:
                    self._earlier.append({"token_ids": t.token_ids, "loss_mask": t.loss_mask,
                                          "logprobs": t.logprobs, "versions": t.versions})
                self._counts["segment_breaks"] += 1
        self._builder, self._expected = None, None

    def _params(self, req: ChatRequest, used: int) -> SamplingParams:
        run = self.sampling
        if run is None:
            seed = req.seed if req.seed is not None else random.getrandbits(31)
            return SamplingParams(
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                max_tokens=req.max_tokens or self.default_max_tokens,
                stop_strings=req.stop, seed=seed & 0x7FFFFFFF)
        if (req.temperature is not None and req.temperature != run.temperature) or (
                req.top_p is not None and req.top_p != run.top_p):
            self._counts["sampling_overridden"] += 1
        cap = run.max_tokens if req.max_tokens is None else min(req.max_tokens, run.max_tokens)
        if self.limits.max_tokens is not None:
            cap = min(cap, max(self.limits.max_tokens - used, 1))
        return dataclasses.replace(run, max_tokens=cap, stop_strings=req.stop or run.stop_strings)

    def _deltas(self, req: ChatRequest) -> ContentDeltas | None:
        """The streamer of choice 0's content, where pieces can flow before the end."""
        if (req.n != 1 or req.logprobs or req.response_format != "text"
                or req.tool_choice not in ("auto", "none") or not hasattr(self.engine, "stream")):
            return None
        return ContentDeltas(self._decode, req.stop, self.tool_format if req.tools else None)

    async def _stream_first(self, prompt_ids: np.ndarray, params: SamplingParams,
                            deltas: ContentDeltas, on_delta: Callable[[str], None]) -> Completion:
        """Choice 0 through `Engine.stream`: content pieces leave as its tokens arrive."""
        async for item in self.engine.stream(prompt_ids, params, sequence_id=self._sequence_id):
            if isinstance(item, Completion):
                return item
            piece = deltas.feed(item.token_ids)
            if piece:
                on_delta(piece)
        raise RuntimeError("Engine.stream ended without its Completion")

    async def _generate(self, prompt_ids: np.ndarray, params: SamplingParams, n: int,
                        context: np.ndarray | None, deltas: ContentDeltas | None = None,
                        on_delta: Callable[[str], None] | None = None) -> list[Completion]:
        async def one(i: int) -> Completion:
            if i == 0 and deltas is not None and on_delta is not None:
                return await self._stream_first(prompt_ids, params, deltas, on_delta)
            if i == 0:
                return await self.engine.generate(prompt_ids, params, sequence_id=self._sequence_id)
            p = dataclasses.replace(params, seed=(params.seed + 7919 * i) & 0x7FFFFFFF)
            c = await self.engine.generate(context, p)
            self.engine.release(c.sequence_id)
            return c

        gathered = asyncio.gather(*(one(i) for i in range(n)))
        # A stopping run cancels this call: the gather then ends with a CancelledError that no
        # one reads (asyncio logged each as "exception was never retrieved").
        gathered.add_done_callback(_retrieve)
        try:
            outs = await asyncio.wait_for(gathered, self.limits.model_timeout_s)
        except PromptTooLong as e:
            if self.sampling is not None:  # a training episode: as the collector ends it
                if self._counts["calls"]:
                    self.truncated = "context_full"
                else:
                    self.prompt_too_long = str(e)
            # the engine's own advice names its config class; the caller's knob is the hint
            detail = str(e).split("; shorten it or raise")[0]
            raise APIError(400, f"the conversation does not fit the model's context ({detail}): "
                           f"shorten the messages and tools, or {self.context_hint}",
                           param="messages", code="context_length_exceeded") from None
        except TimeoutError:
            self.timed_out = True
            raise APIError(504, "the model call timed out", type="server_error") from None
        except EngineClosed as e:
            raise APIError(503, f"the engine is shut down: {e}", type="server_error") from None
        if self.closed:  # the episode ended while the engine worked: free what it kept
            for c in outs:
                self.engine.release(c.sequence_id)
            raise APIError(404, f"session {self.id!r} was closed", code="session_closed")
        return list(outs)

    async def _add_top_logprobs(self, ch: Choice, c: Completion, context: np.ndarray,
                                params: SamplingParams, k: int) -> Choice:
        top = await asyncio.to_thread(top_logprobs, self.engine, context, c.token_ids,
                                      params.temperature, k)
        assert ch.logprobs is not None
        dec = self.tokenizer.decode
        lp = [(t, v, [(dec([a]), b) for a, b in alts]) for (t, v, _), alts in zip(ch.logprobs, top)]
        return dataclasses.replace(ch, logprobs=lp)

    @staticmethod
    def _unsatisfied(ch: Choice, req: ChatRequest) -> tuple[str, str] | None:
        """(field, why) when a choice does not satisfy the request's tool_choice /
        response_format (validated after decoding, which is not constrained), else None."""
        if req.tool_choice == "required" and not ch.tool_calls:
            return "tool_choice", "'required': the model made no (well-formed) tool call"
        if req.tool_choice == "function":
            names = sorted({t.name for t in ch.tool_calls})
            if names != [req.forced_tool]:
                return ("tool_choice", f"function {req.forced_tool!r}: the model called "
                        f"{names or 'no tool'}")
        if ch.tool_calls:
            return None
        why = check_response_format(ch.content, req.response_format, req.json_schema)
        return None if why is None else ("response_format", f"{req.response_format}: {why}")

    def _choice(self, index: int, c: Completion, req: ChatRequest, reply: str | None) -> Choice:
        text = reply if reply is not None else self._decode(c.token_ids)
        finish = _finish(c.finish_reason)
        for s in req.stop:  # OpenAI leaves the stop sequence out of the content
            at = text.find(s)
            if at >= 0:
                text, finish = text[:at], "stop"
        calls: tuple[ToolCall, ...] = ()
        errors: tuple[ToolCallError, ...] = ()
        content: str | None = text
        if req.tools:
            parsed = parse_tool_calls(text, fmt=self.tool_format)
            if parsed.errors:  # a malformed call stays visible as text; the agent sees it
                errors = parsed.errors
                self._counts["parse_errors"] += len(parsed.errors)
            else:
                found = parsed.tool_calls if req.parallel_tool_calls else parsed.tool_calls[:1]
                calls = tuple(
                    dataclasses.replace(call, id=f"call_{self.id[:8]}_{self._calls + j}")
                    for j, call in enumerate(found))
                self._calls += len(calls)
                if calls:
                    content, finish = parsed.content or None, "tool_calls"
        lp = None
        if req.logprobs:
            lp = [(self.tokenizer.decode([int(t)]), float(v), ()) for t, v in zip(c.token_ids, c.logprobs)]
        return Choice(index=index, content=content, tool_calls=calls, finish_reason=finish,
                      logprobs=lp, completion_tokens=c.num_tokens, parse_errors=errors)

    def _decode(self, ids: np.ndarray) -> str:
        """Reply text as `TrajectoryBuilder.add_completion` decodes it (a final eos dropped)."""
        ids = [int(i) for i in ids]
        if ids and ids[-1] in tuple(self.tokenizer.eos_token_ids):
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    async def _take_turn(self) -> None:
        """Takes the session's lock (its calls run one at a time). Raises a 503 instead when
        the server is stopping, also for a call that was waiting behind another one."""
        if self._stopping.is_set():
            raise _shutting_down()
        if not self.lock.locked():  # the common case: no call ahead of this one
            await self.lock.acquire()
            return
        acquire = asyncio.ensure_future(self.lock.acquire())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait((acquire, stopping), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while waiting: no turn is taken
            stopping.cancel()
            self._drop_turn(acquire)
            raise
        stopping.cancel()
        if not self._stopping.is_set():
            return  # the lock is this call's
        self._drop_turn(acquire)  # even one taken just as the server began stopping
        raise _shutting_down()

    def _drop_turn(self, acquire: asyncio.Future) -> None:
        """Withdraws a pending `lock.acquire()`; gives the lock back if it got it anyway."""

        def give_back(f: asyncio.Future) -> None:
            if not f.cancelled() and f.exception() is None:
                self.lock.release()

        acquire.cancel()  # a no-op once it is done
        acquire.add_done_callback(give_back)

    # ------------------------------------------------------------------ the end

    def shut_down(self) -> None:
        """The server is stopping: calls waiting for this session's turn, and any later one,
        get a 503 `server_shutting_down`; a call already running goes on."""
        self._stopping.set()

    def close(self) -> None:
        """Ends the session: releases its engine sequence; later calls get a 404."""
        self.closed = True
        if self._sequence_id is not None:
            self.engine.release(self._sequence_id)
            self._sequence_id = None

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def trajectory(self, reward: float, status: TrajectoryStatus, *, task_id: str = "",
                   info: Mapping[str, Any] | None = None, timings: Mapping[str, float] | None = None
                   ) -> Trajectory:
        """The session as a `Trajectory`: its last segment, earlier segments in `info`."""
        builder = self._builder or TrajectoryBuilder(self.tokenizer)
        out = {**self._counts, "segments": self._counts["segment_breaks"] + (1 if self._builder else 0),
               "final_answer": self.final_answer, **(info or {})}
        # per-episode numbers the run's evaluation averages (parse errors it counts from the
        # turns' actions)
        out["metrics"] = {**dict(out.get("metrics") or {}),
                          "segment_breaks": float(self._counts["segment_breaks"])}
        if self.truncated:
            out["truncated"] = self.truncated
        if self._earlier:
            out["earlier_segments"] = list(self._earlier)
        return builder.build(reward, status, task_id=task_id, timings=timings, info=out)


class _Turn:
    """`async with _Turn(session)`: one call's hold of the session (see `_take_turn`)."""

    __slots__ = ("session",)

    def __init__(self, session: Session) -> None:
        self.session = session

    async def __aenter__(self) -> None:
        await self.session._take_turn()

    async def __aexit__(self, *exc: object) -> None:
        self.session.lock.release()


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down and did not start this call; retry it "
                    "against a server that is up", type="server_error", code="server_shutting_down")


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()
