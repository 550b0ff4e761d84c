"""veRL 0.10's layout (``trainer.use_v1`` / ``trainer.v1.*``, ``reward.*``, ``model_engine``, ``skip.*``,
``transfer_queue.*``, ``distillation.*``) and the older one both validate; each renamed setting is read under its
newer name, a run may not give one setting two values, and what is not built yet is refused by name."""

from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from tests.trainer.config.test_validate import VALID
from verl.trainer.config.compose import compose_config
from verl.trainer.config.layout import resolve_layout, rollout_pool, trainer_mode
from verl.trainer.config.validate import ConfigError, base_config, merged, rollout_pool_size, validate_config


def resolved(*overrides: str):
    return resolve_layout(merged([*VALID, *overrides]))


def test_the_base_config_is_veRL_0_10s():
    cfg = base_config()
    assert cfg.trainer.use_v1 is True and cfg.trainer.v1.trainer_mode == "sync" and cfg.model_engine == "dp"
    assert (
        cfg.trainer.v1.separate_async.parameter_sync_step == 4 and cfg.trainer.v1.sampler.max_off_policy_threshold == 8
    )
    assert cfg.reward.reward_manager.name == "naive" and cfg.reward.custom_reward_function.name == "compute_score"
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True  # veRL 0.10's silent default change
    assert cfg.actor_rollout_ref.rollout.nnodes == 0 and cfg.skip.rollout.enable is False
    assert cfg.distillation.enabled is False and cfg.transfer_queue.enable is False
    assert "gdpo_reward_keys" not in cfg.algorithm  # veRL's scripts add it with `+`


