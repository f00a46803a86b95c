"""`SFTTrainer`: masked next-token cross-entropy on chat data (multi-turn assistant masks).

Examples are (token_ids, loss_mask) pairs, or any object with `token_ids` and
`assistant_mask` (agentax.text's `RenderedConversation`), or `Trajectory`s. The loss is the
mean negative log-likelihood over masked tokens of the whole batch (micro-batches accumulate
exactly). `step` does not wait for the device: it returns `SFTMetrics` holding device scalars,
fetched only when you read them, so a loop of steps runs back to back.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh

from agentax.models import Transformer
from agentax.train._base import TrainerBase
from agentax.train._batch import HostSequence, _first_fit_decreasing, seq_bucket
from agentax.train._config import TrainerConfig
from agentax.train._distributed import local_share, to_host
from agentax.train._sharding import DEFAULT_PARTITION_RULES
from agentax.train._step import NonFiniteUpdateError

__all__ = ["SFTTrainer", "SFTMetrics", "sft_examples"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTMetrics:
    """Result of one SFT step. Array fields are device scalars; `to_dict()` fetches them."""

    step: int
    """Optimizer updates applied before this step."""
    loss: Any
    """Mean NLL over the batch's masked tokens (device scalar)."""
    accuracy: Any
    """Fraction of masked tokens whose argmax equals the target (device scalar)."""
    grad_norm: Any
    applied: Any
    """Device bool: False when the update was skipped (non-finite loss/grads)."""
    num_tokens: int
    num_positions: int
    num_micro_batches: int
    truncated_sequences: int = 0

    def to_dict(self) -> dict[str, float]:
        loss, acc, gn, ok = to_host((self.loss, self.accuracy, self.grad_norm, self.applied))
        return {"step": self.step, "loss": float(loss), "accuracy": float(acc),
                "grad_norm": float(gn), "skipped": not bool(ok), "num_tokens": self.num_tokens,
                "num_positions": self.num_positions}


def _as_sequence(ex) -> HostSequence:
    if isinstance(ex, tuple) and len(ex) == 2:
        ids, mask = ex
    elif hasattr(ex, "assistant_mask"):
        ids, mask = ex.token_ids, ex.assistant_mask
    elif hasattr(ex, "loss_mask") and hasattr(ex, "token_ids"):
        ids, mask = ex.token_ids, ex.loss_mask
    else:
        raise TypeError(f"an SFT example must be (token_ids, loss_mask), a RenderedConversation "
                        f"or a Trajectory; got {type(ex).__name__}")
    ids = np.asarray(ids, np.int32)
    mask = np.asarray(mask, np.float32)
    if ids.ndim != 1 or ids.shape != mask.shape:
        raise ValueError(f"SFT example token_ids {ids.shape} and loss_mask {mask.shape} must be "
                         "1-D and of equal length")
    return HostSequence(token_ids=ids, loss_mask=mask)


def sft_examples(tokenizer, conversations: Iterable[Sequence[Any]], *, tools=None):
    """Renders chat conversations into SFT examples with agentax.text.render_conversation.

    Args:
      tokenizer: an agentax.text tokenizer (e.g. ByteTokenizer()).
      conversations: each a list of messages (dicts or `Message`s).
      tools: OpenAI tool dicts listed in the system prompt.
    Returns:
      list of `RenderedConversation` (token_ids + assistant_mask), accepted by `step`.
    """
    try:
        from agentax.text import render_conversation
    except ImportError as e:  # the text team's function; say what is missing
        raise ImportError("sft_examples needs agentax.text.render_conversation; pass "
                          "(token_ids, loss_mask) pairs to SFTTrainer.step instead") from e
    return [render_conversation(tokenizer, list(c), tools=tools) for c in conversations]


