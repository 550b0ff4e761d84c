"""What every rollout engine does around its decode loop: read and validate the prompts, settle the sampling plan
(``n``, greedy or not, EOS / pad ids, one seed per sample), and assemble the output batch of the rollout contract.

Engines differ only in how they turn a :class:`GenerationPlan` into responses, log-probs and lengths.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.token_ids import as_token_ids  # noqa: F401 - re-exported: the request API's name

__all__ = [
    "GenerationPlan",
    "as_id_list",
    "as_int",
    "as_token_ids",
    "assemble_output",
    "plan_generation",
    "prompt_logprob_rows",
    "read_prompts",
    "sample_seed",
    "sequence_tensors",
]

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def sample_seed(seed: int, step: int, prompt_index: int, sample_index: int) -> int:
    """The seed of one sample's generator: a hash of (seed, step, prompt index, sample index), in [0, 2**63)."""
    values = (seed, step, prompt_index, sample_index)
    if any(not _INT64_MIN <= int(v) <= _INT64_MAX for v in values):
        raise ValueError(f"sample_seed arguments must fit in int64, got {values}")
    digest = hashlib.blake2b(struct.pack("<4q", *map(int, values)), digest_size=8, person=b"verl-rollout").digest()
    return int.from_bytes(digest, "little") & _INT64_MAX


def as_int(key: str, value: Any, low: int | None = None) -> int:
    """``meta_info[key]`` as an int (>= ``low``), or a ValueError naming the key."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"meta_info[{key!r}]={value!r} must be an integer")
    if low is not None and value < low:
        raise ValueError(f"meta_info[{key!r}]={value!r} must be >= {low}")
    return int(value)


def as_id_list(value: Any) -> list[int]:
    """An int, or a non-empty list of ints → a list of non-negative ints (``[]`` for None)."""
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple) else [value]
    if not items or any(isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0 for v in items):
        raise ValueError(f"meta_info['eos_token_id']={value!r} must be a token id or a non-empty list of token ids")
    return [int(v) for v in items]


def _row_index(prompts: DataProto, key: str, rows: int) -> torch.Tensor | None:
    """The optional per-row int64 tensor ``key`` (``prompt_index`` / ``sample_index``), validated; None if absent."""
    if key not in prompts.batch.keys():
        return None
    value = prompts.batch[key]
    if value.shape != (rows,) or value.dtype.is_floating_point or value.dtype == torch.bool:
        raise ValueError(
            f"prompts[{key!r}] must be an integer tensor of shape ({rows},), got {value.dtype} {value.shape}"
        )
    if rows and int(value.min()) < 0:
        raise ValueError(f"prompts[{key!r}] must be >= 0; row {int(value.argmin())} is {int(value.min())}")
    return value.to("cpu", torch.int64)


def read_prompts(prompts: DataProto, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validated ``input_ids`` (int64), ``attention_mask``, ``position_ids`` (int64) of left-padded prompts."""
    if prompts.batch is None:
        raise ValueError(
            "generate_sequences: the DataProto has no tensors; it needs input_ids, attention_mask and position_ids"
        )
    missing = [k for k in ("input_ids", "attention_mask", "position_ids") if k not in prompts.batch.keys()]
    if missing:
        raise ValueError(f"generate_sequences: prompts lack the key(s) {missing}")
    ids, mask, pos = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    if ids.dim() != 2 or mask.shape != ids.shape or pos.shape != ids.shape:
        raise ValueError(
            f"generate_sequences: input_ids, attention_mask and position_ids must share one (batch, prompt_length) "
            f"shape; got {tuple(ids.shape)}, {tuple(mask.shape)}, {tuple(pos.shape)}"
        )
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"generate_sequences: input_ids must hold integer token ids, got {ids.dtype}")
    if len(ids) == 0:
        return ids.long(), mask, pos.long()
    mask_i = mask.long()
    bad = ((mask_i != 0) & (mask_i != 1)).any(-1) | (mask_i.diff(dim=-1) < 0).any(-1) | (mask_i[:, -1] == 0)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(
            f"generate_sequences: prompt row {row} is not left-padded with at least one token (attention_mask "
            f"must be 0…0 1…1 and end in 1): {mask_i[row].tolist()[-16:]}"
        )
    valid_ids = ids.masked_fill(mask_i == 0, 0)
    bad = ((valid_ids < 0) | (valid_ids >= vocab_size)).any(-1)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(f"generate_sequences: prompt row {row} has token ids outside the vocabulary [0, {vocab_size})")
    return ids.long(), mask, pos.long()


