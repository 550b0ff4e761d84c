"""The training-engine API the actor and critic step through, and the engine of a module built elsewhere.

Every engine (``FSDPEngine``, a recipe's own, :class:`ModuleEngine`) offers what a PPO update needs::

    engine.module                           # the model to forward
    with engine.eval_mode(): ...            # no-grad passes (log-probs, values); parameters released after
    grad_norm = engine.clip_grad_norm_and_step(max_norm)   # clip, step, clear; the norm before clipping

`DataParallelPPOActor` and `DataParallelPPOCritic` call nothing else, so an engine chosen by ``strategy``
(`verl.workers.engine.get_engine_class`) changes how the model is held without touching the losses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import torch

from verl.workers.engine.optim import clip_grad_norm_and_step

__all__ = ["ModuleEngine", "TrainingEngine"]


@runtime_checkable
class TrainingEngine(Protocol):
    """What the actor and critic use of an engine."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer | None

    def clip_grad_norm_and_step(self, max_norm: float | None = None) -> float: ...

    def eval_mode(self) -> contextlib.AbstractContextManager[None]: ...


class ModuleEngine:
    """The engine of a model (and optimizer) the caller built: veRL's ``DataParallelPPOActor(config, module,
    optimizer)`` signature, tests, and research code that owns its model.

    Args:
        module: the model (plain or already sharded; FSDP2 modules are resharded after a no-grad pass).
        optimizer: its optimizer; None for a forward-only engine.
        max_norm: the clip used when ``clip_grad_norm_and_step`` is given none.
    """

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, max_norm: float = 1.0):
        self.module = module
        self.optimizer = optimizer
        self.max_norm = max_norm

    def clip_grad_norm_and_step(self, max_norm: float | None = None) -> float:
        """Clip the gradients to ``max_norm``, step the optimizer, clear the gradients; the norm before clipping
        (a non-finite norm skips the step, see `verl.workers.engine.optim.clip_grad_norm_and_step`)."""
        if self.optimizer is None:
            raise RuntimeError("clip_grad_norm_and_step needs an optimizer: this engine was built for inference only")
        return clip_grad_norm_and_step(self.module, self.optimizer, self.max_norm if max_norm is None else max_norm)

    @contextlib.contextmanager
    def eval_mode(self) -> Iterator[None]:
        """``module.eval()`` and ``torch.no_grad()`` inside; the training flag restored and FSDP2 parameters
        resharded on exit."""
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            if hasattr(self.module, "reshard"):
                self.module.reshard()
            self.module.train(was_training)
