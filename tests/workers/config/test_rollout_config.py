"""RolloutConfig: veRL's keys and defaults, construction from OmegaConf, and every validation error."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from verl.base_config import omega_conf_to_dataclass
from verl.workers.config.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    MultiTurnConfig,
    RolloutConfig,
    SamplingConfig,
)


def test_defaults_follow_verl():
    cfg = RolloutConfig()
    expected = {
        "name": "hf",
        "mode": "async",
        "n": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "do_sample": True,
        "prompt_length": 512,
        "response_length": 512,
        "dtype": "bfloat16",
        "seed": 0,
        "gpu_memory_utilization": 0.5,
        "free_cache_engine": True,
        "enforce_eager": False,
        "tensor_model_parallel_size": 2,
        "max_num_batched_tokens": 8192,
        "max_model_len": None,
        "max_num_seqs": 256,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "load_format": "dummy",
        "logprobs_mode": "processed_logprobs",
        "calculate_log_probs": True,  # veRL 0.10 changed the default
        "over_sample_rate": 0.0,
        "multi_stage_wake_up": False,
        "skip_rollout": False,
        "layered_summon": False,
        "engine_kwargs": {},
    }
    assert {k: cfg[k] for k in expected} == expected
    assert cfg.val_kwargs == SamplingConfig(top_k=-1, top_p=1.0, temperature=0.0, n=1, do_sample=False)
    assert cfg.multi_turn.enable is False and cfg.multi_turn.max_parallel_calls == 1
    assert cfg.multi_turn.max_tool_response_length == 256 and cfg.multi_turn.tool_response_truncate_side == "middle"
    assert cfg.multi_turn.format == "hermes"
    # ours: null = veRL's 8 on a cluster with GPUs, one agent-loop worker per node on CPU (the manager decides)
    assert cfg.agent.num_workers is None and cfg.agent.default_agent_loop == "single_turn_agent"
    assert cfg.checkpoint_engine == CheckpointEngineConfig(
        backend="naive", update_weights_bucket_megabytes=2048, engine_kwargs={}
    )
    assert not cfg.greedy and RolloutConfig(temperature=0).greedy and RolloutConfig(do_sample=False).greedy
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"RolloutConfig\.n is frozen"):
        cfg.n = 4


def test_built_from_omegaconf_with_nested_groups():
    raw = OmegaConf.create(
        {
            "data": {"max_prompt_length": 64, "max_response_length": 32},
            "rollout": {
                "name": "vllm",
                "mode": "sync",
                "n": 5,
                "prompt_length": "${data.max_prompt_length}",
                "response_length": "${data.max_response_length}",
                "val_kwargs": {"temperature": 0.6, "do_sample": True, "n": 4},
                "agent": {"num_workers": 2, "custom_async_server": {"path": "x.py", "name": "Server"}},
                "checkpoint_engine": {"backend": "nccl", "update_weights_bucket_megabytes": 512},
                "engine_kwargs": {"vllm": {"swap_space": 4}},
                "multi_turn": {"enable": True, "max_assistant_turns": 3},
            },
        }
    )
    cfg = omega_conf_to_dataclass(raw.rollout, RolloutConfig)
    assert (cfg.name, cfg.mode, cfg.n, cfg.prompt_length, cfg.response_length) == ("vllm", "sync", 5, 64, 32)
    assert cfg.val_kwargs.temperature == 0.6 and cfg.val_kwargs.n == 4 and cfg.val_kwargs.do_sample
    assert cfg.agent.custom_async_server.name == "Server" and cfg.checkpoint_engine.backend == "nccl"
    assert cfg.engine_kwargs["vllm"]["swap_space"] == 4 and cfg.multi_turn.max_assistant_turns == 3
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['temprature'\]"):
        omega_conf_to_dataclass({"temprature": 0.5}, RolloutConfig)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"name": "trtllm"}, r"rollout.name='trtllm' is not a rollout engine; use one of \['hf', 'vllm', 'sglang'\]"),
        ({"mode": "spmd"}, r"rollout.mode='spmd'; use one of \['sync', 'async'\]"),
        ({"temperature": -0.1}, "rollout.temperature=-0.1 must be a number >= 0"),
        ({"temperature": "hot"}, "rollout.temperature='hot'"),
        ({"top_p": 0.0}, r"rollout.top_p=0.0 must be in \(0, 1\]"),
        ({"top_p": 1.5}, "rollout.top_p=1.5"),
        ({"top_k": -2}, "rollout.top_k=-2 must be -1 or an integer >= 0"),
        ({"top_k": 2.5}, "rollout.top_k=2.5"),
        ({"n": 0}, "rollout.n=0 must be an integer >= 1"),
        ({"do_sample": "yes"}, "rollout.do_sample='yes' must be true or false"),
        ({"free_cache_engine": 1}, "rollout.free_cache_engine=1 must be true or false"),
        ({"prompt_length": 0}, "rollout.prompt_length=0 must be an integer >= 1"),
        ({"response_length": 0}, "rollout.response_length=0 must be an integer >= 1"),
        ({"dtype": "int8"}, r"rollout.dtype='int8'; use one of \['fp32'"),
        ({"seed": 1.5}, "rollout.seed=1.5 must be an integer"),
        ({"gpu_memory_utilization": 0}, r"rollout.gpu_memory_utilization=0 must be in \(0, 1\]"),
        ({"tensor_model_parallel_size": 0}, "rollout.tensor_model_parallel_size=0 must be an integer >= 1"),
        ({"log_prob_micro_batch_size_per_gpu": 0}, "log_prob_micro_batch_size_per_gpu=0 must be an integer >= 1 or"),
        ({"max_model_len": 100}, "rollout.max_model_len=100 is below prompt_length \\+ response_length = 1024"),
        ({"over_sample_rate": 1.0}, r"rollout.over_sample_rate=1.0 must be in \[0, 1\)"),
        ({"engine_kwargs": []}, "rollout.engine_kwargs must be a mapping, got list"),
        ({"val_kwargs": {"n": 2}}, "rollout.val_kwargs must be a SamplingConfig, got dict"),
    ],
)
def test_rollout_config_errors_name_the_key(fields, match):
    with pytest.raises(ValueError, match=match):
        RolloutConfig(**fields)


def test_rollout_accepts_its_value_ranges():
    cfg = RolloutConfig(temperature=0, top_p=1, top_k=0, max_model_len=1024, dtype="fp32", seed=-3)
    assert cfg.top_k == 0 and cfg.greedy
    assert RolloutConfig(name="sglang", top_k=50, top_p=0.5, n=8).n == 8


@pytest.mark.parametrize(
    ("cls", "fields", "match"),
    [
        (SamplingConfig, {"do_sample": True}, r"val_kwargs.do_sample=True requires rollout.val_kwargs.temperature > 0"),
        (SamplingConfig, {"top_p": 0}, r"rollout.val_kwargs.top_p=0 must be in \(0, 1\]"),
        (SamplingConfig, {"n": 0}, "rollout.val_kwargs.n=0"),
        (SamplingConfig, {"do_sample": 1}, "rollout.val_kwargs.do_sample=1 must be true or false"),
        (MultiTurnConfig, {"max_assistant_turns": 0}, "rollout.multi_turn.max_assistant_turns=0"),
        (MultiTurnConfig, {"tool_response_truncate_side": "top"}, "tool_response_truncate_side='top'; use one of"),
        (MultiTurnConfig, {"enable": "on"}, "rollout.multi_turn.enable='on' must be true or false"),
        (AgentLoopConfig, {"num_workers": -1}, "rollout.agent.num_workers=-1 must be an integer >= 0"),
        (AgentLoopConfig, {"default_agent_loop": ""}, "rollout.agent.default_agent_loop='' must name an agent loop"),
        (CheckpointEngineConfig, {"backend": ""}, "rollout.checkpoint_engine.backend='' must name"),
        (CheckpointEngineConfig, {"update_weights_bucket_megabytes": 0}, "update_weights_bucket_megabytes=0"),
        (CheckpointEngineConfig, {"engine_kwargs": None}, "rollout.checkpoint_engine.engine_kwargs must be a mapping"),
    ],
)
def test_nested_config_errors_name_the_key(cls, fields, match):
    with pytest.raises(ValueError, match=match):
        cls(**fields)
    sampled = SamplingConfig(do_sample=True, temperature=0.7, top_k=20)
    assert sampled.do_sample and sampled.top_k == 20