@dataclass(frozen=True)
class GenerationPlan:
    """One ``generate_sequences`` call, settled: the prompts (on CPU) and how to sample from them.

    ``seeds`` holds one seed per sample (rows × n, sample-major within a row) or None when decoding greedily.
    ``params`` is the config or its ``val_kwargs`` (``temperature``, ``top_k``, ``top_p``).
    """

    input_ids: torch.Tensor
    prompt_mask: torch.Tensor
    position_ids: torch.Tensor
    n: int
    greedy: bool
    params: Any
    step: int
    eos_ids: list[int]
    pad: int
    seeds: list[int] | None
    response_length: int
    ignore_eos: bool = False

    @property
    def rows(self) -> int:
        return self.input_ids.shape[0]

    def empty_outputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Responses, log-probs and lengths for a batch of no prompts."""
        return (
            torch.full((0, self.response_length), self.pad, dtype=torch.long),
            torch.zeros(0, self.response_length),
            torch.zeros(0, dtype=torch.long),
        )


def plan_generation(
    prompts: DataProto, config: Any, default_eos: list[int], default_pad: int | None, vocab_size: int
) -> GenerationPlan:
    """Read a prompt batch and its meta_info into a :class:`GenerationPlan`.

    Meta keys: ``eos_token_id`` (default: the model's), ``pad_token_id``, ``do_sample``, ``validate`` (sample with
    ``val_kwargs``), ``global_steps`` (the step, for seeding), ``n`` (default 1: one response per row, as veRL's
    engines; callers repeat the prompts). Optional per-row int tensors: ``prompt_index`` (default: the row) and
    ``sample_index`` (sample j of a row uses sample index ``sample_index · n + j``; default j).
    """
    input_ids, prompt_mask, position_ids = read_prompts(prompts, vocab_size)
    meta = prompts.meta_info
    params = config.val_kwargs if meta.get("validate", False) else config
    n = as_int("n", meta.get("n", 1), 1)  # one response per row unless asked (veRL's callers repeat the prompts)
    do_sample = meta.get("do_sample", params.do_sample)
    if not isinstance(do_sample, bool | np.bool_):
        raise ValueError(f"meta_info['do_sample']={do_sample!r} must be true or false")
    greedy = not do_sample or params.temperature == 0
    step = as_int("global_steps", meta.get("global_steps", 0), 0)
    eos_ids = as_id_list(meta.get("eos_token_id")) or list(default_eos)
    if not eos_ids and not config.ignore_eos:
        raise ValueError("generate_sequences: no eos_token_id in meta_info nor in the model's generation config")
    pad = meta.get("pad_token_id", default_pad)
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    pad = as_int("pad_token_id", pad, 0)
    rows = input_ids.shape[0]
    prompt_index = _row_index(prompts, "prompt_index", rows)
    sample_base = _row_index(prompts, "sample_index", rows)
    seeds = None
    if not greedy:
        p_idx = prompt_index.tolist() if prompt_index is not None else range(rows)
        s_base = sample_base.tolist() if sample_base is not None else [0] * rows
        seeds = [
            sample_seed(config.seed, step, p, s * n + j) for p, s in zip(p_idx, s_base, strict=True) for j in range(n)
        ]
    return GenerationPlan(
        input_ids.cpu(),
        prompt_mask.cpu(),
        position_ids.cpu(),
        n,
        greedy,
        params,
        step,
        eos_ids,
        pad,
        seeds,
        config.response_length,
        bool(config.ignore_eos),
    )


def sequence_tensors(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    response_valid: torch.Tensor,
    response_mask: torch.Tensor,
    log_probs: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """The rollout contract's tensors from left-padded prompts (S, P) and right-padded responses (S, R):
    ``response_valid`` marks the response tokens (1) against padding (0), ``response_mask`` the tokens the model
    generated (a subset: multi-turn tool tokens are valid but not generated), ``log_probs`` their log-probs."""
    bad = response_mask.bool() & ~torch.isfinite(log_probs)
    if bad.any():
        row, col = (int(v) for v in bad.nonzero()[0])
        raise RuntimeError(
            f"generate_sequences: non-finite log-probability for sample row {row} at response position {col}; "
            f"the engine's weights or logits contain NaN/inf"
        )
    response_valid = response_valid.to(prompt_mask.dtype)
    response_mask = response_mask.to(prompt_mask.dtype)
    attention_mask = torch.cat([prompt_mask, response_valid], dim=-1)
    return {
        "prompts": prompt_ids,
        "responses": responses,
        "input_ids": torch.cat([prompt_ids, responses], dim=-1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.long().cumsum(-1) - 1).clamp_(min=0),
        "response_mask": response_mask,
        "rollout_log_probs": log_probs.masked_fill(response_mask == 0, 0.0),
    }


def assemble_output(
    prompts: DataProto, plan: GenerationPlan, responses: torch.Tensor, log_probs: torch.Tensor, lengths: torch.Tensor
) -> DataProto:
    """The rollout contract's output from responses (S, R), their log-probs (S, R) and lengths (S,), S = rows · n."""
    device = responses.device
    valid = torch.arange(plan.response_length, device=device)[None, :] < lengths.to(device)[:, None]
    prompt_mask = plan.prompt_mask.to(device).repeat_interleave(plan.n, dim=0)
    prompt_ids = plan.input_ids.to(device).repeat_interleave(plan.n, dim=0)
    tensors = sequence_tensors(prompt_ids, prompt_mask, responses, valid, valid, log_probs)
    out_device = prompts.batch["input_ids"].device
    tensors = {k: v.to(out_device) for k, v in tensors.items()}
    non_tensors = {k: np.repeat(v, plan.n, axis=0) for k, v in prompts.non_tensor_batch.items()}
    return DataProto.from_dict(tensors, non_tensors, meta_info=dict(prompts.meta_info))


