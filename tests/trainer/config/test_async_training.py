"""``async_training.*``: our defaults (not veRL's fully-async ones), one test per validation error, the rules per
``trainer.mode``, and the derived settings the trainer writes once, before its workers start."""

from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from tests.trainer.config.test_validate import VALID
from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config.async_training import AsyncTrainingConfig
from verl.trainer.config.derived import async_training_config, uses_bypass_mode, with_derived_settings
from verl.trainer.config.validate import ConfigError, base_config, merged, validate_config


def test_our_defaults_turn_nothing_on_that_was_not_asked_for():
    cfg = AsyncTrainingConfig()
    # veRL's fully-async defaults are staleness 0.1, a push every 4 steps, partial rollout and the rollout's
    # log-probs; ours: a one-version bound, a push after every update, no partial rollout, recomputed log-probs
    assert (cfg.max_lag, cfg.staleness_threshold, cfg.trigger_parameter_sync_step) == (1, None, 1)
    assert (cfg.require_batches, cfg.partial_rollout) == (None, False)
    assert (cfg.use_rollout_log_probs, cfg.compute_prox_log_prob, cfg.bypass_old_log_prob) == (False, False, False)
    assert async_training_config(base_config()) == cfg  # the YAML carries the same defaults
    assert async_training_config(OmegaConf.create({})) == cfg  # a config without the section: the defaults


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_lag": -1}, "async_training.max_lag=-1 must be an integer >= 0"),
        ({"max_lag": 1.5}, "async_training.max_lag=1.5 must be an integer"),
        ({"staleness_threshold": -0.1}, "staleness_threshold=-0.1 must be null or a number >= 0"),
        ({"staleness_threshold": 2.0, "max_lag": 1}, "more than async_training.max_lag=1 version"),
        ({"trigger_parameter_sync_step": 0}, "trigger_parameter_sync_step=0 must be an integer >= 1"),
        ({"require_batches": 0}, "require_batches=0 must be null or an integer >= 1"),
        ({"partial_rollout": "yes"}, "async_training.partial_rollout='yes' must be true or false"),
    ],
)
def test_each_bad_value_is_named(fields, message):
    with pytest.raises(ValueError, match=message):
        omega_conf_to_dataclass(OmegaConf.create(fields), AsyncTrainingConfig)


def test_the_bound_may_be_zero_and_a_threshold_within_it_is_accepted():
    assert AsyncTrainingConfig(max_lag=0).max_lag == 0
    assert AsyncTrainingConfig(max_lag=2, staleness_threshold=1.5).staleness_threshold == 1.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["async_training.trigger_parameter_sync_step=4"], "trainer mode sync pushes the weights after every update"),
        (["async_training.partial_rollout=true"], "partial_rollout=true .* with trainer.v1.trainer_mode=sync: only"),
        (["async_training.require_batches=3"], "require_batches=3 × actor_rollout_ref.actor.ppo_mini_batch_size=4"),
        (["async_training.max_lag=-2"], "async_training.max_lag=-2 must be an integer >= 0"),
        (["async_training.bogus=1"], "unknown key 'async_training.bogus'"),
        (
            ["async_training.use_rollout_log_probs=true", "algorithm.adv_estimator=optimal_token_baseline"],
            "needs the old-log-prob pass, which the bypass mode skips",
        ),
    ],
)
def test_validation_refuses_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(merged([*VALID, *overrides]))


def test_sync_says_that_the_bound_has_no_effect(caplog):
    validate_config(merged([*VALID, "async_training.require_batches=2"]))  # 2 × 4 = 8 prompts: agrees
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.validate"):
        validate_config(merged([*VALID, "async_training.max_lag=3", "async_training.staleness_threshold=0.5"]))
    assert (
        "async_training.max_lag=3, async_training.staleness_threshold=0.5: no effect with trainer.v1.trainer_mode=sync"
        in (caplog.text)
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.validate"):
        validate_config(merged(VALID))
    assert "async_training" not in caplog.text


COLOCATE = [*VALID, "trainer.mode=colocate_async"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["async_training.trigger_parameter_sync_step=2"], "trainer mode colocate_async pushes the weights after"),
        (
            ["async_training.partial_rollout=true"],
            "partial_rollout=true .* with trainer.v1.trainer_mode=colocate_async: only",
        ),
        (
            ["actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"],
            "backend='nccl': trainer.v1.trainer_mode=colocate_async",
        ),
        (["reward_model.enable=true"], "reward.reward_model.enable serves reward.reward_model.model_path: set it"),
    ],
)
def test_colocate_async_refuses_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(merged([*COLOCATE, *overrides]))


