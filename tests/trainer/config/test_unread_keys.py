"""Nothing accepted is silently ignored: every key of the unread table warns or is refused when set, and the named
start-up checks (rollout mode, agent loops, engine limits, local paths, external modules, profiler) name the key."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from omegaconf import OmegaConf

from tests.trainer.config.test_validate import VALID
from verl.trainer.config import unread
from verl.trainer.config.validate import ConfigError, base_config, merged, validate_config

MEGATRON_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
# Values away from the default for leaves whose default (null, a string, a list, a mapping) suggests none.
AWAY: dict[str, Any] = {
    **{
        f"{role}.profiler.tool": "torch"
        for role in (
            "actor_rollout_ref.actor",
            "actor_rollout_ref.ref",
            "actor_rollout_ref.rollout",
            "critic",
            "reward_model",
        )
    },
    **{
        f"{role}.profiler.tool_config.npu.contents": ["npu"]
        for role in ("actor_rollout_ref.actor", "critic", "reward_model")
    },
    "data.tokenizer": "/tmp/tokenizer",
    "data.image_key": "pictures",
    "data.video_key": "clips",
    "actor_rollout_ref.model.hf_config_path": "/tmp/hf_config",
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "triton",
    "actor_rollout_ref.model.mtp": {"enable": True},
    "actor_rollout_ref.actor.use_fused_kernels": True,
    "actor_rollout_ref.actor.checkpoint.load_contents": ["model"],
    "critic.checkpoint.load_contents": ["model"],
    "actor_rollout_ref.actor.router_replay.mode": "R2",
    "actor_rollout_ref.rollout.max_model_len": 4096,
    "actor_rollout_ref.rollout.load_format": "auto",
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": [1, 2, 4],
    "actor_rollout_ref.rollout.scheduling_policy": "priority",
    "actor_rollout_ref.rollout.logprobs_mode": "raw_logprobs",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": 8,
    "actor_rollout_ref.rollout.quantization": "fp8",
    "actor_rollout_ref.rollout.quantization_config_file": "/tmp/quant.json",
    "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": "off",
    "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts": 2,
    "actor_rollout_ref.rollout.agent.custom_async_server.path": "/tmp/server.py",
    "actor_rollout_ref.rollout.mtp": {"enable": True},
    "reward_model.strategy": "megatron",
    "reward_model.model.input_tokenizer": "/tmp/policy_tokenizer",
    "reward_model.model.override_config": {"attention_dropout": 0.1},
    "reward_model.micro_batch_size": 8,
    "reward_model.max_length": 2048,
    "reward_model.reward_loop_source": "importlib",
    "reward_model.reward_loop_module_path": "/tmp/loop.py",
    "reward_model.reward_loop_class_name": "MyLoop",
    "reward.sandbox_fusion.url": "http://localhost:8080/run_code",
    "trainer.v1.sync": {"anything": 1},
    "trainer.profile_steps": [1, 2],
    "trainer.use_legacy_worker_impl": "disable",
    "ray_kwargs.timeline_json_file": "/tmp/timeline.json",
    "actor_rollout_ref.ref.model": {"path": "/tmp/ref_model"},
    "global_profiler.global_tool_config.nsys.discrete": True,
    **{f"{role}.megatron.dist_checkpointing_path": "/tmp/dist_ckpt" for role in MEGATRON_ROLES},
    **{f"{role}.megatron.dist_checkpointing_prefix": "model." for role in MEGATRON_ROLES},
}


def away(leaf: str) -> Any:
    """A value of the right type that differs from ``leaf``'s default."""
    if leaf in AWAY:
        return AWAY[leaf]
    default = OmegaConf.select(_base(leaf), leaf)
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default + 0.25
    raise AssertionError(f"add a value for {leaf} (default {default!r}) to AWAY")


ENTRIES = list(unread.UNREAD)
BASE = base_config()
MEGATRON = base_config(["model_engine=megatron"])  # the Megatron roles' engine blocks live in this config only


def _megatron(key: str) -> bool:
    return ".megatron." in key


def _base(key: str):
    return MEGATRON if _megatron(key) else BASE


def test_the_table_is_well_formed():
    keys = [e.key for e in ENTRIES]
    assert len(keys) == len(set(keys)), "a key is listed twice"
    assert all(e.consequence in ("warn", "error") and e.why for e in ENTRIES)
    assert {e.consequence for e in ENTRIES} == {"warn", "error"}
    assert all(unread.leaves_of(e, _base(e.key)) for e in ENTRIES), (
        "an entry judges no leaf (a more specific one covers all)"
    )


