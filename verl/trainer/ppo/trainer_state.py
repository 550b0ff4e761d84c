"""`TrainerState`: everything of the driver that a checkpoint restores, in one object the trainer owns.

The counters mean one thing each:

- ``global_steps``: the training step in progress (during ``fit()``), else the last one trained; it names the
  step's metrics, checkpoint folder and sampling seeds.
- ``epoch``: the pass over the training data the last prompts were drawn from.
- ``weight_version``: the version of the weights the rollout engines hold: 0 as built, +1 at every weight push
  (``trainer.checkpoint_manager.update_weights()``). Every sample records the version(s) that generated it.

With them: the KL-in-reward controller (its coefficient is state), the training data loader (its position) and
the rollout source (room for a sample queue; ``sync`` has none). The checkpoint code only writes
:meth:`TrainerState.state_dict` and hands it back to :meth:`TrainerState.load_state_dict`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.utils.rng import get_rng_state, set_rng_state

__all__ = ["TrainerState"]


@dataclass
class TrainerState:
    """The driver's restorable state (see the module docstring).

    Args:
        global_steps / epoch / weight_version: the counters.
        kl_ctrl: the KL-in-reward controller (``algorithm.use_kl_in_reward``), or None.
        dataloader: the training data loader (a ``StatefulDataLoader``), or None.
        source: the rollout source; its ``state_dict()`` / ``load_state_dict()`` hold what it has in flight.
    """

    global_steps: int = 0
    epoch: int = 0
    weight_version: int = 0
    kl_ctrl: Any = None
    dataloader: Any = None
    source: Any = None

    def state_dict(self) -> dict[str, Any]:
        """A picklable snapshot: the counters, ``kl_coef``, ``data`` (the loader's position), ``source`` and
        ``rng`` (this process's random states)."""
        return {
            "global_steps": self.global_steps,
            "epoch": self.epoch,
            "weight_version": self.weight_version,
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
            "data": None if self.dataloader is None else self.dataloader.state_dict(),
            "source": self.source.state_dict() if self.source is not None else {},
            "rng": get_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (a checkpoint written before weight versions existed resumes at
        version ``global_steps``: one push per step)."""
        self.global_steps = int(state["global_steps"])
        self.epoch = int(state["epoch"])
        self.weight_version = int(state.get("weight_version", self.global_steps))
        if self.kl_ctrl is not None and state.get("kl_coef") is not None:
            self.kl_ctrl.value = state["kl_coef"]
        if self.dataloader is not None and state.get("data") is not None:
            self.dataloader.load_state_dict(state["data"])
        if self.source is not None:
            self.source.load_state_dict(state.get("source") or {})
        set_rng_state(state["rng"])
