"""FSDPEngineConfig: veRL's defaults, OmegaConf construction, one test per validation error."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.base_config import omega_conf_to_dataclass
from verl.workers.config.engine import FSDPEngineConfig, canonical_dtype_name


def test_defaults_are_veRLs():
    cfg = FSDPEngineConfig()
    assert cfg.wrap_policy == {"min_num_params": 0}
    assert (cfg.param_offload, cfg.optimizer_offload, cfg.offload_policy) == (False, False, False)
    assert (cfg.reshard_after_forward, cfg.fsdp_size, cfg.forward_prefetch) == (True, -1, False)
    assert (cfg.model_dtype, cfg.dtype, cfg.mixed_precision) == ("fp32", "bfloat16", None)
    assert (cfg.use_orig_params, cfg.seed, cfg.full_determinism) == (False, 42, False)
    assert (cfg.ulysses_sequence_parallel_size, cfg.use_torch_compile) == (1, True)
    assert (cfg.entropy_from_logits_with_chunking, cfg.entropy_checkpointing) == (False, False)
    assert (cfg.forward_only, cfg.strategy) == (False, "fsdp")


def test_built_from_verl_yaml_node():
    # actor_rollout_ref.actor.fsdp_config as veRL's generated ppo_trainer.yaml writes it.
    raw = OmegaConf.create(
        {
            "_target_": "verl.workers.config.FSDPEngineConfig",
            "wrap_policy": {"min_num_params": 0},
            "param_offload": False,
            "optimizer_offload": False,
            "offload_policy": False,
            "reshard_after_forward": True,
            "fsdp_size": -1,
            "forward_prefetch": False,
            "model_dtype": "fp32",
            "use_orig_params": False,
            "seed": 42,
            "full_determinism": False,
            "ulysses_sequence_parallel_size": 1,
            "entropy_from_logits_with_chunking": False,
            "use_torch_compile": True,
            "entropy_checkpointing": False,
            "forward_only": True,
            "strategy": "fsdp2",
            "dtype": "bfloat16",
        }
    )
    cfg = omega_conf_to_dataclass(raw, FSDPEngineConfig)
    assert cfg.strategy == "fsdp2" and cfg.forward_only and cfg["dtype"] == "bfloat16"
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"FSDPEngineConfig\.param_offload is frozen"):
        cfg.param_offload = True


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "megatron"}, r"fsdp_config.strategy='megatron'; use one of \['fsdp', 'fsdp2'\]"),
        ({"model_dtype": "int8"}, r"fsdp_config.model_dtype='int8'; use one of \['fp32', 'float32', 'bf16'"),
        ({"dtype": "half"}, r"fsdp_config.dtype='half'; use one of"),
        ({"param_offload": "yes"}, "fsdp_config.param_offload='yes' must be true or false"),
        ({"forward_only": 1}, "fsdp_config.forward_only=1 must be true or false"),
        ({"fsdp_size": 0}, r"fsdp_config.fsdp_size=0 must be -1 \(all ranks\) or an integer >= 1"),
        ({"seed": 1.5}, "fsdp_config.seed=1.5 must be an integer"),
        ({"ulysses_sequence_parallel_size": 0}, "fsdp_config.ulysses_sequence_parallel_size=0 must be an integer"),
        ({"wrap_policy": [1]}, r"fsdp_config.wrap_policy=\[1\] must be a mapping"),
        ({"wrap_policy": {"policy": 1}}, r"wrap_policy has unknown key\(s\) \['policy'\]; allowed: \['min_num_params'"),
        ({"wrap_policy": {"min_num_params": -1}}, "wrap_policy.min_num_params=-1 must be an integer >= 0"),
        ({"wrap_policy": {"transformer_layer_cls_to_wrap": 3}}, "transformer_layer_cls_to_wrap=3 must be a class name"),
        ({"wrap_policy": {"disable": "no"}}, "wrap_policy.disable='no' must be true or false"),
        ({"wrap_policy": {"layer_class": 3}}, "wrap_policy.layer_class=3 must be a class name"),
        (
            {"wrap_policy": {"layer_class": "A", "transformer_layer_cls_to_wrap": ["B"]}},
            r"wrap_policy.layer_class='A' disagrees with fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=\['B'\]",
        ),
        ({"mixed_precision": "bf16"}, "fsdp_config.mixed_precision='bf16' must be a mapping"),
        ({"mixed_precision": {"keep_low": 1}}, r"mixed_precision has unknown key\(s\) \['keep_low'\]"),
        ({"mixed_precision": {"param_dtype": "fp8"}}, "fsdp_config.mixed_precision.param_dtype='fp8'; use one of"),
        (
            {"mixed_precision": {"cast_forward_inputs": 0}},
            "mixed_precision.cast_forward_inputs=0 must be true or false",
        ),
    ],
)
def test_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FSDPEngineConfig(**kwargs)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ValueError) as info:
        FSDPEngineConfig(strategy="ddp", dtype="int4", fsdp_size=0)
    assert all(key in str(info.value) for key in ("strategy='ddp'", "dtype='int4'", "fsdp_size=0"))


def test_canonical_dtype_name():
    assert [canonical_dtype_name(n) for n in ("fp32", "bf16", "float16")] == ["float32", "bfloat16", "float16"]
    with pytest.raises(ValueError, match=r"unknown dtype 'fp64'; use one of \['fp32'"):
        canonical_dtype_name("fp64")