@pytest.mark.parametrize("spelling", ["trainer.v1.trainer_mode", "trainer.mode"])
def test_the_mode_under_either_name(spelling, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.layout"):
        cfg = resolved(f"{spelling}=colocate_async")
    assert trainer_mode(cfg) == "colocate_async" and cfg.trainer.mode == cfg.trainer.v1.trainer_mode
    older = "trainer.mode='colocate_async' is veRL's older name of trainer.v1.trainer_mode"
    assert (older in caplog.text) == (spelling == "trainer.mode")
    validate_config(merged([*VALID, f"{spelling}=colocate_async"]))
    resolve_layout(cfg)  # a second pass (the trainer's) finds nothing to do and no conflict


def test_one_setting_given_two_values_is_refused_naming_both():
    with pytest.raises(ConfigError, match="trainer.mode='separate_async' and trainer.v1.trainer_mode='colocate_async'"):
        resolved("trainer.mode=separate_async", "trainer.v1.trainer_mode=colocate_async")
    with pytest.raises(ConfigError, match="custom_reward_function.path='/a.py' and reward.custom_reward_function.path"):
        validate_config(
            merged([*VALID, "custom_reward_function.path=/a.py", "reward.custom_reward_function.path=/b.py"])
        )
    resolved("trainer.mode=separate_async", "trainer.v1.trainer_mode=separate_async")  # agreeing: fine


def test_older_reward_keys_are_read_into_reward_and_kept_for_old_code(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.layout"):
        cfg = resolved(
            "reward_model.reward_manager=dapo",
            "custom_reward_function.path=/my/reward.py",
            "reward_model.reward_kwargs.scale=2",
            "reward_model.overlong_buffer.enable=true",
            "reward_model.overlong_buffer.len=4",
            "reward_model.timeout_s=5",
            "reward_model.num_workers=0",
        )
    reward = cfg.reward
    assert reward.reward_manager.name == "dapo" and reward.custom_reward_function.path == "/my/reward.py"
    assert reward.reward_kwargs.scale == 2 and reward.timeout_s == 5 and reward.num_workers == 0
    assert reward.reward_kwargs.overlong_buffer_cfg == {"enable": True, "len": 4, "penalty_factor": 0.0, "log": False}
    for older in ("reward_model.reward_manager", "custom_reward_function.path", "reward_model.overlong_buffer"):
        assert f"{older}=" in caplog.text  # each named in a warning
    # code written for the older layout (a recipe's main) still reads them
    assert cfg.reward_model.reward_manager == "dapo" and cfg.reward_model.reward_kwargs.scale == 2


def test_newer_reward_keys_are_mirrored_into_the_older_names():
    cfg = resolved("reward.reward_model.enable=true", "reward.reward_model.model_path=/rm", "reward.num_workers=3")
    assert (
        cfg.reward_model.enable is True and cfg.reward_model.model.path == "/rm" and cfg.reward_model.num_workers == 3
    )


def test_the_rollout_pool_under_either_name(caplog):
    new = resolved(
        "trainer.v1.trainer_mode=separate_async",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=2",
    )
    assert rollout_pool(new) == (1, 2) and rollout_pool_size(new) == 2 and new.rollout.n_gpus_per_node == 2
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.layout"):
        old = resolved("trainer.mode=separate_async", "rollout.n_gpus_per_node=3")
    assert rollout_pool(old) == (1, 3) and old.actor_rollout_ref.rollout.n_gpus_per_node == 3
    assert "older names of actor_rollout_ref.rollout.nnodes/n_gpus_per_node" in caplog.text
    assert rollout_pool(resolved("trainer.mode=separate_async")) == (1, 1)  # neither given: one server
    with pytest.raises(ConfigError, match="size one pool under two names"):
        resolved("rollout.n_gpus_per_node=3", "actor_rollout_ref.rollout.nnodes=1")
    # a size without nodes would leave the pool at one server: refused in separate_async, said elsewhere
    with pytest.raises(
        ConfigError, match=r"n_gpus_per_node=3 sizes the standalone rollout pool only with .*nnodes > 0"
    ):
        resolved("trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.n_gpus_per_node=3")
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.layout"):
        resolved("actor_rollout_ref.rollout.n_gpus_per_node=3")
    assert "no effect with trainer.v1.trainer_mode=sync" in caplog.text


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.v1.sampler.schedule=lifo", r"schedule='lifo'; use one of \('fixed_lag', 'replay_buffer'\)"),
        ("trainer.v1.sampler.sync_refill_failed_groups=true", "sync_refill_failed_groups: read by the replay buffer"),
        ("trainer.v1.sampler.custom_sampler.path=/tmp/s.py", "custom_sampler.path: read by the replay buffer, which"),
        (
            "trainer.v1.separate_async.hybrid_rollout.enable_switch=true",
            r"enable_switch=true: the training workers' engines are lent to generation in .*separate_async under",
        ),
        (
            "distillation.enabled=true",
            r"the teacher pool distillation.n_gpus_per_node=8 × distillation.nnodes=0 is empty",
        ),
        ("skip.rollout.enable=true", "skip.rollout.enable=True: veRL 0.10's rollout caching is not built"),
    ],
)
def test_what_is_not_built_yet_is_refused_by_name(override, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(merged([*VALID, override]))


def test_an_engine_that_is_not_here_is_named_with_the_ones_that_are():
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match=r"model_engine/veomni(.|\n)*dp(.|\n)*megatron"):
        merged([*VALID, "model_engine=veomni"])


def test_harmless_keys_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.unread"):
        validate_config(merged([*VALID, "transfer_queue.enable=true", "trainer.use_v1=false"]))
    assert "transfer_queue.enable=True has no effect here: there is no transfer queue" in caplog.text


def test_veRLs_plus_keys_and_new_algorithm_keys_validate():
    plus = ("+algorithm.gdpo_reward_keys=[accuracy,format]", "+algorithm.gdpo_reward_weights=[1.0,0.5]")
    composed = compose_config("ppo_trainer", plus)  # Hydra takes veRL's `+` (the YAML does not have the keys)
    new = [
        "algorithm.adv_estimator=gdpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=dro",
        "actor_rollout_ref.actor.policy_loss.dro_beta=0.1",
        "actor_rollout_ref.actor.loss_agg_mode=token-sum",
    ]
    validate_config(OmegaConf.merge(composed, merged([*VALID, *new])))
    with pytest.raises(ConfigError, match="adv_estimator=gdpo needs algorithm.gdpo_reward_keys"):
        validate_config(merged([*VALID, "algorithm.adv_estimator=gdpo"]))
    with pytest.raises(ConfigError, match="dro_beta=None must be a number > 0 with loss_mode=dro"):
        validate_config(merged([*VALID, "actor_rollout_ref.actor.policy_loss.loss_mode=dro"]))
    assert OmegaConf.select(base_config(), "actor_rollout_ref.actor.policy_loss.dro_beta", default=1) is None


