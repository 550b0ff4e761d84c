"""Plain loop references for the advantage estimators and policy losses, written from the papers' formulas.

Every function takes torch tensors, works on Python floats (double precision) with explicit loops over samples,
groups and positions, and returns float64 tensors. They are slow on purpose: they are what the vectorized library
code is checked against (tests) and timed against (benchmarks/bench_core_algos.py).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import torch


def _rows(x: torch.Tensor) -> list[list[float]]:
    return x.detach().double().tolist()


def _out(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def groups_of(index) -> dict:
    """group id → list of sample positions, in order of first appearance."""
    groups = defaultdict(list)
    for i, uid in enumerate(list(index)):
        groups[uid.item() if isinstance(uid, torch.Tensor) else uid].append(i)
    return groups


def whiten(rows: list[list[float]], mask: list[list[float]]) -> list[list[float]]:
    """(x − mean) / sqrt(var + 1e-8) over the masked entries, unbiased var, applied to every entry."""
    selected = [x for row, m_row in zip(rows, mask) for x, m in zip(row, m_row) if m]
    mean = math.fsum(selected) / len(selected)
    var = math.fsum((x - mean) ** 2 for x in selected) / (len(selected) - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in rows]


def scores_of(rewards: torch.Tensor) -> list[float]:
    return [math.fsum(row) for row in _rows(rewards)]


def broadcast(per_sample: list[float], mask: torch.Tensor) -> torch.Tensor:
    return _out([[a * m for m in m_row] for a, m_row in zip(per_sample, _rows(mask))])


# ----------------------------------------------------------------------------------------------- estimators
def gae(rewards, values, mask, gamma, lam):
    adv_rows, ret_rows = [], []
    for r_row, v_row, m_row in zip(_rows(rewards), _rows(values), _rows(mask)):
        adv = [0.0] * len(r_row)
        next_value, last = 0.0, 0.0
        for t in reversed(range(len(r_row))):
            if m_row[t]:
                delta = r_row[t] + gamma * next_value - v_row[t]
                last = delta + gamma * lam * last
                next_value = v_row[t]
            adv[t] = last
        adv_rows.append(adv)
        ret_rows.append([a + v for a, v in zip(adv, v_row)])
    return _out(whiten(adv_rows, _rows(mask))), _out(ret_rows)


def reinforce_plus_plus(rewards, mask, gamma):
    ret_rows = []
    for r_row, m_row in zip(_rows(rewards), _rows(mask)):
        # Masked (padding, tool-output) tokens: return 0; the running return passes them by unchanged.
        ret, running = [0.0] * len(r_row), 0.0
        for t in reversed(range(len(r_row))):
            if m_row[t]:
                running = r_row[t] + gamma * running
                ret[t] = running
        ret_rows.append(ret)
    mask_rows = _rows(mask)
    adv = [[a * m for a, m in zip(row, m_row)] for row, m_row in zip(whiten(ret_rows, mask_rows), mask_rows)]
    return _out(adv), _out(ret_rows)


def return_to_go(r_row: list[float], m_row: list[float]) -> list[float]:
    """G_t = Σ_{k≥t} r_k·m_k."""
    out, running = [0.0] * len(r_row), 0.0
    for t in reversed(range(len(r_row))):
        running += r_row[t] * m_row[t]
        out[t] = running
    return out


def remax(rewards, baselines, mask):
    ret_rows, adv_rows = [], []
    for r_row, b, m_row in zip(_rows(rewards), baselines.double().tolist(), _rows(mask)):
        ret = return_to_go(r_row, m_row)
        ret_rows.append(ret)
        adv_rows.append([g - b * m for g, m in zip(ret, m_row)])
    return _out(adv_rows), _out(ret_rows)


def grpo(rewards, mask, index, epsilon=1e-6, norm=True):
    scores = scores_of(rewards)
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        values = [scores[i] for i in members]
        mean, std = (0.0, 1.0) if len(values) == 1 else (statistics.fmean(values), statistics.stdev(values))
        for i in members:
            adv[i] = (scores[i] - mean) / (std + epsilon) if norm else scores[i] - mean
    return broadcast(adv, mask)


def gdpo(components, weights, mask, index, epsilon=1e-6, norm=True):
    """``components``: one list of per-sample rewards per key. GRPO per component, weighted sum, then whiten."""
    total = [0.0] * len(components[0])
    for values, w in zip(components, weights):
        for members in groups_of(index).values():
            group = [values[i] for i in members]
            mean, std = (0.0, 1.0) if len(group) == 1 else (statistics.fmean(group), statistics.stdev(group))
            for i in members:
                total[i] += w * ((values[i] - mean) / (std + epsilon) if norm else values[i] - mean)
    mask_rows = _rows(mask)
    tiled = [[a * m for m in m_row] for a, m_row in zip(total, mask_rows)]
    return _out([[a * m for a, m in zip(row, m_row)] for row, m_row in zip(whiten(tiled, mask_rows), mask_rows)])


def grpo_passk(rewards, mask, index, epsilon=1e-6, norm=True):
    scores = scores_of(rewards)
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        if len(members) < 2:
            raise ValueError("pass@k needs 2 samples per group")
        values = [scores[i] for i in members]
        best = members[values.index(max(values))]
        ordered = sorted(values, reverse=True)
        gap = ordered[0] - ordered[1]
        adv[best] = gap / (statistics.stdev(values) + epsilon) if norm else gap
    return broadcast(adv, mask)


def reinforce_plus_plus_baseline(rewards, mask, index):
    scores = scores_of(rewards)
    centered = [0.0] * len(scores)
    for members in groups_of(index).values():
        mean = 0.0 if len(members) == 1 else statistics.fmean(scores[i] for i in members)
        for i in members:
            centered[i] = scores[i] - mean
    mask_rows = _rows(mask)
    tiled = [[c * m for m in m_row] for c, m_row in zip(centered, mask_rows)]
    return _out([[a * m for a, m in zip(row, m_row)] for row, m_row in zip(whiten(tiled, mask_rows), mask_rows)])


def rloo(rewards, mask, index, singleton_keeps_score=True):
    scores = scores_of(rewards)
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            if others:
                adv[i] = scores[i] - statistics.fmean(others)
            else:
                adv[i] = scores[i] if singleton_keeps_score else 0.0
    return broadcast(adv, mask)


def opo(rewards, mask, index):
    scores = scores_of(rewards)
    lengths = [sum(row) for row in _rows(mask)]
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        total = math.fsum(lengths[i] for i in members)
        baseline = 0.0
        if len(members) > 1 and total > 0:
            baseline = math.fsum(lengths[i] * scores[i] for i in members) / total
        for i in members:
            adv[i] = scores[i] - baseline
    return broadcast(adv, mask)


def gpg(rewards, mask, index, f_norm=1.0):
    scores = scores_of(rewards)
    alpha = len(scores) / max(sum(1 for s in scores if s != 0), 1)
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        mean = 0.0 if len(members) == 1 else statistics.fmean(scores[i] for i in members)
        for i in members:
            adv[i] = alpha * (scores[i] - mean) / f_norm
    return broadcast(adv, mask)


def optimal_token_baseline(rewards, mask, index, old_log_probs, sum_pi_squared, is_weights=None, zero_tail=False,
                           epsilon=1e-8, multi_turn=False):  # fmt: skip
    """Per group and position t (absolute, or the t-th generated token when ``multi_turn``):
    B_t = Σ G_t W_t / (Σ W_t + ε) over the group's trajectories that have that position."""
    r_rows, m_rows = _rows(rewards), _rows(mask)
    p_rows, s_rows = _rows(old_log_probs), _rows(sum_pi_squared)
    w_rows = _rows(is_weights) if is_weights is not None else [[1.0] * len(r) for r in r_rows]
    n, width = len(r_rows), len(r_rows[0])
    returns, cum_w = [], []
    for i in range(n):
        g = return_to_go(r_rows[i], m_rows[i])
        acc, w = 0.0, []
        for t in range(width):
            acc += (1 - 2 * math.exp(p_rows[i][t]) + s_rows[i][t]) * w_rows[i][t] ** 2 * m_rows[i][t]
            w.append(acc)
        returns.append(g)
        cum_w.append(w)
    # Positions each trajectory takes part in: all columns with mask 1, indexed absolutely or by generated count.
    slots = []
    for i in range(n):
        valid_cols = [t for t in range(width) if m_rows[i][t]]
        slots.append({(k if multi_turn else t): t for k, t in enumerate(valid_cols)})
    adv = [[0.0] * width for _ in range(n)]
    for members in groups_of(index).values():
        if multi_turn:
            members = [i for i in members if slots[i]]
        lengths = {i: len(slots[i]) for i in members}
        tail_owner, tail_start = None, None
        if zero_tail and len(members) > 1:
            ordered = sorted(lengths.values())
            if ordered[-1] > ordered[-2]:
                tail_owner = max(members, key=lambda i: lengths[i])
                tail_start = ordered[-2]
        # Per position: Σ G·W and Σ W over the group's trajectories that have that position.
        num, den = defaultdict(float), defaultdict(float)
        for j in members:
            for key, t in slots[j].items():
                num[key] += returns[j][t] * cum_w[j][t]
                den[key] += cum_w[j][t]
        for i in members:
            for key, t in slots[i].items():
                baseline = 0.0 if len(members) == 1 else num[key] / (den[key] + epsilon)
                if i == tail_owner and key >= tail_start:
                    baseline = 0.0
                adv[i][t] = returns[i][t] - baseline
    return _out(adv), _out(returns)


