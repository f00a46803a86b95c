"""Plain NumPy / Python-loop references for agentax.algos (the tests compare against these)."""

from __future__ import annotations

import math

import numpy as np


def random_mask(rng, b, t, *, empty_rows=1):
    """[B, T] 0/1 mask with prompt-like leading zeros, holes, trailing padding, empty rows."""
    mask = np.zeros((b, t), np.float32)
    for i in range(b):
        start = rng.integers(0, t // 2)
        stop = rng.integers(start + 1, t + 1)
        mask[i, start:stop] = 1.0
        hole = rng.integers(0, t)
        mask[i, hole] = 0.0  # a tool-output gap inside the trained span
    mask[:empty_rows] = 0.0
    return mask


def group_adv(kind, r, valid, eps=1e-6, ddof=1):
    n_groups, g = r.shape
    out = np.zeros((n_groups, g))
    for i in range(n_groups):
        vals = [float(r[i, j]) for j in range(g) if valid[i, j]]
        n = len(vals)
        if n < 2:
            continue
        mean = sum(vals) / n
        for j in range(g):
            if not valid[i, j]:
                continue
            if kind == "grpo":
                std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - ddof))
                out[i, j] = (r[i, j] - mean) / (std + eps)
            elif kind == "dr_grpo":
                out[i, j] = r[i, j] - mean
            elif kind == "rloo":
                out[i, j] = r[i, j] - (sum(vals) - r[i, j]) / (n - 1)
    return out


def place_reward(r_b, mask):
    out = np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        idx = np.nonzero(mask[i])[0]
        if len(idx):
            out[i, idx[-1]] = r_b[i]
    return out


def returns(tok, mask, gamma):
    out = np.zeros(mask.shape)
    for i in range(mask.shape[0]):
        g = 0.0
        for t in reversed(range(mask.shape[1])):
            if mask[i, t]:
                g = tok[i, t] + gamma * g
                out[i, t] = g
    return out


def whiten(x, mask, eps=1e-8):
    vals = x[mask > 0]
    if vals.size == 0:
        return np.zeros_like(x)
    mean, var = vals.mean(), vals.var()
    return np.where(mask > 0, (x - mean) / np.sqrt(var + eps), 0.0)


def gae(rew, val, mask, gamma, lam, boot=None):
    b, t_len = mask.shape
    adv = np.zeros((b, t_len))
    for i in range(b):
        idx = [t for t in range(t_len) if mask[i, t]]
        next_v = 0.0 if boot is None else float(boot[i])
        next_a = 0.0
        for t in reversed(idx):
            delta = rew[i, t] + gamma * next_v - val[i, t]
            next_a = delta + gamma * lam * next_a
            adv[i, t] = next_a
            next_v = val[i, t]
    return adv, np.where(mask > 0, adv + val, 0.0)


def aggregate(loss, mask, mode, norm=None):
    b, t_len = mask.shape
    if mode == "token-mean":
        n = mask.sum()
        return 0.0 if n == 0 else float((loss * mask).sum() / n)
    seqs = []
    for i in range(b):
        n = mask[i].sum()
        if n == 0:
            continue
        s = float((loss[i] * mask[i]).sum())
        if mode == "seq-mean-token-mean":
            seqs.append(s / n)
        elif mode == "seq-mean-token-sum":
            seqs.append(s)
        else:
            seqs.append(s / (t_len if norm is None else norm))
    return float(np.mean(seqs)) if seqs else 0.0


def ppo_token_loss(logp, prox, adv, eps_low, eps_high, dual_c):
    out = np.zeros(logp.shape)
    for idx in np.ndindex(logp.shape):
        ratio = math.exp(logp[idx] - prox[idx])
        a = adv[idx]
        l_ = max(-a * ratio, -a * min(max(ratio, 1 - eps_low), 1 + eps_high))
        if dual_c is not None and a < 0:
            l_ = min(l_, -a * dual_c)
        out[idx] = l_
    return out
