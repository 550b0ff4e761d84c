"""Learning-rate schedules against hand-worked values (multipliers of the peak lr)."""

from __future__ import annotations

import math

import pytest
import torch

from verl.workers.config.optimizer import FSDPOptimizerConfig
from verl.workers.engine.lr_schedule import (
    build_lr_scheduler,
    constant_schedule_with_warmup,
    cosine_schedule_with_warmup,
    resolve_warmup_steps,
)


def _lrs(optim: FSDPOptimizerConfig, steps: int) -> list[float]:
    """The lr of optimizer steps 0 .. steps-1 when the scheduler is stepped after each."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    scheduler = build_lr_scheduler(optimizer, optim)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_constant_schedule():
    # No warmup: the peak from the first step on.
    assert _lrs(FSDPOptimizerConfig(lr=0.5), 3) == [0.5, 0.5, 0.5]
    # 4 warmup steps: 0, 1/4, 2/4, 3/4 of the peak, then the peak.
    assert _lrs(FSDPOptimizerConfig(lr=2.0, lr_warmup_steps=4), 6) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]
    assert [constant_schedule_with_warmup(s, warmup_steps=2) for s in range(4)] == [0.0, 0.5, 1.0, 1.0]


def test_cosine_schedule_default_min_lr_ratio_none_decays_to_zero():
    optim = FSDPOptimizerConfig(lr=1.0, lr_scheduler_type="cosine", total_training_steps=4)
    assert optim.min_lr_ratio is None  # veRL's dataclass default; the yaml sets 0.0
    lrs = _lrs(optim, 6)
    assert lrs[0] == pytest.approx(1.0) and lrs[2] == pytest.approx(0.5) and lrs[4:] == pytest.approx([0.0, 0.0])


def test_cosine_schedule_with_warmup_and_min_lr():
    optim = FSDPOptimizerConfig(
        lr=1.0, lr_scheduler_type="cosine", lr_warmup_steps=2, total_training_steps=10, min_lr_ratio=0.1
    )
    lrs = _lrs(optim, 12)
    # Warmup 0, 1/2; then progress p = (s − 2)/8 and lr = 0.1 + 0.9·½(1 + cos πp):
    # s=2: p=0 → 1; s=6: p=½ → 0.1 + 0.45 = 0.55; s=10: p=1 → 0.1; past the end it stays at 0.1.
    assert lrs[:3] == pytest.approx([0.0, 0.5, 1.0], abs=1e-12)
    assert lrs[6] == pytest.approx(0.55, abs=1e-12)
    assert lrs[4] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), abs=1e-12)
    assert lrs[10] == pytest.approx(0.1, abs=1e-12) and lrs[11] == pytest.approx(0.1, abs=1e-12)
    # A full cycle (num_cycles=1) comes back up to the peak at the end; half way it is at the minimum 0.
    full = [cosine_schedule_with_warmup(s, warmup_steps=0, total_steps=4, num_cycles=1.0) for s in range(5)]
    assert full == pytest.approx([1.0, 0.5, 0.0, 0.5, 1.0], abs=1e-12)


def test_warmup_steps_from_ratio():
    optim = FSDPOptimizerConfig(lr_warmup_steps_ratio=0.25, total_training_steps=10)
    assert resolve_warmup_steps(optim) == 2  # int(2.5)
    assert resolve_warmup_steps(FSDPOptimizerConfig(lr_warmup_steps=3, lr_warmup_steps_ratio=0.5)) == 3
    assert resolve_warmup_steps(FSDPOptimizerConfig(lr_warmup_steps=None)) == 0
    with pytest.raises(ValueError, match=r"lr_warmup_steps_ratio=0.1 needs optim.total_training_steps \(got -1\)"):
        resolve_warmup_steps(FSDPOptimizerConfig(lr_warmup_steps_ratio=0.1))


def test_cosine_needs_total_steps():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=r"lr_scheduler_type='cosine' needs optim.total_training_steps \(got -1\)"):
        build_lr_scheduler(optimizer, FSDPOptimizerConfig(lr_scheduler_type="cosine"))
