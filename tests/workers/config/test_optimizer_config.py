"""FSDPOptimizerConfig (``*.optim``): veRL's defaults, deprecated aliases, one test per validation error."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from omegaconf import OmegaConf

from verl.base_config import omega_conf_to_dataclass
from verl.workers.config.optimizer import FSDPOptimizerConfig, OptimConfig, OptimizerConfig


def test_defaults_are_veRLs():
    cfg = FSDPOptimizerConfig()
    assert (cfg.optimizer, cfg.optimizer_impl, cfg.lr) == ("AdamW", "torch.optim", 1e-6)
    assert (cfg.lr_warmup_steps_ratio, cfg.lr_warmup_steps, cfg.total_training_steps) == (0.0, -1, -1)
    assert (cfg.weight_decay, tuple(cfg.betas), cfg.clip_grad, cfg.grad_clip) == (0.01, (0.9, 0.999), 1.0, None)
    assert (cfg.min_lr_ratio, cfg.num_cycles, cfg.lr_scheduler_type, cfg.warmup_style) == (None, 0.5, "constant", None)
    assert cfg.override_optimizer_config is None
    assert OptimConfig is FSDPOptimizerConfig and issubclass(FSDPOptimizerConfig, OptimizerConfig)


def test_roles_default_optim_is_the_yamls_with_min_lr_ratio_zero():
    from verl.workers.config import ActorConfig, CriticConfig
    from verl.workers.config.optimizer import role_optim_default

    assert role_optim_default().min_lr_ratio == 0.0 and role_optim_default(lr=2.0).lr == 2.0
    assert ActorConfig().optim.min_lr_ratio == 0.0 and CriticConfig().optim.min_lr_ratio == 0.0
    assert CriticConfig().optim.lr == 1e-5


def test_built_from_omegaconf_and_frozen():
    raw = OmegaConf.create({"lr": 1e-5, "betas": [0.9, 0.95], "lr_scheduler_type": "cosine", "min_lr_ratio": None})
    cfg = omega_conf_to_dataclass(raw, FSDPOptimizerConfig)
    assert cfg.lr == 1e-5 and list(cfg.betas) == [0.9, 0.95] and cfg.get("lr_scheduler_type") == "cosine"
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"FSDPOptimizerConfig\.total_training_steps is frozen"):
        cfg.total_training_steps = 100
    # The trainer injects the run length into a copy.
    sized = dataclasses.replace(cfg, total_training_steps=100)
    assert sized.total_training_steps == 100 and cfg.total_training_steps == -1


def test_deprecated_aliases_fold_into_the_new_keys():
    with pytest.warns(DeprecationWarning, match="optim.warmup_style is deprecated, use optim.lr_scheduler_type"):
        cfg = FSDPOptimizerConfig(warmup_style="cosine")
    assert cfg.lr_scheduler_type == "cosine"
    with pytest.warns(DeprecationWarning, match="optim.grad_clip is deprecated, use optim.clip_grad"):
        cfg = FSDPOptimizerConfig(grad_clip=0.5)
    assert cfg.clip_grad == 0.5
    with pytest.warns(DeprecationWarning, match="optim.grad_clip is deprecated"):
        assert OptimizerConfig(grad_clip=2.0).clip_grad == 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FSDPOptimizerConfig(lr_scheduler_type="cosine", clip_grad=2.0)  # the new keys do not warn
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="conflicts with optim.lr_scheduler_type"):
        FSDPOptimizerConfig(warmup_style="constant", lr_scheduler_type="cosine")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": -1.0}, "optim.lr=-1.0 must be a finite number >= 0"),
        ({"lr": float("nan")}, "optim.lr=nan must be a finite number"),
        ({"lr_warmup_steps_ratio": 1.5}, r"optim.lr_warmup_steps_ratio=1.5 must be a fraction in \[0, 1\]"),
        ({"total_training_steps": 0}, r"optim.total_training_steps=0 must be -1 \(not known yet\) or an integer"),
        ({"weight_decay": -0.1}, "optim.weight_decay=-0.1 must be a number >= 0"),
        ({"lr_warmup_steps": -2}, "optim.lr_warmup_steps=-2 must be -1/null"),
        ({"betas": [0.9]}, r"optim.betas=\[0.9\] must be two numbers in \[0, 1\)"),
        ({"betas": (0.9, 1.0)}, r"optim.betas=\(0.9, 1.0\) must be two numbers"),
        ({"clip_grad": 0}, "optim.clip_grad=0 must be a number > 0"),
        ({"grad_clip": -1.0}, "optim.grad_clip=-1.0 must be a number > 0"),
        ({"optimizer": ""}, "optim.optimizer='' must be a non-empty string"),
        ({"optimizer_impl": None}, "optim.optimizer_impl=None must be a non-empty string"),
        ({"min_lr_ratio": 2.0}, r"optim.min_lr_ratio=2.0 must be a fraction in \[0, 1\] or null"),
        ({"lr_scheduler_type": "linear"}, r"optim.lr_scheduler_type='linear'; use one of \['constant', 'cosine'\]"),
        ({"warmup_style": "wsd"}, r"optim.warmup_style='wsd'; use one of"),
        ({"num_cycles": 0}, "optim.num_cycles=0 must be a number > 0"),
        ({"override_optimizer_config": [1]}, "optim.override_optimizer_config=\\[1\\] must be a mapping"),
    ],
)
def test_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FSDPOptimizerConfig(**kwargs)


def test_base_config_validation_and_all_problems_at_once():
    with pytest.raises(ValueError, match="optim.lr=-1 must be"):
        OptimizerConfig(lr=-1)
    with pytest.raises(ValueError) as info:
        FSDPOptimizerConfig(lr=-1.0, num_cycles=-1, lr_scheduler_type="step")
    assert all(key in str(info.value) for key in ("optim.lr=", "optim.num_cycles=", "optim.lr_scheduler_type="))
