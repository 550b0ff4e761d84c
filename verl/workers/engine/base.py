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
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import torch

from verl.workers.engine.optim import clip_grad_norm_and_step

__all__ = ["ModuleEngine", "TrainingEngine", "as_engine", "eval_no_grad"]


@runtime_checkable
class TrainingEngine(Protocol):
    """What the actor and critic use of an engine."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer | None

    def clip_grad_norm_and_step(self, max_norm: float | None = None) -> float: ...

    def eval_mode(self) -> contextlib.AbstractContextManager[None]: ...


@contextlib.contextmanager
def eval_no_grad(module: torch.nn.Module, release: Callable[[torch.nn.Module], None]) -> Iterator[None]:
    """``module.eval()`` and ``torch.no_grad()`` inside; on exit ``release(module)`` (free gathered parameters) and
    the training flag restored."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        release(module)
        module.train(was_training)


def _reshard_root(module: torch.nn.Module) -> None:
    if hasattr(module, "reshard"):  # an FSDP2 module built by the caller
        module.reshard()


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

    def eval_mode(self) -> contextlib.AbstractContextManager[None]:
        """``module.eval()`` and ``torch.no_grad()`` inside; the training flag restored and FSDP2 parameters
        resharded on exit."""
        return eval_no_grad(self.module, _reshard_root)


def as_engine(
    engine: TrainingEngine | None, module: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None, who: str
) -> TrainingEngine:
    """``engine``, or a :class:`ModuleEngine` of the caller's ``module`` and ``optimizer`` (veRL's signature)."""
    if engine is not None:
        return engine
    if module is None:
        raise ValueError(f"{who} needs a module (and an optimizer to train) or an engine")
    return ModuleEngine(module, optimizer)
