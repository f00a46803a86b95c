"""`top_logprobs`: the top-k alternatives of each generated token, by a scoring pass.

The engine's kernels return the logprob of the sampled token only (`engine._sampling`): the
top-k of every decode step would be another [B, k] output of every prefill and decode kernel,
through the scheduler and `Completion`. Only requests that ask for `top_logprobs > 0` pay for
it here instead: one full-sequence forward pass of the engine's current weights over the
context and the generated tokens (`Transformer.hidden`, then the output projection at the
generated positions only; jitted once per power-of-two bucket of both lengths), `log_softmax(logits / temperature)` at each generated position (temperature 1 for
greedy, as the engine's behaviour logprob), and its top `MAX_TOP_LOGPROBS`.

The sampled token's own `logprob` in a reply stays the engine's exact behaviour logprob; the
alternatives come from this pass (same weights, a different kernel: they agree to float
rounding). In training, a weight update that lands between the call and its scoring pass
scores with the newer weights.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["MAX_TOP_LOGPROBS", "can_score", "top_logprobs"]

MAX_TOP_LOGPROBS = 20
_MIN_BUCKET = 64


def can_score(engine: Any) -> bool:
    """Whether `engine` is an agentax `Engine` whose weights a scoring pass can read."""
    runner = getattr(engine, "_runner", None)
    return runner is not None and hasattr(runner, "model_def") and hasattr(runner, "weights")


def _bucket(n: int, least: int) -> int:
    return max(least, 1 << (n - 1).bit_length())


@functools.partial(jax.jit, static_argnums=(0,))
def _top_k(model_def, weights, ids_bt: jax.Array, rows_r: jax.Array, temperature: jax.Array):
    """Top-k (logprobs, ids) [R, k] of the next token after positions `rows_r` of row 0: the
    hidden states are full length, the [R, V] logits only for the rows asked for."""
    model = model_def.model(weights)  # the engine's weights, layers unstacked if stacked
    hidden = model.hidden(ids_bt)[0, rows_r]  # [R, D]
    logits = model.logits(hidden[None])[0].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits / temperature, axis=-1)
    return jax.lax.top_k(logp, MAX_TOP_LOGPROBS)


def top_logprobs(engine: Any, context: np.ndarray, generated: np.ndarray, temperature: float,
                 k: int) -> list[list[tuple[int, float]]]:
    """Per generated token, its top `k` alternatives as (token id, logprob), best first.

    Args:
      engine: an agentax `Engine` (`can_score(engine)`).
      context: the token ids before the first generated token (the prompt the call extended).
      generated: the generated token ids.
      temperature: the call's sampling temperature (<= 0: greedy, scored at temperature 1).
      k: 1..MAX_TOP_LOGPROBS.
    """
    runner = engine._runner
    ids = np.concatenate([np.asarray(context, np.int32), np.asarray(generated, np.int32)])
    n, start = len(generated), len(context)
    if n == 0:
        return []
    padded = np.zeros((1, _bucket(len(ids), _MIN_BUCKET)), np.int32)
    padded[0, : len(ids)] = ids  # causal: padding after the last token changes nothing
    # logits at position p predict the token at p + 1 (rows past the reply: clipped, dropped)
    rows = np.minimum(np.arange(_bucket(n, 8)) + start - 1, len(ids) - 1).astype(np.int32)
    temp = jnp.float32(temperature if temperature > 0 else 1.0)
    values, indices = _top_k(runner.model_def, runner.weights, jnp.asarray(padded),
                             jnp.asarray(rows), temp)
    values, indices = np.asarray(values[:n, :k]), np.asarray(indices[:n, :k])
    return [[(int(t), float(v)) for t, v in zip(ti, vi)] for ti, vi in zip(indices, values)]