def plan_requests(plan: GenerationPlan, batch_id: str) -> list[tuple[str, list[int], dict[str, Any], None]]:
    """The requests of a batch generation: ``(request_id, prompt_ids, sampling_params, None)`` for each sample
    (rows · n, sample-major within a row), the batch's sampling settings and each sample's seed."""
    params = plan.params
    sampling: dict[str, Any] = {
        "temperature": 0.0 if plan.greedy else float(params.temperature),
        "top_p": 1.0 if plan.greedy else float(params.top_p),
        "top_k": -1 if plan.greedy else int(params.top_k),
        "max_tokens": plan.response_length,
        "stop_token_ids": plan.eos_ids,
        "ignore_eos": plan.ignore_eos,
    }
    requests = []
    for row in range(plan.rows):
        prompt_ids = plan.input_ids[row][plan.prompt_mask[row].bool()].tolist()
        for j in range(plan.n):
            i = row * plan.n + j
            seed = None if plan.seeds is None else plan.seeds[i]
            requests.append((f"{batch_id}-{i}", prompt_ids, {**sampling, "seed": seed}, None))
    return requests


def gather_output(prompts: DataProto, plan: GenerationPlan, outputs: list[Any]) -> DataProto:
    """The rollout contract's output of a batch generation from its requests' ``TokenOutput`` (in
    :func:`plan_requests`' order), with each sample's ``weight_version_ranges`` as the agent loops record them."""
    if not outputs:
        return assemble_output(prompts, plan, *plan.empty_outputs())
    samples, resp_len = len(outputs), plan.response_length
    responses = torch.full((samples, resp_len), plan.pad, dtype=torch.long)
    log_probs = torch.zeros(samples, resp_len)
    lengths = torch.zeros(samples, dtype=torch.long)
    for i, output in enumerate(outputs):
        n_tokens = len(output.token_ids)
        lengths[i] = n_tokens
        responses[i, :n_tokens] = torch.tensor(output.token_ids, dtype=torch.long)
        log_probs[i, :n_tokens] = torch.tensor(output.log_probs, dtype=torch.float32)
    out = assemble_output(prompts, plan, responses, log_probs, lengths)
    ranges = np.empty(samples, dtype=object)  # each sample's (start, end, version) runs
    ranges[:] = [[list(run) for run in output.weight_version_ranges()] for output in outputs]
    out.non_tensor_batch["weight_version_ranges"] = ranges
    return out


def prompt_logprob_rows(
    prompt_ids: list[int],
    k: int,
    own: Callable[[int], float],
    candidates: Callable[[int], Iterable[tuple[int, float]]],
) -> tuple[list[list[int]], list[list[float]]]:
    """veRL's ``prompt_ids`` / ``prompt_logprobs`` fields from a server engine's per-position prompt log-probs: one row
    per prompt token, row i about token i given the tokens before it. ``k = 0``: ``[token i]`` and ``own(i)``, its
    log-prob; ``k > 0``: the ``k`` most likely of ``candidates(i)`` (``(token, log-prob)`` pairs), most likely first.
    Row 0 (nothing before it) is zeros (``[token 0]`` and 0.0 for ``k = 0``)."""
    width = max(k, 1)
    ids: list[list[int]] = [[prompt_ids[0]] if k == 0 else [0] * width]
    values: list[list[float]] = [[0.0] * width]
    for position in range(1, len(prompt_ids)):
        if k == 0:
            ids.append([prompt_ids[position]])
            values.append([float(own(position))])
            continue
        best = sorted(candidates(position), key=lambda pair: -pair[1])[:k]
        ids.append([int(token) for token, _ in best])
        values.append([float(value) for _, value in best])
    return ids, values