@pytest.mark.parametrize(
    "key",
    [
        "actor_rollout_ref.model.external_lib",
        "critic.model.external_lib",
        "reward_model.model.external_lib",
        "custom_reward_function.reward_kwargs",
        "reward_model.reward_kwargs",
        "global_profiler.tool",
        "global_profiler.steps",
        "global_profiler.save_path",
        "global_profiler.profile_continuous_steps",
        *(
            f"{role}.profiler.{key}"
            for role in ("actor_rollout_ref.actor", "critic", "reward_model")
            for key in ("enable", "all_ranks", "ranks", "save_path")
        ),
        "actor_rollout_ref.rollout.mode",
        "actor_rollout_ref.model.custom_chat_template",
        "reward_model.enable_resource_pool",
        "actor_rollout_ref.rollout.skip_rollout",
        "actor_rollout_ref.rollout.skip_dump_dir",
    ],
)
def test_keys_acted_on_are_not_in_the_table(key):
    assert unread.covering(key) is None


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.key for e in ENTRIES])
def test_every_unread_key_warns_or_is_refused_when_set(entry, caplog):
    leaf = unread.leaves_of(entry, _base(entry.key))[0]
    value = away(leaf)
    config = merged([*VALID, "model_engine=megatron"] if _megatron(entry.key) else VALID)
    if entry.engine:
        OmegaConf.update(config, "actor_rollout_ref.rollout.name", entry.engine)
    OmegaConf.update(config, leaf, value, merge=False)
    shown = f"{leaf}={OmegaConf.to_container(OmegaConf.create({'v': value}))['v']!r}"
    with caplog.at_level(logging.WARNING):
        if entry.consequence == "error":
            with pytest.raises(ConfigError) as info:
                validate_config(config, check_environment=False)
            ours = [p for p in info.value.problems if p.startswith(shown) and entry.why in p]
            assert ours, f"no problem names {shown} ({entry.why}): {info.value.problems}"
            assert "leave it at" in ours[0]
        else:  # harmless: the config stays valid, a warning names key, value and why
            validate_config(config, check_environment=False)
            assert f"{shown} has no effect here: {entry.why}" in caplog.text


def test_a_default_that_follows_another_key_is_not_reported(caplog):
    with caplog.at_level(logging.WARNING):
        validate_config(merged([*VALID, "actor_rollout_ref.model.use_fused_kernels=true"]), check_environment=False)
    assert "actor_rollout_ref.model.use_fused_kernels=True has no effect here" in caplog.text
    assert "reward_model.model.use_fused_kernels" not in caplog.text  # ${actor_rollout_ref.model.use_fused_kernels}


def test_harmless_values_and_defaults_are_quiet(caplog):
    with caplog.at_level(logging.WARNING):
        validate_config(
            merged(
                [*VALID, "reward_model.model.input_tokenizer=null", "actor_rollout_ref.rollout.agent.num_workers=8"]
            ),
            check_environment=False,
        )
    assert "has no effect here" not in caplog.text


# ------------------------------------------------------------------------------------------------ named checks
def problems_of(overrides: list[str], check_environment: bool = False) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate_config(merged([*VALID, *overrides]), check_environment=check_environment)
    return info.value.problems


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_rollout_mode_async_and_sync_pass(mode):
    validate_config(merged([*VALID, f"actor_rollout_ref.rollout.mode={mode}"]), check_environment=False)


def test_another_rollout_mode_is_one_problem_naming_the_key():
    problems = problems_of(["actor_rollout_ref.rollout.mode=spmd", "actor_rollout_ref.rollout.temperature=-1"])
    mode = [p for p in problems if "mode" in p]
    assert len(mode) == 1 and mode[0].startswith("actor_rollout_ref.rollout.mode='spmd'"), problems
    assert "async (veRL's default) or sync" in mode[0]
    assert any("temperature=-1" in p for p in problems), "the rest of the rollout section is still checked"


def test_agent_keys_are_read_and_checked(tmp_path):
    agent = "actor_rollout_ref.rollout.agent"
    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: mine\n  _target_: my_agents.Mine\n")
    accepted = [
        f"{agent}.num_workers=2",
        f"{agent}.agent_loop_config_path={loops}",
        f"{agent}.default_agent_loop=mine",
        f"{agent}.agent_loop_manager_class=my.Manager",
    ]
    validate_config(merged([*VALID, *accepted]), check_environment=False)
    (problem,) = [p for p in problems_of([f"{agent}.default_agent_loop=react_agent"]) if p.startswith(agent)]
    assert "default_agent_loop='react_agent': no agent loop of that name" in problem and "single_turn_agent" in problem
    (problem,) = problems_of([f"{agent}.agent_loop_config_path={tmp_path}/gone.yaml"], check_environment=True)
    assert problem.endswith("gone.yaml': no such file")
    (problem,) = [p for p in problems_of([f"{agent}.custom_async_server.path=/tmp/server.py"]) if p.startswith(agent)]
    assert "custom rollout server classes are not supported" in problem


def test_vllm_with_tensor_parallel_two_is_refused_before_ray_starts():
    problems = problems_of(
        ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    )
    (problem,) = [p for p in problems if "tensor_model_parallel_size" in p]
    assert "actor_rollout_ref.rollout.name=vllm" in problem
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2" in problem
    assert problem.endswith("set actor_rollout_ref.rollout.tensor_model_parallel_size=1")