# ----------------------------------------------------------------------------------------------- aggregation
def agg(loss, mask, mode, dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None):
    l_rows, m_rows = _rows(loss), _rows(mask)
    total = math.fsum(x * m for row, m_row in zip(l_rows, m_rows) for x, m in zip(row, m_row) if m)
    scale = loss_scale_factor if loss_scale_factor is not None else len(m_rows[0])
    if mode == "token-mean":
        n = batch_num_tokens if batch_num_tokens is not None else sum(sum(r) for r in m_rows)
        return total / n * dp_size if n else 0.0
    if mode == "token-sum":
        return total * dp_size
    if mode == "seq-mean-token-sum-norm-legacy":
        return total * dp_size / scale
    per_seq = []
    for row, m_row in zip(l_rows, m_rows):
        count = sum(m_row)
        if count == 0:
            continue
        s = math.fsum(x * m for x, m in zip(row, m_row) if m)
        per_seq.append(s / count if mode == "seq-mean-token-mean" else s)
    s_count = global_batch_size if global_batch_size is not None else len(per_seq)
    loss_value = math.fsum(per_seq) / s_count * dp_size if s_count else 0.0
    if mode == "seq-mean-token-sum-norm":
        loss_value /= scale
    return loss_value


# ----------------------------------------------------------------------------------------------- policy losses
def _token_losses(fn, old, new, adv, mask, weights=None):
    w_rows = _rows(weights) if weights is not None else None
    out = []
    for i, (o_row, n_row, a_row, m_row) in enumerate(zip(_rows(old), _rows(new), _rows(adv), _rows(mask))):
        row = []
        for t, (o, n, a, m) in enumerate(zip(o_row, n_row, a_row, m_row)):
            value = fn(o, n, a) if m else 0.0
            row.append(value * (w_rows[i][t] if w_rows else 1.0))
        out.append(row)
    return _out(out)


