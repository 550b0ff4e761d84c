"""veRL 0.10's trainer-mode registry (``register_trainer`` / ``get_trainer_cls``) and its place in validation; a
registered mode's run with its hooks in order is in tests/trainer/test_main_ppo.py (the ``validation`` run)."""

from __future__ import annotations

import pytest

from verl.trainer.config.layout import trainer_mode, trainer_mode_name
from verl.trainer.config.validate import ConfigError, merged, validate_config
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.v1 import HOOKS, PPOTrainer, TrainerHooks, get_trainer_cls, register_trainer, trainer_base


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(trainer_base, "_TRAINERS", {})  # each test registers into a registry of its own
    return trainer_base._TRAINERS


def test_the_built_in_modes_are_the_trainer_and_hooks_default_to_nothing():
    assert PPOTrainer is RayPPOTrainer and issubclass(PPOTrainer, TrainerHooks)
    assert all(get_trainer_cls(m) is RayPPOTrainer for m in ("sync", "colocate_async", "separate_async"))
    hooks = TrainerHooks()
    assert [getattr(hooks, name)() for name in HOOKS] == [None] * 6 + [{}] + [None] * 3


def test_register_a_mode_and_the_mistakes_named(registry):
    @register_trainer("streamed")
    class Streamed(PPOTrainer):
        rollout_mode = "separate_async"

    assert get_trainer_cls("streamed") is Streamed and register_trainer("streamed")(Streamed) is Streamed
    with pytest.raises(ValueError, match=r"'streamed' is already registered to .*Streamed"):

        @register_trainer("streamed")
        class Other(PPOTrainer):
            rollout_mode = "sync"

    with pytest.raises(ValueError, match="'sync' is a built-in trainer mode"):
        register_trainer("sync")(Streamed)
    with pytest.raises(ValueError, match=r"NoSchedule.rollout_mode=None; set it to .* one of \['sync'"):

        @register_trainer("no_schedule")
        class NoSchedule(PPOTrainer):
            pass

    with pytest.raises(TypeError, match="is not a PPOTrainer subclass"):
        register_trainer("plain")(object)
    with pytest.raises(ValueError, match=r"Unknown trainer mode 'nope'; registered: \['sync', .*'streamed'\]"):
        get_trainer_cls("nope")


def test_a_registered_mode_validates_and_runs_on_its_schedule(registry):
    @register_trainer("my_async")
    class MyAsync(PPOTrainer):
        rollout_mode = "colocate_async"

    config = merged(["trainer.v1.trainer_mode=my_async"])
    assert trainer_mode_name(config) == "my_async" and trainer_mode(config) == "colocate_async"
    with pytest.raises(ConfigError) as known:  # the base config lacks a model and batch sizes: other problems
        validate_config(config)
    assert "trainer_mode" not in str(known.value)
    with pytest.raises(ConfigError, match=r"trainer.v1.trainer_mode='unregistered'; use one of \[.*'my_async'\]"):
        validate_config(merged(["trainer.v1.trainer_mode=unregistered"]))
