"""Per-token statistics of the LM head (target log-prob, entropy, argmax hit), chunked.

The loss of a language model needs, per trained position, only a few scalars of the
categorical over the vocabulary; materialising the float32 logits [B, T, V] for them costs
B*T*V*4 bytes (20 GB at 32k positions and V=151,936) in the forward pass and again in the
backward pass. `chunked_token_stats` instead runs the LM head on `chunk` positions at a time,
only over positions with a nonzero loss mask (compacted to the front), under
`jax.checkpoint`, so the largest live buffers are a few [chunk, V] float32 arrays, and
chunks holding no trained position cost nothing. `full_token_stats` is the plain
full-logits computation with the same outputs (the reference).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from agentax.algos._value import gather_logprobs, token_entropy

__all__ = ["chunked_token_stats", "full_token_stats"]

HeadFn = Callable[[jax.Array], jax.Array]  # hidden [..., D] -> logits [..., V]


def _chunk_stats(logits_cv: jax.Array, targets_c: jax.Array, *, entropy: bool,
                 entropy_grad: bool, correct: bool) -> dict[str, jax.Array]:
    """Stats of one chunk of logits [C, V] (float32) at targets [C]."""
    lse_c = jax.nn.logsumexp(logits_cv, axis=-1)
    # A gather (not a one-hot select) keeps no [C, V] mask for the backward pass.
    tgt_c = jnp.take_along_axis(logits_cv, targets_c[..., None], axis=-1)[..., 0]
    out = {"logp": tgt_c - lse_c}
    if entropy:
        lg = logits_cv if entropy_grad else jax.lax.stop_gradient(logits_cv)
        lse = lse_c if entropy_grad else jax.lax.stop_gradient(lse_c)
        p_cv = jnp.exp(lg - lse[..., None])
        # -inf logits (a masked vocabulary) contribute 0, as in token_entropy.
        out["entropy"] = lse - jnp.sum(p_cv * jnp.where(jnp.isfinite(lg), lg, 0.0), axis=-1)
    if correct:
        out["correct"] = jnp.argmax(jax.lax.stop_gradient(logits_cv), axis=-1) == targets_c
    return out


def chunked_token_stats(hidden_nd: jax.Array, targets_n: jax.Array, mask_n: jax.Array,
                        head_fn: HeadFn, *, chunk: int = 1024, entropy: bool = False,
                        entropy_grad: bool = True, correct: bool = False
                        ) -> dict[str, jax.Array]:
    """Target log-probs (and entropy, argmax hit) at masked positions, `chunk` at a time.

    Positions with mask > 0 are moved to the front of their row (stable order), padded to a
    multiple of the chunk, and scanned; a chunk is the same ~chunk / B columns of every row
    (~`chunk` positions in all, so rows sharded over devices stay sharded); each chunk
    computes logits [B, chunk / B, V] = head_fn(hidden), their
    logsumexp and the requested statistics, recomputed in the backward pass
    (`jax.checkpoint`), and skipped (`lax.cond`) when it holds no masked position. Gradients
    reach `hidden_nd` and whatever `head_fn` closes over (the LM-head weights).

    Args:
      hidden_nd: [N, D] or [B, N, D] final hidden states (any float dtype; passed to
        head_fn as is).
      targets_n: [N] or [B, N] int token ids the logits at each position predict.
      mask_n: [N] or [B, N] loss mask; statistics are computed where mask > 0.
      head_fn: hidden [..., D] -> logits [..., V] (cast to float32 here), e.g. the model's
        `logits` with its final softcap.
      chunk: positions per chunk (static); clipped to N.
      entropy: also return the entropy of each position's categorical.
      entropy_grad: whether the entropy carries a gradient (False = a stop-gradient metric
        whose backward costs nothing).
      correct: also return whether argmax(logits) == target.
    Returns:
      {"logp": float32, ["entropy": float32], ["correct": bool]}, each [N] (or [B, N]) and 0
      (False) where mask == 0.
    """
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0, got {chunk}")
    if hidden_nd.ndim == 2:  # one row
        out = chunked_token_stats(hidden_nd[None], targets_n[None], mask_n[None], head_fn,
                                  chunk=chunk, entropy=entropy, entropy_grad=entropy_grad,
                                  correct=correct)
        return {k: v[0] for k, v in out.items()}
    # Rows [B, N, D]: each row's trained positions move to its front, and a chunk takes the
    # same columns of every row, so a batch sharded over rows stays sharded (a flattened
    # [B * N] order would gather every row onto every device).
    b, n, d = hidden_nd.shape
    c = min(max(1, chunk // b), n)  # positions per row in a chunk: ~`chunk` in all
    num_chunks = -(-n // c)
    pad = num_chunks * c - n
    keep_bn = jnp.asarray(mask_n) > 0
    order_bn = jnp.argsort(~keep_bn, axis=1, stable=True)  # trained positions first, in order
    take = lambda x: jnp.take_along_axis(x, order_bn, axis=1)  # noqa: E731
    keep_s = jnp.pad(take(keep_bn), ((0, 0), (0, pad)))
    tgt_s = jnp.pad(take(jnp.asarray(targets_n, jnp.int32)), ((0, 0), (0, pad)))
    # Untrained positions are zeroed so a NaN there cannot reach the head's gradient.
    h_s = jnp.where(keep_bn[..., None], hidden_nd, 0)
    h_s = jnp.pad(jnp.take_along_axis(h_s, order_bn[..., None], axis=1),
                  ((0, 0), (0, pad), (0, 0)))
    flags = dict(entropy=entropy, entropy_grad=entropy_grad, correct=correct)

    def compute(h_bcd, tgt_bc):
        # [B * C, V]: the 2-D gather of the target logit keeps the backward pass to the
        # chunk's own buffers (a [B, C, V] one kept another [C, V] float32 buffer on CPU).
        logits = jnp.asarray(head_fn(h_bcd.reshape(b * c, d)), jnp.float32)
        stats = _chunk_stats(logits, tgt_bc.reshape(b * c), **flags)
        return {k: v.reshape(b, c) for k, v in stats.items()}

    if num_chunks == 1:
        # One chunk holds every position: no sort, no loop, and the full computation's very
        # operations (a small model's run reproduces the full-logits path bit for bit).
        hidden = jnp.where(keep_bn[..., None], hidden_nd, 0)
        stats = full_token_stats(hidden, targets_n, mask_n, head_fn, **flags)
        return {k: jnp.where(keep_bn, v, jnp.zeros((), v.dtype)) for k, v in stats.items()}

    zeros = jax.eval_shape(compute, jax.ShapeDtypeStruct((b, c, d), hidden_nd.dtype),
                           jax.ShapeDtypeStruct((b, c), jnp.int32))

    @jax.checkpoint
    def body(carry, xs):
        h_bcd, tgt_bc, keep_bc = xs
        stats = jax.lax.cond(jnp.any(keep_bc), compute,
                             lambda *_: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                                     zeros),
                             h_bcd, tgt_bc)
        return carry, jax.tree.map(lambda x: jnp.where(keep_bc, x, jnp.zeros((), x.dtype)),
                                   stats)

    chunks = lambda x: jnp.moveaxis(x.reshape(b, num_chunks, c, *x.shape[2:]), 1, 0)  # noqa: E731
    _, stats = jax.lax.scan(body, None, (chunks(h_s), chunks(tgt_s), chunks(keep_s)))
    back = jnp.argsort(order_bn, axis=1)  # where each position went
    return {k: jnp.take_along_axis(jnp.moveaxis(v, 0, 1).reshape(b, -1)[:, :n], back, axis=1)
            for k, v in stats.items()}


def full_token_stats(hidden_nd: jax.Array, targets_n: jax.Array, mask_n: jax.Array,
                     head_fn: HeadFn, *, entropy: bool = False, entropy_grad: bool = True,
                     correct: bool = False) -> dict[str, jax.Array]:
    """`chunked_token_stats` through the full logits [..., V] (the memory-hungry reference).

    Same arguments and keys, any leading shape; values at mask == 0 are computed too.
    """
    del mask_n
    logits = jnp.asarray(head_fn(hidden_nd), jnp.float32)
    out = {"logp": gather_logprobs(logits, targets_n)}
    if entropy:
        out["entropy"] = token_entropy(logits if entropy_grad
                                       else jax.lax.stop_gradient(logits))
    if correct:
        out["correct"] = jnp.argmax(logits, axis=-1) == targets_n
    return out