def _ratio(o, n):
    return math.exp(max(-20.0, min(20.0, n - o)))


def vanilla(old, new, adv, mask, mode="token-mean", clip_low=0.2, clip_high=0.2, clip_c=3.0, weights=None, **agg_kw):
    def token(o, n, a):
        r = _ratio(o, n)
        loss = max(-a * r, -a * min(max(r, 1 - clip_low), 1 + clip_high))
        return min(loss, -a * clip_c) if a < 0 else loss

    return agg(_token_losses(token, old, new, adv, mask, weights), mask, mode, **agg_kw)


def gspo(old, new, adv, mask, clip_low=0.2, clip_high=0.2, **agg_kw):
    o_rows, n_rows, m_rows = _rows(old), _rows(new), _rows(mask)
    seq_ratio = []
    for o_row, n_row, m_row in zip(o_rows, n_rows, m_rows):
        count = max(sum(m_row), 1)
        mean_log = math.fsum((n - o) * m for o, n, m in zip(o_row, n_row, m_row)) / count
        seq_ratio.append(math.exp(min(mean_log, 10.0)))
    out = []
    for s, a_row, m_row in zip(seq_ratio, _rows(adv), m_rows):
        clipped = min(max(s, 1 - clip_low), 1 + clip_high)
        out.append([max(-a * s, -a * clipped) if m else 0.0 for a, m in zip(a_row, m_row)])
    return agg(_out(out), mask, "seq-mean-token-mean", **agg_kw)


def sapo(old, new, adv, mask, tau_pos=1.0, tau_neg=1.05, **agg_kw):
    def token(o, n, a):
        tau = tau_pos if a > 0 else tau_neg
        gate = 1 / (1 + math.exp(-tau * (_ratio(o, n) - 1))) * 4 / tau
        return -gate * a

    return agg(_token_losses(token, old, new, adv, mask), mask, "seq-mean-token-mean", **agg_kw)


def gpg_loss(old, new, adv, mask, mode="token-mean", **agg_kw):
    return agg(_token_losses(lambda o, n, a: -n * a, old, new, adv, mask), mask, mode, **agg_kw)