def test_the_critics_engine_block_under_either_name():
    from verl.workers.config import CriticConfig, FSDPEngineConfig
    from verl.workers.config.critic import CriticModelConfig

    new = resolved("critic.fsdp.param_offload=true")
    old = resolved("critic.model.fsdp_config.param_offload=true")
    assert new.critic.fsdp.param_offload and new.critic.model.fsdp_config.param_offload  # mirrored
    assert old.critic.fsdp.param_offload
    assert base_config().critic.model.use_remove_padding is True  # veRL 0.10's default
    # a worker config built directly (a fork's CriticWorker(config=...)): the older block is used when fsdp is unset
    older = CriticConfig(model=CriticModelConfig(fsdp_config=FSDPEngineConfig(param_offload=True)))
    assert older.fsdp_engine.param_offload is True
    assert CriticConfig(fsdp=FSDPEngineConfig(param_offload=True)).fsdp_engine.param_offload is True
    with pytest.raises(ValueError, match="critic.fsdp and critic.model.fsdp_config"):
        CriticConfig(
            fsdp=FSDPEngineConfig(param_offload=True),
            model=CriticModelConfig(fsdp_config=FSDPEngineConfig(optimizer_offload=True)),
        )


def test_filter_groups_keys_under_either_generations_override_syntax():
    from verl.trainer.main_ppo import upsert_existing_plus_overrides

    base = base_config()
    early = ["+algorithm.filter_groups.enable=True", "+algorithm.filter_groups.metric=acc", "+trainer.my_key=1"]
    assert upsert_existing_plus_overrides(early, base) == [
        "++algorithm.filter_groups.enable=True",  # veRL 0.10 declares it: set, not add
        "++algorithm.filter_groups.metric=acc",
        "+trainer.my_key=1",  # a key of the user's own stays an addition
    ]
    new = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"]  # veRL 0.10's spelling
    for overrides in (new, upsert_existing_plus_overrides(early[:2], base)):
        composed = compose_config("ppo_trainer", tuple(overrides))
        assert composed.algorithm.filter_groups.enable is True and composed.algorithm.filter_groups.metric == "acc"


def test_print_cfg_prints_the_composed_config_under_the_newer_names():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "scripts/print_cfg.py", "trainer.mode=colocate_async"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    yaml = "\n".join(line for line in out.stdout.splitlines() if not line.startswith("["))  # Hydra's log lines
    printed = OmegaConf.create(yaml)
    assert printed.trainer.v1.trainer_mode == "colocate_async" and "profiler" in printed.critic


def test_lora_target_modules_of_the_wrong_type_are_refused_even_without_lora():
    from verl.workers.config import HFModelConfig

    with pytest.raises(TypeError, match=r"target_modules=\[1, 2, 3\] must be"):
        HFModelConfig(path="/m", target_modules=[1, 2, 3])


SEPARATE_V1 = ["trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.nnodes=1"]