def test_colocate_async_says_that_the_threshold_has_no_effect(caplog):
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.validate"):
        validate_config(merged([*COLOCATE, "async_training.staleness_threshold=0.5"]))
    assert "staleness_threshold=0.5: no effect with trainer.v1.trainer_mode=colocate_async" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "rollout_is"),
    [
        ([], "token"),  # lag 1 without a correction of the user's: truncated IS per token
        (["async_training.default_rollout_is=sequence"], "sequence"),
        (["async_training.default_rollout_is=null"], None),  # asked to train uncorrected
        (["async_training.max_lag=0"], None),  # lag 0 is on-policy
        (["algorithm.rollout_correction.rollout_rs=token_k1"], None),  # the user's own correction stands
        (["algorithm.rollout_correction.rollout_is=sequence"], "sequence"),
        (["async_training.use_rollout_log_probs=true"], None),  # the bypass loss
    ],
)
def test_colocate_async_corrects_off_policy_samples_unless_told_otherwise(overrides, rollout_is):
    derived = with_derived_settings(merged([*COLOCATE, *overrides]), total_steps=3)
    assert derived.algorithm.rollout_correction.rollout_is == rollout_is
    assert derived.actor_rollout_ref.rollout.checkpoint_engine.backend == "shm"  # the push between processes
    sync = with_derived_settings(merged(VALID), total_steps=3)
    assert sync.algorithm.rollout_correction.rollout_is is None
    assert sync.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"


SEPARATE = [*VALID, "trainer.v1.trainer_mode=separate_async"]  # veRL 0.10's name (COLOCATE: the older one)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["async_training.trigger_parameter_sync_step=2"], "trainer mode separate_async pushes the weights after"),
        (
            ["actor_rollout_ref.rollout.checkpoint_engine.backend=shm"],
            "backend='shm': trainer.v1.trainer_mode=separate_async",
        ),
        (["reward_model.enable=true"], "reward.reward_model.enable=true with trainer.v1.trainer_mode=separate_async"),
        (
            ["algorithm.filter_groups.enable=true"],
            "filter_groups.enable=true with trainer.v1.trainer_mode=separate_async",
        ),
        (["rollout.n_gpus_per_node=0"], "rollout.n_gpus_per_node=0: the rollout servers' pool needs an integer"),
        (["rollout.nnodes=two"], "rollout.nnodes"),
    ],
)
def test_separate_async_refuses_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(merged([*SEPARATE, *overrides]))


def test_separate_async_accepts_verls_separate_pool_keys_and_pushes_over_gloo(caplog):
    verl_style = [*SEPARATE, "actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"]
    validate_config(merged(verl_style))
    validate_config(merged([*verl_style, "async_training.partial_rollout=true"]))
    dapo = ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=seq_reward"]
    validate_config(merged([*verl_style, *dapo, "trainer.v1.sampler.schedule=replay_buffer"]))  # the buffer filters
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config"):
        validate_config(merged([*verl_style, "async_training.partial_rollout=true", "async_training.max_lag=0"]))
    assert "partial_rollout=true: no effect at async_training.max_lag=0" in caplog.text
    derived = with_derived_settings(merged(verl_style), total_steps=3)
    assert derived.actor_rollout_ref.rollout.checkpoint_engine.backend == "gloo"  # naive: the collective push
    assert derived.algorithm.rollout_correction.rollout_is == "token"
    nccl = [*SEPARATE, "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
    assert with_derived_settings(merged(nccl), 3).actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"
    # in the other modes the rollout pool means nothing (said at start-up) and the hybrid engine is the only one
    with caplog.at_level(logging.WARNING, logger="verl.trainer.config.validate"):
        validate_config(merged([*COLOCATE, "rollout.n_gpus_per_node=2"]))
    assert "rollout.n_gpus_per_node=2: no effect with trainer.v1.trainer_mode=colocate_async" in caplog.text
    with pytest.raises(ConfigError, match="hybrid_engine=false with trainer.v1.trainer_mode=colocate_async"):
        validate_config(merged([*COLOCATE, "actor_rollout_ref.hybrid_engine=false"]))


def test_derived_settings_are_written_into_a_copy_once():
    config = merged([*VALID, "async_training.use_rollout_log_probs=true"])
    before = OmegaConf.to_container(config)
    derived = with_derived_settings(config, total_steps=7)
    assert OmegaConf.to_container(config) == before  # the user's config is left as it was
    actor = derived.actor_rollout_ref.actor
    assert actor.optim.total_training_steps == 7 and derived.critic.optim.total_training_steps == 7
    # use_rollout_log_probs is the bypass mode: the actor's loss is the bypass loss with the correction settings
    assert uses_bypass_mode(config) and actor.policy_loss.loss_mode == "bypass_mode"
    assert actor.policy_loss.rollout_correction.bypass_mode is True
    assert actor.policy_loss.rollout_correction.loss_type == config.algorithm.rollout_correction.loss_type
    # a proximal recomputation keeps the old-log-prob pass (decoupled PPO), so no bypass
    prox = merged([*VALID, "async_training.use_rollout_log_probs=true", "async_training.compute_prox_log_prob=true"])
    assert not uses_bypass_mode(prox)
    assert with_derived_settings(prox, 7).actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"
    assert uses_bypass_mode(merged([*VALID, "algorithm.rollout_correction.bypass_mode=true"]))