def cispo(old, new, adv, mask, mode="token-mean", clip_low=0.2, clip_high=0.2, **agg_kw):
    def token(o, n, a):
        return -min(max(_ratio(o, n), 1 - clip_low), 1 + clip_high) * a * n

    return agg(_token_losses(token, old, new, adv, mask), mask, mode, **agg_kw)


def dppo(old, new, adv, mask, divergence, mode="token-mean", delta_low=0.2, delta_high=0.2, clip_c=20.0, **agg_kw):
    """DPPO-Binary: −A·min(r, c)·log π on the tokens inside the TV or binary-KL trust region, 0 elsewhere."""

    def token(o, n, a):
        p, q = math.exp(n), math.exp(o)
        if divergence == "tv":
            inside = p - q <= delta_high if a > 0 else p - q >= -delta_low
        else:
            d = q * (o - n) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
            inside = (d <= delta_high or p <= q) if a > 0 else (d <= delta_low or p >= q)
        return -a * min(_ratio(o, n), clip_c) * n if inside else 0.0

    return agg(_token_losses(token, old, new, adv, mask), mask, mode, **agg_kw)


def dro(old, new, adv, mask, beta, mode="token-mean", weights=None, **agg_kw):
    def token(o, n, a):
        return -(n * a - 0.5 * beta * (n - o) ** 2)

    return agg(_token_losses(token, old, new, adv, mask, weights), mask, mode, **agg_kw)


def geo_mean(old, new, adv, mask, clip_low=0.2, clip_high=0.2):
    losses = []
    for o_row, n_row, a_row, m_row in zip(_rows(old), _rows(new), _rows(adv), _rows(mask)):
        count = sum(m_row)
        used = []
        for o, n, a, m in zip(o_row, n_row, a_row, m_row):
            if not m:
                continue
            delta = n - o
            clipped = min(max(delta, -clip_low), clip_high)
            # the clip only binds on the side that raises the objective: above for A > 0, below for A < 0
            used.append(min(delta, clipped) if a > 0 else max(delta, clipped) if a < 0 else 0.0)
        mean_adv = math.fsum(a * m for a, m in zip(a_row, m_row)) / (count + 1e-8)
        mean_log = math.fsum(used) / (count + 1e-8)
        losses.append(-mean_adv * math.exp(mean_log))
    return math.fsum(losses) / len(losses)


def covariance(adv, new, mask) -> list[list[float | None]]:
    """(A − mean A)(log π − mean log π) on valid tokens (means over valid tokens), None elsewhere."""
    a_rows, n_rows, m_rows = _rows(adv), _rows(new), _rows(mask)
    pairs = [(a, n) for a_row, n_row, m_row in zip(a_rows, n_rows, m_rows) for a, n, m in zip(a_row, n_row, m_row) if m]
    mean_a = math.fsum(a for a, _ in pairs) / len(pairs)
    mean_n = math.fsum(n for _, n in pairs) / len(pairs)
    return [
        [(a - mean_a) * (n - mean_n) if m else None for a, n, m in zip(a_row, n_row, m_row)]
        for a_row, n_row, m_row in zip(a_rows, n_rows, m_rows)
    ]


def kl_cov(old, new, adv, mask, mode="token-mean", ratio=0.0002, coef=0.1):
    cov = covariance(adv, new, mask)
    flat = sorted(((c, i, t) for i, row in enumerate(cov) for t, c in enumerate(row) if c is not None), reverse=True)
    k = max(1, int(len(flat) * ratio))
    chosen = {(i, t) for _, i, t in flat[:k]}
    o_rows, n_rows, a_rows = _rows(old), _rows(new), _rows(adv)
    out = []
    for i, m_row in enumerate(_rows(mask)):
        row = []
        for t, m in enumerate(m_row):
            o, n, a = o_rows[i][t], n_rows[i][t], a_rows[i][t]
            value = -a * _ratio(o, n) + (coef * abs(n - o) if (i, t) in chosen else 0.0)
            row.append(value if m else 0.0)
        out.append(row)
    return agg(_out(out), mask, mode)


# ----------------------------------------------------------------------------------------------- tolerances
RTOL, ATOL = 1e-7, 1e-9


def assert_tight(actual: torch.Tensor | float, expected: torch.Tensor | float, rtol=RTOL, atol=ATOL) -> None:
    """Element-wise |actual − expected| <= atol + rtol·|expected| in float64 (tight: fp64 inputs only)."""
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64),
        torch.as_tensor(expected, dtype=torch.float64),
        rtol=rtol,
        atol=atol,
    )