def test_vllm_with_tensor_parallel_one_passes():
    validate_config(merged([*VALID, "actor_rollout_ref.rollout.name=vllm"]), check_environment=False)


def test_hf_ignores_tensor_parallel_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        validate_config(
            merged([*VALID, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]), check_environment=False
        )
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2 has no effect here: the hf engine" in caplog.text


def test_a_missing_local_model_path_is_no_such_directory(tmp_path):
    missing = tmp_path / "no-model"
    problems = problems_of(
        [f"actor_rollout_ref.model.path={missing}", "actor_rollout_ref.model.tokenizer_path=./no-tokenizer-here"],
        check_environment=True,
    )
    assert f"actor_rollout_ref.model.path='{missing}': no such directory" in "\n".join(problems)
    assert "actor_rollout_ref.model.tokenizer_path='./no-tokenizer-here': no such directory" in "\n".join(problems)
    assert not any(p.startswith("critic.model.path") for p in problems), "the critic's follows the actor's: once"


def test_home_relative_model_paths_are_expanded(tmp_path, monkeypatch):
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    validate_config(merged([*VALID, "actor_rollout_ref.model.path=~/models/tiny"]), check_environment=True)
    problems = problems_of(["actor_rollout_ref.model.path=~/models/gone"], check_environment=True)
    assert any(p.startswith("actor_rollout_ref.model.path='~/models/gone': no such directory") for p in problems)


def test_hub_ids_are_left_to_the_loader():
    validate_config(merged([*VALID, "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"]), check_environment=True)


def test_critic_and_reward_model_paths_are_checked_when_they_run(tmp_path):
    gone = tmp_path / "gone"
    overrides = [f"critic.model.path={gone}/critic", f"reward_model.model.path={gone}/rm"]
    validate_config(
        merged([*VALID, *overrides, "algorithm.adv_estimator=grpo", "critic.enable=false"]), check_environment=True
    )  # neither runs
    problems = problems_of([*overrides, "reward_model.enable=true"], check_environment=True)
    assert any(p.startswith(f"critic.model.path='{gone}/critic': no such directory") for p in problems)
    assert any(p.startswith(f"reward_model.model.path='{gone}/rm': no such directory") for p in problems)


def test_a_missing_external_lib_names_the_module():
    problems = problems_of(["actor_rollout_ref.model.external_lib=no_such_pkg.models"], check_environment=True)
    (problem,) = [p for p in problems if "external_lib" in p]
    assert problem.startswith("actor_rollout_ref.model.external_lib='no_such_pkg.models'")
    assert "no module named 'no_such_pkg.models'" in problem
    # the reward model's follows the actor's (an interpolation): one problem, not two
    problems = problems_of(
        ["actor_rollout_ref.model.external_lib=no_such_pkg", "reward_model.enable=true"], check_environment=True
    )
    assert len([p for p in problems if "external_lib" in p]) == 1


def test_an_importable_external_lib_passes():
    validate_config(merged([*VALID, "actor_rollout_ref.model.external_lib=json"]), check_environment=True)
    validate_config(
        merged([*VALID, "actor_rollout_ref.model.external_lib=[json,email.parser]"]), check_environment=True
    )
    problems = problems_of(["critic.model.external_lib=[json,missing_critic_lib]"], check_environment=True)
    assert any("critic.model.external_lib='missing_critic_lib': no module named" in p for p in problems)


@pytest.mark.parametrize("tool", ["nsys", "npu", "torch_memory"])
def test_profiler_tools_other_than_torch_are_refused(tool):
    (problem,) = problems_of([f"global_profiler.tool={tool}"])
    assert problem.startswith(f"global_profiler.tool='{tool}'") and "only tool=torch is available here" in problem


def test_the_torch_profiler_passes():
    validate_config(
        merged([*VALID, "global_profiler.tool=torch", "global_profiler.steps=[1,3]"]), check_environment=False
    )


def test_several_problems_are_reported_at_once(tmp_path):
    problems = problems_of(
        [
            "actor_rollout_ref.rollout.mode=spmd",
            "actor_rollout_ref.rollout.agent.default_agent_loop=react_agent",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "actor_rollout_ref.model.lora_adapter_path=/tmp/lora",
            "global_profiler.tool=nsys",
            f"actor_rollout_ref.model.path={tmp_path}/gone",
            "actor_rollout_ref.model.external_lib=no_such_pkg",
        ],
        check_environment=True,
    )
    starts = (
        "actor_rollout_ref.rollout.mode=",
        "actor_rollout_ref.rollout.agent.default_agent_loop=",
        "actor_rollout_ref.rollout.name=vllm with",
        "actor_rollout_ref.model.lora_adapter_path=",
        "global_profiler.tool=",
        "actor_rollout_ref.model.path=",
        "actor_rollout_ref.model.external_lib=",
    )
    missing = [s for s in starts if not any(p.startswith(s) for p in problems)]
    assert not missing, problems
