"""veRL's Ulysses sequence-parallel helpers, at sequence-parallel size 1.

Ulysses sequence parallelism (each rank holding a slice of every sequence, attention heads exchanged all-to-all)
is not implemented. At size 1 — no group set — every helper is what veRL's is then: the identity (padding of 0,
the whole tensor as this rank's slice). Setting a group of more than one rank, or asking for ``sp_size > 1``, raises
NotImplementedError naming ``ulysses_sequence_parallel_size``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "gather_outputs_and_unpad",
    "gather_outpus_and_unpad",
    "get_ulysses_sequence_parallel_group",
    "get_ulysses_sequence_parallel_rank",
    "get_ulysses_sequence_parallel_world_size",
    "set_ulysses_sequence_parallel_group",
    "slice_input_tensor",
    "ulysses_pad",
    "ulysses_pad_and_slice_inputs",
    "validate_ulysses_config",
]

NOT_IMPLEMENTED = (
    "ulysses_sequence_parallel_size={size}: Ulysses sequence parallelism is not implemented; set "
    "ulysses_sequence_parallel_size=1 (use_remove_padding and use_dynamic_bsz bound the memory of long sequences)"
)


def check_sp_size(size: int) -> None:
    """Raise NotImplementedError naming ``ulysses_sequence_parallel_size`` when ``size`` > 1."""
    if int(size) > 1:
        raise NotImplementedError(NOT_IMPLEMENTED.format(size=size))


def _group_size(group: Any) -> int:
    return 1 if group is None else dist.get_world_size(group)


def set_ulysses_sequence_parallel_group(group: Any) -> None:
    """Accepts None or a one-rank group only (there is no sequence-parallel state to set)."""
    check_sp_size(_group_size(group))


def get_ulysses_sequence_parallel_group() -> None:
    """None: no sequence-parallel group."""
    return None


def get_ulysses_sequence_parallel_world_size(group: Any = None) -> int:
    """The size of ``group`` (1 when None)."""
    return _group_size(group)


def get_ulysses_sequence_parallel_rank(group: Any = None) -> int:
    """This rank's index in ``group`` (0 when None)."""
    return 0 if group is None else dist.get_rank(group)


def slice_input_tensor(x: torch.Tensor, dim: int, padding: bool = True, group: Any = None) -> torch.Tensor:
    """This rank's slice of ``x`` along ``dim``: all of it at size 1."""
    check_sp_size(_group_size(group))
    return x


def gather_outputs_and_unpad(
    x: torch.Tensor,
    gather_dim: int,
    unpad_dim: int | None = None,
    padding_size: int = 0,
    grad_scaler: bool = True,
    group: Any = None,
) -> torch.Tensor:
    """Gather the ranks' slices along ``gather_dim`` and drop ``padding_size`` trailing entries of ``unpad_dim``;
    with no group (size 1) ``x`` unchanged, as veRL."""
    check_sp_size(_group_size(group))
    return x


gather_outpus_and_unpad = gather_outputs_and_unpad  # veRL's old misspelt name


def ulysses_pad(
    input_ids_rmpad: torch.Tensor, position_ids_rmpad: torch.Tensor | None = None, sp_size: int = 1, pad_value: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Pad packed inputs to a multiple of ``sp_size``: at size 1 the inputs and a padding of 0."""
    check_sp_size(sp_size)
    return input_ids_rmpad, position_ids_rmpad, 0


def ulysses_pad_and_slice_inputs(
    input_ids_rmpad: torch.Tensor,
    position_ids_rmpad: torch.Tensor | None = None,
    sp_size: int = 1,
    skip_position_ids_rmpad: bool = False,
    pad_value: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """Pad and slice packed inputs for this rank: at size 1 ``(input_ids, position_ids, 0)``."""
    return ulysses_pad(input_ids_rmpad, position_ids_rmpad, sp_size, pad_value)


def validate_ulysses_config(num_heads: int, ulysses_sequence_size: int) -> None:
    """veRL checks the head count divides the size; here any size > 1 is refused."""
    check_sp_size(ulysses_sequence_size)
