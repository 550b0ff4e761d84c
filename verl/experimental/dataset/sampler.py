"""Base classes of ``data.sampler.class_path`` samplers, at veRL's import path.

A curriculum sampler subclasses :class:`AbstractCurriculumSampler`; the trainer calls its ``update(batch)`` after
every trained step with that step's batch (scores, advantages, ``uid`` …), so the sampler can reorder what comes
next. Samplers are built as ``cls(data_source=dataset, data_config=config.data)``; keep
``data.dataloader_num_workers=0`` with a curriculum sampler, as the loader's worker processes would hold copies.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sized
from typing import Any

from torch.utils.data import Sampler

__all__ = ["AbstractCurriculumSampler", "AbstractSampler"]


class AbstractSampler(Sampler[int]):
    """A sampler built from the dataset and the ``data`` config."""

    @abstractmethod
    def __init__(self, data_source: Sized, data_config: Any) -> None: ...


class AbstractCurriculumSampler(AbstractSampler):
    """A sampler that learns from training: ``update`` gets each trained step's batch (a ``DataProto``)."""

    @abstractmethod
    def update(self, batch: Any) -> None:
        """Adjust the sampling after a training step on ``batch``."""
