"""BaseConfig: assign-once fields, Mapping reads; omega_conf_to_dataclass: nesting, _target_, unknown keys."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from verl.base_config import BaseConfig, ConfigKeyError, omega_conf_to_dataclass


@dataclass
class OptimCfg(BaseConfig):
    lr: float = 1e-6
    betas: tuple = (0.9, 0.999)


@dataclass
class ActorCfg(BaseConfig):
    ppo_mini_batch_size: int = 256
    optim: OptimCfg = field(default_factory=OptimCfg)
    maybe: OptimCfg | None = None
    per_rank_batch: int = field(init=False, default=0)

    def __post_init__(self):
        self.per_rank_batch = self.ppo_mini_batch_size // 2  # derived once, into its own field


def test_fields_are_frozen_after_construction():
    cfg = ActorCfg()
    assert cfg.per_rank_batch == 128
    with pytest.raises(dataclasses.FrozenInstanceError, match="ppo_mini_batch_size is frozen"):
        cfg.ppo_mini_batch_size = 1
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"cannot delete ActorCfg\.optim"):
        del cfg.optim
    assert dataclasses.replace(cfg, ppo_mini_batch_size=8).per_rank_batch == 4


def test_reads_like_a_mapping():
    cfg = ActorCfg()
    assert cfg["ppo_mini_batch_size"] == 256 and cfg.get("missing", 3) == 3 and cfg.get("optim").lr == 1e-6
    assert set(cfg) == {"ppo_mini_batch_size", "optim", "maybe", "per_rank_batch"} and len(cfg) == 4
    assert dict(cfg)["optim"] == OptimCfg()
    with pytest.raises(KeyError, match="'missing'"):
        cfg["missing"]
    assert cfg.to_dict()["optim"] == {"lr": 1e-6, "betas": (0.9, 0.999)}


def test_missing_key_is_both_key_and_attribute_error_and_non_string_keys_are_type_errors():
    cfg = ActorCfg()
    for expected in (KeyError, AttributeError, ConfigKeyError):
        with pytest.raises(expected, match="'nope'"):
            cfg["nope"]
    with pytest.raises(TypeError, match="keys are strings, got int"):
        cfg[123]
    assert cfg.get("nope") is None


def test_public_attribute_set_on_the_instance_reads_by_key_but_private_ones_do_not():
    cfg = BaseConfig()
    cfg.extra = "value"  # assigned once, like a field
    cfg._hidden = 1
    assert cfg["extra"] == "value" and cfg.get("extra") == "value"
    with pytest.raises(KeyError):
        cfg["_hidden"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.extra = "other"


def test_omega_conf_to_dataclass_builds_nested_configs():
    raw = OmegaConf.create({"ppo_mini_batch_size": "${oc.select:bs,16}", "optim": {"lr": 0.1}, "maybe": {"lr": 2.0}})
    cfg = omega_conf_to_dataclass(raw, ActorCfg)
    assert cfg.ppo_mini_batch_size == 16 and cfg.optim == OptimCfg(lr=0.1) and cfg.maybe.lr == 2.0
    assert omega_conf_to_dataclass(cfg) is cfg and omega_conf_to_dataclass(None) is None
    target = OmegaConf.create({"_target_": f"{__name__}.OptimCfg", "lr": 0.5})
    assert omega_conf_to_dataclass(target) == OptimCfg(lr=0.5)


def test_omega_conf_to_dataclass_errors_name_the_key():
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['lrr'\] under 'optim'"):
        omega_conf_to_dataclass({"optim": {"lrr": 1}}, ActorCfg)
    with pytest.raises(TypeError, match="'optim' must be a mapping"):
        omega_conf_to_dataclass({"optim": 3}, ActorCfg)
    with pytest.raises(ValueError, match="_target_"):
        omega_conf_to_dataclass({"lr": 1})
    with pytest.raises(ValueError, match="cannot be imported"):
        omega_conf_to_dataclass({"_target_": "verl.nope.Missing"})
    with pytest.raises(TypeError, match="not a dataclass"):
        omega_conf_to_dataclass({}, dict)