class SFTTrainer(TrainerBase):
    """Supervised fine-tuning with the same optimizer, buckets, LoRA, mesh and checkpoints."""

    _kind = "sft"

    def __init__(self, model: Transformer, config: TrainerConfig | None = None, *,
                 mesh: Mesh | None = None, partition_rules=DEFAULT_PARTITION_RULES):
        super().__init__(model, config or TrainerConfig(), mesh=mesh,
                         partition_rules=partition_rules)
        self._pending: list = []  # device skip flags of steps not yet synced

    def step(self, examples: Sequence[Any]) -> SFTMetrics:
        """One optimizer update on `examples` (see module docstring for accepted forms).

        With several processes (`jax.distributed`), every process passes its own share of the
        batch (`take` gives it); the trainer gathers them, in process order, and takes one
        global step on all devices.

        Raises:
          ValueError: no examples, or no example has a masked token after the first.
        """
        self._check_live("SFTTrainer.step")
        examples = self._gather(examples)
        if not examples:
            raise ValueError("SFTTrainer.step got no examples")
        seqs, truncated = [], 0
        for ex in examples:
            s = _as_sequence(ex)
            # A rendered chat's untrained tail is the template's closing newline: kept (dropping
            # it would only reshuffle packing, and with it the demo's tuned warm start).
            (ids, mask), cut = self._cut(s.token_ids, s.loss_mask)
            truncated += cut
            seqs.append(HostSequence(token_ids=ids, loss_mask=mask))
        mbs = self._micro_batches(seqs, with_rl=False)
        counts = self._counts(mbs)
        if counts["tokens"] == 0:
            raise ValueError("no SFT example has a trained token (loss_mask is 0 everywhere "
                             "after the first token); check the assistant masks")
        self.data_position += len(examples)
        dev_counts = self._put_counts(counts)
        batches = [self._put(mb.batch) for mb in mbs]
        metrics, stats = self._run_update(batches, dev_counts, None)
        step = self.step_count
        # Counted without a host sync; `sync_counters` later removes skipped updates.
        self.step_count += 1
        self._pending.append(stats["applied"])
        correct = sum(m["correct"] for m in metrics)
        return SFTMetrics(step=step, loss=stats["loss"], accuracy=correct / counts["tokens"],
                          grad_norm=stats["grad_norm"], applied=stats["applied"],
                          num_tokens=int(counts["tokens"]),
                          num_positions=int(sum(mb.batch.input_ids.size for mb in mbs)),
                          num_micro_batches=len(mbs), truncated_sequences=truncated)

    def take(self, examples: Sequence[Any], *, batch_size: int = 0,
             batch_tokens: int = 0) -> list:
        """The next step's examples, from `data_position` on (cycling through `examples`).

        Args:
          examples: the whole dataset, in order.
          batch_size: that many examples (when batch_tokens is 0).
          batch_tokens: instead, as many examples as pack into `batch_tokens // row` rows of
            `row` positions (pack_length, bucketed as `step` buckets rows), first-fit
            decreasing as `step` packs them: every step then has the same shape and little
            padding. Needs `pack=True`. An example longer than a row still goes, alone.
        Returns:
          the step's examples; with several processes, this process's contiguous share of
          them (every process picks the same ones; `step` gathers the shares back).
        """
        return local_share(self._take(examples, batch_size, batch_tokens))

    def _take(self, examples: Sequence[Any], batch_size: int, batch_tokens: int) -> list:
        n = len(examples)
        if not n:
            raise ValueError("SFTTrainer.take got no examples")
        start = self.data_position % n
        if not batch_tokens:
            if batch_size < 1:
                raise ValueError(f"batch_size must be >= 1, got {batch_size}")
            return [examples[(start + j) % n] for j in range(batch_size)]
        c = self.config
        if not c.pack:
            raise ValueError("batch_tokens packs examples into rows: set pack=True in the "
                             "TrainerConfig (or use batch_size)")
        # The row length `step` packs into (build_micro_batches' bucket of pack_length).
        row = seq_bucket(c.pack_length, min_len=c.min_seq_bucket, max_len=c.max_seq_len,
                         multiple=c.seq_bucket_multiple)
        rows = batch_tokens // row
        if rows < 1:
            raise ValueError(f"batch_tokens={batch_tokens} is less than one row of {row} "
                             "positions; raise it or lower pack_length")
        lengths: list[int] = []
        total = 0
        # Positions bound the count from above; first-fit decreasing then decides.
        while len(lengths) < n:
            ex = _as_sequence(examples[(start + len(lengths)) % n])
            k = min(ex.token_ids.shape[0], c.max_seq_len + 1) - 1
            if lengths and total + k > rows * row:
                break
            lengths.append(k)
            total += k
        while len(lengths) > 1 and len(_first_fit_decreasing(lengths, row)) > rows:
            lengths.pop()
        return [examples[(start + j) % n] for j in range(len(lengths))]

    def sync_counters(self) -> None:
        """Fetches the skip flags of past steps and corrects step_count / num_skipped_steps."""
        if self._pending:
            flags = to_host(self._pending)
            skipped = sum(not bool(f) for f in flags)
            self.step_count -= skipped
            self.num_skipped_steps += skipped
            self._pending.clear()
            if skipped and self.config.on_nonfinite == "stop":
                raise NonFiniteUpdateError(
                    f"{skipped} SFT step(s) had a NaN/inf loss, gradient or update and were not "
                    "applied. Lower sft.learning_rate or check the data, or set "
                    "trainer.on_nonfinite=skip to skip such steps")

    def fit(self, examples: Sequence[Any], *, num_steps: int, batch_size: int = 0,
            batch_tokens: int = 0, log_every: int = 0, log=print) -> list[dict[str, float]]:
        """Runs `num_steps` steps over `examples` in order (cycling), from `data_position`.

        Each step takes `batch_size` examples, or with `batch_tokens` as many as pack into
        that many positions (see `take`). Resuming from a checkpoint continues with the same
        examples. Returns the metrics of every `log_every`-th step (fetched then; 0 = only the
        last step).
        """
        if not examples:
            raise ValueError("SFTTrainer.fit got no examples")
        history = []
        last = None
        t0 = time.perf_counter()
        for i in range(num_steps):
            last = self.step(self.take(examples, batch_size=batch_size,
                                       batch_tokens=batch_tokens))
            if log_every and (i + 1) % log_every == 0:
                d = last.to_dict() | {"elapsed_s": time.perf_counter() - t0}
                history.append(d)
                if log is not None:
                    log(f"sft step {d['step'] + 1}: loss {d['loss']:.4f} "
                        f"acc {d['accuracy']:.3f} ({d['elapsed_s']:.1f}s)")
        if last is not None and not log_every:
            history.append(last.to_dict() | {"elapsed_s": time.perf_counter() - t0})
        self.sync_counters()
        return history

    def _checkpoint_meta(self) -> dict:
        self.sync_counters()
        return super()._checkpoint_meta()
