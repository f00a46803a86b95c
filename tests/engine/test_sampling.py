"""The jitted per-row sampler: greedy, top-k, top-p, temperature, keys and behaviour logprobs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from agentax.engine._sampling import RowSampling, sample_tokens

B = 2048
sample = jax.jit(sample_tokens)


def rows(temperature=1.0, top_k=0, top_p=1.0, seed=0, b=B):
    full = lambda v, dt: jnp.full((b,), v, dt)  # noqa: E731
    return RowSampling(full(temperature, jnp.float32), full(top_k, jnp.int32),
                       full(top_p, jnp.float32), full(seed, jnp.uint32))


LOGITS = jnp.log(jnp.asarray([0.4, 0.3, 0.15, 0.1, 0.05]))
BATCH = jnp.broadcast_to(LOGITS, (B, 5))
POSITIONS = jnp.arange(B)


def freqs(tokens):
    return np.bincount(np.asarray(tokens), minlength=5) / B


def test_temperature_one_samples_the_softmax():
    tokens, logprobs = sample(BATCH, rows(), POSITIONS)
    np.testing.assert_allclose(freqs(tokens), np.exp(LOGITS), atol=0.035)
    np.testing.assert_allclose(logprobs, np.asarray(LOGITS)[np.asarray(tokens)], atol=1e-6)


def test_greedy_is_argmax_with_untempered_logprob():
    tokens, logprobs = sample(BATCH * 3.0, rows(temperature=0.0), POSITIONS)
    assert np.all(np.asarray(tokens) == 0)
    np.testing.assert_allclose(logprobs, jax.nn.log_softmax(LOGITS * 3.0)[0], atol=1e-6)


def test_top_k_and_top_p_truncate_sampling_but_not_the_logprob():
    tokens, logprobs = sample(BATCH, rows(top_k=2), POSITIONS)
    f = freqs(tokens)
    assert f[2:].sum() == 0 and abs(f[0] - 0.4 / 0.7) < 0.04
    # Logprob of the full distribution (before truncation), not of the renormalised top-2.
    np.testing.assert_allclose(logprobs, np.asarray(LOGITS)[np.asarray(tokens)], atol=1e-6)
    # top_p=0.8: the nucleus is {0, 1, 2} (mass before token 3 is 0.85 >= 0.8).
    f = freqs(sample(BATCH, rows(top_p=0.8), POSITIONS)[0])
    assert f[3:].sum() == 0 and f[2] > 0.1
    # top-k first, then top-p over the renormalised top-k: k=3 gives 0.47, 0.35, 0.18.
    f = freqs(sample(BATCH, rows(top_k=3, top_p=0.5), POSITIONS)[0])
    assert f[2:].sum() == 0 and f[1] > 0.3


def test_temperature_sharpens_and_logprob_uses_the_scaled_distribution():
    tokens, logprobs = sample(BATCH, rows(temperature=0.5), POSITIONS)
    want = jax.nn.log_softmax(LOGITS / 0.5)
    np.testing.assert_allclose(freqs(tokens), np.exp(want), atol=0.035)
    np.testing.assert_allclose(logprobs, np.asarray(want)[np.asarray(tokens)], atol=1e-6)


def test_rows_are_independent_and_keyed_by_seed_and_position():
    params = RowSampling(
        jnp.asarray([1.0, 0.0, 0.7, 1.0]), jnp.asarray([0, 0, 3, 0]),
        jnp.asarray([1.0, 1.0, 0.9, 1.0]), jnp.asarray([7, 7, 8, 7], jnp.uint32),
    )
    logits = jax.random.normal(jax.random.key(1), (4, 50))
    pos = jnp.asarray([5, 6, 7, 5])
    tokens, _ = sample(logits.at[3].set(logits[0]), params, pos)
    # Row 3 repeats row 0 (same logits, seed, position): same token.
    assert tokens[3] == tokens[0]
    # A row alone gives the same token as in the batch, whatever its neighbours are.
    for i in range(3):
        one = RowSampling(*(x[i: i + 1] for x in params))
        alone, _ = sample(logits[i: i + 1], one, pos[i: i + 1])
        assert alone[0] == tokens[i]
    # Over many positions, two seeds disagree somewhere.
    a = sample(BATCH, rows(seed=1), POSITIONS)[0]
    b = sample(BATCH, rows(seed=2), POSITIONS)[0]
    assert np.mean(np.asarray(a) != np.asarray(b)) > 0.3


def test_noise_is_uniform_and_uncorrelated_across_seeds_positions_and_tokens():
    """The hash noise as uniforms: flat over 32 bins, and no correlation between neighbouring
    seeds, positions or token indices (the counters that differ least)."""
    from agentax.engine._sampling import _gumbel

    seeds, positions, vocab = 64, 64, 272
    s, p = np.meshgrid(np.arange(seeds), np.arange(positions), indexing="ij")
    g = jax.jit(_gumbel, static_argnums=2)(jnp.asarray(s.ravel(), jnp.uint32),
                                           jnp.asarray(p.ravel()), vocab)
    u = np.exp(-np.exp(-np.asarray(g, np.float64))).reshape(seeds, positions, vocab)
    assert 0.0 < u.min() and u.max() < 1.0
    counts = np.bincount((u.ravel() * 32).astype(int), minlength=32)
    expected = u.size / 32
    assert ((counts - expected) ** 2 / expected).sum() < 70  # chi2, 31 dof: p ~ 1e-4
    for a, b in ((u[1:], u[:-1]), (u[:, 1:], u[:, :-1]), (u[..., 1:], u[..., :-1])):
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01  # sd ~ 0.001
    # Pairs of neighbouring positions fill a 2-D grid evenly (joint, not just marginal).
    joint = np.bincount((u[:, 1:] * 8).astype(int).ravel() * 8
                        + (u[:, :-1] * 8).astype(int).ravel(), minlength=64)
    expected = joint.sum() / 64
    assert ((joint - expected) ** 2 / expected).sum() < 120  # chi2, 63 dof: p ~ 1e-5


def _truncate_reference(x, k, p):
    """The sort-based definition: top-k, then the top-p nucleus of the renormalised top-k
    (a token is kept while the mass strictly above it is < p), ties with the last kept kept."""
    order = np.sort(x)[::-1]
    k = len(x) if k <= 0 else min(k, len(x))
    in_k = x >= order[k - 1]
    probs = np.exp(np.where(in_k, x, -np.inf) - x.max())
    probs /= probs.sum()
    kept = [v for v in np.unique(x[in_k]) if probs[x > v].sum() < p] or [x.max()]
    return np.where(in_k & (x >= min(kept)), x, -np.inf)


def test_truncation_matches_the_sort_based_definition_with_ties_and_extremes():
    from agentax.engine._sampling import _truncate

    rng = np.random.default_rng(0)
    b, v = 64, 40
    x = rng.normal(size=(b, v)).astype(np.float32) * 3
    x[::4] = np.round(x[::4])  # many ties
    x[1::8, :5] = -np.inf  # masked tokens
    x[2] = 1.5  # all equal
    k = rng.integers(0, 12, size=b).astype(np.int32)
    p = rng.choice([0.0, 0.3, 0.6, 0.9, 0.99, 1.0], size=b).astype(np.float32)
    got = np.asarray(jax.jit(_truncate)(jnp.asarray(x), jnp.asarray(k), jnp.asarray(p)))
    for i in range(b):
        np.testing.assert_array_equal(got[i], _truncate_reference(x[i], k[i], p[i]), f"row {i}")
