"""``FSDPUlyssesShardingManager``: veRL's context around a pass under Ulysses sequence parallelism.

Only sequence-parallel size 1 is implemented: the manager then does nothing — entering and leaving it change no
state, and ``preprocess_data`` / ``postprocess_data`` return the batch they are given. A device mesh with an
``sp`` dimension of more than one rank is refused by name (``ulysses_sequence_parallel_size``).
"""

from __future__ import annotations

from typing import Any

from verl.protocol import DataProto
from verl.utils.ulysses import check_sp_size

__all__ = ["FSDPUlyssesShardingManager"]


class FSDPUlyssesShardingManager:
    """Args:
    device_mesh: veRL's ``(dp, sp)`` mesh, or None (sequence-parallel size 1).
    """

    def __init__(self, device_mesh: Any = None) -> None:
        sp = 1
        if device_mesh is not None and "sp" in (device_mesh.mesh_dim_names or ()):
            sp = device_mesh["sp"].size()
        check_sp_size(sp)
        self.device_mesh = device_mesh

    def __enter__(self) -> FSDPUlyssesShardingManager:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        return None

    def preprocess_data(self, data: DataProto) -> DataProto:
        """veRL all-gathers the batch over the sp group; at size 1 it is already whole."""
        return data

    def postprocess_data(self, data: DataProto) -> DataProto:
        """veRL keeps this rank's share of the sp group's output; at size 1 that is all of it."""
        return data