def test_veRLs_async_keys_under_the_fixed_lag(caplog):
    """num_warmup_batches is the fixed lag (async_training.max_lag) under either name; the staleness threshold bounds
    it; parameter_sync_step, when set, is checked against the batch sizes (8 prompts in mini-batches of 4: 2)."""
    with caplog.at_level(logging.INFO, logger="verl.trainer.config"):
        cfg = resolved("trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=2")
        assert cfg.async_training.max_lag == 2
        cfg = resolved(*SEPARATE_V1, "async_training.max_lag=0")  # ours, written back to veRL's name
        assert cfg.trainer.v1.separate_async.num_warmup_batches == 0
        validate_config(merged([*VALID, *SEPARATE_V1, "trainer.v1.separate_async.parameter_sync_step=2"]))
        validate_config(merged([*VALID, "trainer.mode=separate_async"]))  # the older layout: default 4 not checked
        validate_config(
            merged([*VALID, "trainer.mode=colocate_async", "trainer.v1.sampler.max_off_policy_strategy=wait"])
        )
        resolved("trainer.v1.separate_async.num_warmup_batches=3")  # sync: no effect, said
    assert "parameter_sync_step=2: the step's mini-batches train one after another once its whole batch" in caplog.text
    assert "under the fixed lag no group reaches the threshold, so drop and wait act alike" in caplog.text
    assert "separate_async.num_warmup_batches=3: no effect with trainer.v1.trainer_mode=sync" in caplog.text
    with pytest.raises(ConfigError, match="are one setting under two names"):
        resolved(
            "trainer.mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=2", "async_training.max_lag=3"
        )
    with pytest.raises(
        ConfigError,
        match=r"max_lag=8 .* at age 9, beyond trainer.v1.sampler.max_off_policy_threshold=8, and the fixed lag evicts",
    ):
        validate_config(merged([*VALID, *SEPARATE_V1, "trainer.v1.separate_async.num_warmup_batches=8"]))
    with pytest.raises(
        ConfigError, match=r"parameter_sync_step=3: .*train_batch_size=8 .*mini_batch_size=4 .*here 2 optimizer"
    ):
        validate_config(merged([*VALID, *SEPARATE_V1, "trainer.v1.separate_async.parameter_sync_step=3"]))
    with caplog.at_level(logging.INFO, logger="verl.trainer.config"):  # veRL's streaming under veRL's schedule
        streamed = ["trainer.v1.sampler.schedule=replay_buffer", "trainer.v1.separate_async.parameter_sync_step=2"]
        validate_config(merged([*VALID, *SEPARATE_V1, *streamed]))
    assert "parameter_sync_step=2: each mini-batch trains as it is sampled, on the step's π_old" in caplog.text
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config"):
        refill = ["trainer.v1.sampler.schedule=replay_buffer", "trainer.v1.sampler.sync_refill_failed_groups=true"]
        validate_config(merged([*VALID, *refill]))  # sync: replaces the groups that failed wholly
        validate_config(merged([*VALID, *SEPARATE_V1, *refill]))
    assert "sync_refill_failed_groups=true: no effect in separate_async, whose buffer evicts and refills" in caplog.text
    with pytest.raises(
        ConfigError, match=r"separate_async.num_warmup_batches\) .* age 2, beyond .*threshold=1, .*wait"
    ):
        stale = ["trainer.v1.sampler.max_off_policy_strategy=wait", "trainer.v1.sampler.max_off_policy_threshold=1"]
        validate_config(merged([*VALID, *SEPARATE_V1, "trainer.v1.sampler.schedule=replay_buffer", *stale]))
    validate_config(merged([*VALID, "trainer.mode=colocate_async", "trainer.v1.sampler.schedule=replay_buffer"]))
    wait = ["trainer.v1.sampler.max_off_policy_strategy=wait", "trainer.v1.sampler.max_off_policy_threshold=2"]
    with pytest.raises(
        ConfigError,
        match=r"max_lag=2 \(trainer.v1.colocate_async.num_warmup_batches\) .* age 3, beyond .*threshold=2, and .*wait",
    ):
        buffer = ["trainer.v1.sampler.schedule=replay_buffer", "trainer.v1.colocate_async.num_warmup_batches=2"]
        validate_config(merged([*VALID, "trainer.mode=colocate_async", *buffer, *wait]))
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config"):
        dapo = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=acc"]
        validate_config(
            merged(
                [
                    *VALID,
                    *dapo,
                    "algorithm.filter_groups.max_num_gen_batches=5",
                    "trainer.v1.sampler.schedule=replay_buffer",
                ]
            )
        )
        validate_config(merged([*VALID, *dapo, "algorithm.filter_groups.max_inflight_gen_batches=2"]))
    assert "max_num_gen_batches=5: no effect under trainer.v1.sampler.schedule=replay_buffer" in caplog.text
    assert "max_inflight_gen_batches=2: no effect under trainer.v1.sampler.schedule=fixed_lag" in caplog.text
    with pytest.raises(ConfigError, match=r"max_off_policy_strategy='evict'; use one of \('drop', 'wait'\)"):
        validate_config(merged([*VALID, "trainer.v1.sampler.max_off_policy_strategy=evict"]))
