"""Sequence-length balancing: even token loads across data-parallel ranks and token-budget micro-batches.

* :func:`get_seqlen_balanced_partitions` splits sequence lengths into ``k`` groups of near-equal total with the
  largest differencing method (Karmarkar & Karp 1982, "The differencing method of set partitioning", generalised to
  k-way partitions as in Michiels et al. 2012, "Computer-assisted proof of performance ratios for the Differencing
  Method"). Its final spread (max − min group total) is at most the largest item.
* :func:`balance_batch` reorders a batch so that each of ``dp_size`` contiguous chunks (one per rank) holds about
  the same number of tokens (``trainer.balance_batch``), with ``global_seqlen/*`` metrics.
* :func:`rearrange_micro_batches` forms micro-batches of at most ``max_token_len`` valid tokens
  (``use_dynamic_bsz``); :func:`get_reverse_idx` / :func:`restore_order` put per-micro-batch outputs back in row order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "balance_batch",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "log_seqlen_unbalance",
    "rearrange_micro_batches",
    "restore_order",
]

# A micro-batch count no rank can reach: all-reduced (max) so every rank raises together instead of hanging.
_INFEASIBLE = 2**62


def _as_int_list(seqlen_list: Sequence[int] | torch.Tensor) -> list[int]:
    values = seqlen_list.tolist() if isinstance(seqlen_list, torch.Tensor) else list(seqlen_list)
    out = [int(v) for v in values]
    if any(v < 0 for v in out):
        raise ValueError(f"sequence lengths must be >= 0, got {min(out)}")
    return out


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int] | torch.Tensor, k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """Split item indices into ``k_partitions`` groups whose length totals are as even as the differencing method
    makes them.

    Every state is a k-tuple of groups; states are merged pairwise, always the two with the largest spread first,
    pairing the heaviest group of one with the lightest of the other. With ``equal_size`` the initial states are
    k consecutive items of the sorted lengths, one per group, so every group ends with ``n / k`` items. Equal totals
    are ordered by item count, so empty groups sort last and pair with non-empty ones: merging states with a and b
    non-empty groups gives min(k, a + b), and with n ≥ k no group ends empty (even with zero-length items).

    Args:
        seqlen_list: n non-negative lengths.
        k_partitions: k ≥ 1 groups; each gets at least one item.
        equal_size: give every group exactly n / k items.

    Returns:
        k lists of indices into ``seqlen_list``, each sorted ascending.

    Raises:
        ValueError: k < 1, fewer items than groups, n not divisible by k with ``equal_size``, a negative length.
    """
    seqlens = _as_int_list(seqlen_list)
    n, k = len(seqlens), k_partitions
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k_partitions={k!r} must be an integer >= 1")
    if n < k:
        raise ValueError(f"cannot split {n} sequences into {k} non-empty partitions")
    if equal_size and n % k:
        raise ValueError(f"equal_size partitions need the {n} sequences to be divisible by k_partitions={k}")
    order = sorted(range(n), key=lambda i: (seqlens[i], i))
    # a state: list of k (total, items) groups sorted by total descending (ties: more items first)
    if equal_size:
        initial = [[(seqlens[i], [i]) for i in reversed(order[s : s + k])] for s in range(0, n, k)]
    else:
        initial = [[(seqlens[i], [i])] + [(0, []) for _ in range(k - 1)] for i in order]
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for tie, state in enumerate(initial):
        heapq.heappush(heap, (-(state[0][0] - state[-1][0]), tie, state))
    tie = len(initial)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second))]
        merged.sort(key=lambda g: (g[0], len(g[1])), reverse=True)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    return [sorted(items) for _, items in heap[0][2]]


def log_seqlen_unbalance(
    seqlen_list: Sequence[int] | torch.Tensor, partitions: list[list[int]], prefix: str = "global_seqlen"
) -> dict[str, float]:
    """Token totals per rank before (contiguous equal chunks) and after balancing (``partitions``).

    Returns ``{prefix}/min``, ``/max``, ``/minmax_diff`` (contiguous chunks), ``/balanced_min``, ``/balanced_max``
    (the partitions) and ``/mean`` (total ÷ number of partitions).
    """
    seqlens = _as_int_list(seqlen_list)
    k = len(partitions)
    chunk = math.ceil(len(seqlens) / k)
    before = [sum(seqlens[s : s + chunk]) for s in range(0, len(seqlens), chunk)]
    after = [sum(seqlens[i] for i in part) for part in partitions]
    return {
        f"{prefix}/min": float(min(before)),
        f"{prefix}/max": float(max(before)),
        f"{prefix}/minmax_diff": float(max(before) - min(before)),
        f"{prefix}/balanced_min": float(min(after)),
        f"{prefix}/balanced_max": float(max(after)),
        f"{prefix}/mean": float(sum(seqlens)) / k,
    }


def balance_batch(data: Any, dp_size: int, prefix: str = "global_seqlen") -> tuple[torch.Tensor, dict[str, float]]:
    """Reorder ``data`` in place so each of ``dp_size`` contiguous equal chunks holds a balanced token total.

    Token counts are ``attention_mask.sum(-1)``. Within a chunk rows keep their original relative order.

    Args:
        data: a ``DataProto`` with ``attention_mask`` (bs, seqlen); ``bs`` divisible by ``dp_size``.
        dp_size: data-parallel ranks the batch will be chunked over.
        prefix: metric namespace.

    Returns:
        ``(permutation, metrics)``: row ``i`` of the reordered batch is old row ``permutation[i]``; metrics as in
        :func:`log_seqlen_unbalance`.

    Raises:
        ValueError: ``bs`` not divisible by ``dp_size`` (from :func:`get_seqlen_balanced_partitions`).
    """
    seqlens = data.batch["attention_mask"].sum(-1).tolist()
    partitions = get_seqlen_balanced_partitions(seqlens, dp_size, equal_size=True)
    permutation = torch.tensor([i for part in partitions for i in part], dtype=torch.long)
    metrics = log_seqlen_unbalance(seqlens, partitions, prefix)
    data.reorder(permutation)
    return permutation, metrics


def _micro_batch_groups(seqlens: list[int], start: int, max_token_len: int, step: int) -> tuple[list[list[int]], str]:
    """The balanced partition into the smallest count k ≥ ``start`` (a multiple of ``step``) that fits the budget,
    or ``([], reason)`` when none does."""
    n = len(seqlens)
    if n and max(seqlens) > max_token_len:
        return [], f"a sequence of {max(seqlens)} tokens exceeds max_token_len={max_token_len}"
    first = k = math.ceil(max(start, 1) / step) * step
    while k <= n:
        groups = get_seqlen_balanced_partitions(seqlens, k, equal_size=False)
        if max(sum(seqlens[i] for i in g) for g in groups) <= max_token_len:
            return groups, ""
        k += step
    return [], f"{n} rows cannot form {first} non-empty micro-batches"


def _all_reduce_max(value: int, group: Any) -> int:
    tensor = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
) -> tuple[list[Any], list[list[int]]]:
    """Split ``batch`` into the fewest micro-batches of at most ``max_token_len`` valid tokens each, balanced.

    Valid tokens are ``attention_mask.sum(-1)``. The count starts at ⌈total ÷ max_token_len⌉ and grows until the
    balanced partition fits. With a ``dp_group`` every rank agrees on the largest count (all-reduce max), since each
    micro-batch is one FSDP forward and the collectives must line up. Micro-batches come heaviest first; rows inside
    keep their relative order.

    Args:
        batch: a ``DataProto`` or ``TensorDict`` holding ``attention_mask`` (bs, seqlen).
        max_token_len: the token budget of one micro-batch (≥ the longest sequence).
        dp_group: process group to agree on the count with (None: this process alone).
        num_batches_divided_by: make the count a multiple of this.
        same_micro_num_in_dp: agree on the count over ``dp_group`` (set False only without FSDP collectives).
        min_num_micro_batch: at least this many micro-batches.

    Returns:
        ``(micro_batches, micro_bsz_idx)``: the micro-batches, and for each the row indices of ``batch`` it holds;
        ``restore_order(outputs, micro_bsz_idx)`` puts per-row outputs back in ``batch``'s order.

    Raises:
        ValueError: a non-positive budget or divisor; a sequence longer than the budget, or fewer rows than
            micro-batches, on any rank of ``dp_group`` (raised on every rank together).
    """
    if not isinstance(max_token_len, int) or isinstance(max_token_len, bool) or max_token_len < 1:
        raise ValueError(f"max_token_len={max_token_len!r} must be a positive integer (a token budget)")
    step = 1 if num_batches_divided_by is None else num_batches_divided_by
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"num_batches_divided_by={num_batches_divided_by!r} must be a positive integer")
    data = batch.batch if hasattr(batch, "non_tensor_batch") else batch
    seqlens = data["attention_mask"].sum(-1).tolist()
    start = max(math.ceil(sum(seqlens) / max_token_len), min_num_micro_batch or 1)
    groups, reason = _micro_batch_groups(seqlens, start, max_token_len, step)
    if dp_group is not None and same_micro_num_in_dp and dist.is_initialized():
        while True:  # every rank runs the same iterations: the loop only branches on all-reduced values
            agreed = _all_reduce_max(len(groups) or _INFEASIBLE, dp_group)
            if agreed >= _INFEASIBLE:
                groups, reason = [], reason or "another data-parallel rank could not form its micro-batches"
                break
            if len(groups) != agreed:
                groups, reason = _micro_batch_groups(seqlens, agreed, max_token_len, step)
            if _all_reduce_max(len(groups) or _INFEASIBLE, dp_group) == agreed:
                break
    if not groups:
        raise ValueError(f"dynamic batch sizes: {reason} (rows: {len(seqlens)}, max_token_len={max_token_len})")
    groups.sort(key=lambda g: (-sum(seqlens[i] for i in g), g[0]))
    if hasattr(batch, "non_tensor_batch"):
        micro_batches = [batch.select_idxs(g) for g in groups]
    else:
        micro_batches = [batch[torch.tensor(g, dtype=torch.long)] for g in groups]
    return micro_batches, groups


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``reverse[idx_map[i]] = i``, so ``concat(outputs)[reverse]`` is in row order.

    Raises:
        ValueError: ``idx_map`` is not a permutation of ``0..n-1``.
    """
    idx = [int(i) for i in idx_map]
    if sorted(idx) != list(range(len(idx))):
        raise ValueError(f"idx_map must be a permutation of 0..{len(idx) - 1}, got {idx}")
    reverse = [0] * len(idx)
    for position, row in enumerate(idx):
        reverse[row] = position
    return reverse


def restore_order(outputs: Sequence[torch.Tensor], micro_bsz_idx: list[list[int]]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs and put their rows back in the original order.

    Shape: ``outputs[j]`` (len(micro_bsz_idx[j]), ...) → (bs, ...).
    """
    flat = [i for group in micro_bsz_idx for i in group]
    stacked = torch.cat(list(outputs), dim=0)
    if stacked.shape[0] != len(flat):
        raise ValueError(f"outputs hold {stacked.shape[0]} rows but the micro-batch indices name {len(flat)}")
    return stacked[torch.tensor(get_reverse_idx(flat), dtype=torch.long, device=stacked.device)]
