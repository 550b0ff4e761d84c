"""veRL 0.10's V1 trainer keys under this project's schedule, checked with the rest of the config by
:func:`verl.trainer.config.validate.validate_config`.

``trainer.v1.sampler.schedule`` (this project's key) names how the async modes choose what each step trains.
``fixed_lag`` (the default) generates ``async_training.max_lag`` batches ahead, each from one weight version, and
trains them in order: reproducible, and at lag 0 the sync run step for step. ``replay_buffer`` is veRL's own
schedule, a replay buffer that samples finished groups and evicts the filtered and the stale
(:mod:`verl.trainer.ppo.v1.replay_buffer`): in the sync mode (:mod:`verl.trainer.ppo.replay_batches`) and
``colocate_async`` (:mod:`verl.trainer.ppo.colocate_replay`) it differs from ``fixed_lag`` only when groups are
evicted (DAPO's filter; staleness past the threshold); in ``separate_async`` (:mod:`verl.trainer.ppo.separate_replay`)
it also streams each step one mini-batch at a time. Under ``fixed_lag`` veRL's keys mean:

- ``trainer.v1.<mode>.num_warmup_batches``: the batches generated ahead, i.e. ``async_training.max_lag`` (one
  setting, two names: :func:`verl.trainer.config.layout.resolve_layout`).
- ``trainer.v1.sampler.max_off_policy_threshold``: the oldest group trained, in model versions (a group generated
  L versions back has age L + 1). The fixed lag is checked against it at start-up, so no group ever passes it and
  ``max_off_policy_strategy`` (``drop`` / ``wait``) never has to act.
- ``trainer.v1.separate_async.parameter_sync_step``: optimizer steps per weight push. Each step trains
  ``data.train_batch_size`` prompts in mini-batches of ``ppo_mini_batch_size`` and pushes once, with one π_old for
  all of them, so when set it must equal their ratio (veRL's rule). Under ``fixed_lag`` the mini-batches train once
  the whole batch is generated; under ``replay_buffer`` each trains as it is sampled, as veRL's (start-up says
  which). Left at its default it is not checked: the batch sizes of a script written for the older layout decide
  alone.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.trainer.config.derived import ASYNC_MODES, async_training_config

__all__ = ["SCHEDULES", "STRATEGIES", "check_v1_trainer"]

logger = logging.getLogger(__name__)

SCHEDULES = ("fixed_lag", "replay_buffer")
STRATEGIES = ("drop", "wait")
SAMPLER = "trainer.v1.sampler"
FILTER = "algorithm.filter_groups"


def _int_at_least(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def check_v1_trainer(
    config: Any,
    mode: str,
    problems: list[str],
    parameter_sync_step_set: bool = True,
    check_environment: bool = True,
) -> None:
    """``trainer.v1.sampler.*`` and ``trainer.v1.separate_async.parameter_sync_step`` against the run's schedule
    ``mode`` (the module docstring); each problem appended to ``problems``. ``parameter_sync_step_set``: whether the
    run sets ``parameter_sync_step`` (a script of the older layout does not: its batch sizes alone decide);
    ``check_environment``: also load a custom sampler class."""
    sampler = config.trainer.v1.sampler
    schedule = sampler.get("schedule", "fixed_lag")
    if schedule not in SCHEDULES:
        problems.append(f"{SAMPLER}.schedule={schedule!r}; use one of {SCHEDULES}")
    _filter_groups(config, schedule)
    _custom_sampler(sampler, schedule, mode, problems, check_environment)
    threshold, strategy = sampler.max_off_policy_threshold, sampler.max_off_policy_strategy
    if not _int_at_least(threshold, 1):
        problems.append(f"{SAMPLER}.max_off_policy_threshold={threshold!r}: a model-version count, an integer >= 1")
    if strategy not in STRATEGIES:
        problems.append(f"{SAMPLER}.max_off_policy_strategy={strategy!r}; use one of {STRATEGIES}")
    if _int_at_least(threshold, 1):
        _staleness_bound(config, mode, schedule, strategy, threshold, problems)
    _parameter_sync_step(config, mode if parameter_sync_step_set else "", schedule, problems)
    _hybrid_switch(config, mode, schedule, problems)


def _staleness_bound(config: Any, mode: str, schedule: str, strategy: str, threshold: int, problems: list) -> None:
    """Where nothing evicts a stale group (the fixed lag in an async mode; the async buffer under ``wait``),
    the batches generated ahead (L, trained at age L + 1) must stay within the threshold."""
    if mode not in ASYNC_MODES or not (schedule == "fixed_lag" or strategy == "wait"):
        return
    lag = async_training_config(config).max_lag
    if lag + 1 > threshold:
        why = (
            "the fixed lag evicts nothing" if schedule == "fixed_lag" else "max_off_policy_strategy=wait evicts nothing"
        )
        problems.append(
            f"async_training.max_lag={lag} (trainer.v1.{mode}.num_warmup_batches) trains groups generated {lag} "
            f"weight versions back, at age {lag + 1}, beyond {SAMPLER}.max_off_policy_threshold={threshold}, and "
            f"{why}; lower the lag or raise the threshold" + (" or use drop" if schedule != "fixed_lag" else "")
        )
    elif schedule == "fixed_lag" and strategy != STRATEGIES[0]:
        logger.info(
            "%s.max_off_policy_strategy=%s: under the fixed lag no group reaches the threshold, so drop and wait act "
            "alike",
            SAMPLER,
            strategy,
        )


def _parameter_sync_step(config: Any, mode: str, schedule: str, problems: list[str]) -> None:
    key = "trainer.v1.separate_async.parameter_sync_step"
    steps = config.trainer.v1.separate_async.parameter_sync_step
    if not _int_at_least(steps, 1):
        problems.append(f"{key}={steps!r}: optimizer steps per weight push, an integer >= 1")
        return
    if mode != "separate_async":
        return
    batch, mini = int(config.data.train_batch_size), int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    if batch != steps * mini:
        problems.append(
            f"{key}={steps}: each step trains data.train_batch_size={batch} prompts in mini-batches of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} and pushes the weights once; make "
            f"train_batch_size = parameter_sync_step × ppo_mini_batch_size (here {batch // mini if mini else '?'} "
            "optimizer steps per push)"
        )
        return
    if schedule == "replay_buffer":
        logger.info("%s=%d: each mini-batch trains as it is sampled, on the step's π_old; one weight push", key, steps)
        return
    logger.info(
        "%s=%d: the step's mini-batches train one after another once its whole batch is generated (under "
        "%s.schedule=replay_buffer, as veRL, each trains as it is sampled), one π_old for all, one weight push",
        key,
        steps,
        SAMPLER,
    )


def _hybrid_switch(config: Any, mode: str, schedule: str, problems: list[str]) -> None:
    """``trainer.v1.separate_async.hybrid_rollout``: read by separate_async under veRL's schedule (its buffer says when
    enough groups are sampleable to take the lent engines back)."""
    key = "trainer.v1.separate_async.hybrid_rollout"
    section = config.trainer.v1.separate_async.get("hybrid_rollout") or {}
    if not section.get("enable_switch", False):
        return
    if mode != "separate_async" or schedule != "replay_buffer":
        problems.append(
            f"{key}.enable_switch=true: the training workers' engines are lent to generation in "
            f"trainer.v1.trainer_mode=separate_async under {SAMPLER}.schedule=replay_buffer (here: {mode}, "
            f"{schedule})"
        )
        return
    if int(config.actor_rollout_ref.model.get("lora_rank", 0) or 0) > 0:
        problems.append(f"{key}.enable_switch=true with a LoRA actor (model.lora_rank): not built")
    from verl.trainer.ppo.hybrid_switch import SwitchSettings

    try:
        SwitchSettings.from_config(section)
    except (TypeError, ValueError) as e:
        problems.append(str(e))


def _filter_groups(config: Any, schedule: str) -> None:
    """Say which of DAPO's two bounds on extra generation the schedule reads (the other has no effect)."""
    filter_cfg = config.algorithm.get("filter_groups") or {}
    if not filter_cfg.get("enable", False):
        return
    inflight, batches = filter_cfg.get("max_inflight_gen_batches", 1), filter_cfg.get("max_num_gen_batches", 0)
    if schedule == "replay_buffer" and batches:
        logger.warning(
            "%s.max_num_gen_batches=%s: no effect under %s.schedule=replay_buffer (nor in veRL 0.10), whose refills "
            "are bounded by %s.max_inflight_gen_batches=%s and the data's end",
            FILTER,
            batches,
            SAMPLER,
            FILTER,
            inflight,
        )
    elif schedule == "fixed_lag" and inflight != 1:
        logger.warning(
            "%s.max_inflight_gen_batches=%s: no effect under %s.schedule=fixed_lag, which generates batches of "
            "data.gen_batch_size prompts one after another (bounded by %s.max_num_gen_batches)",
            FILTER,
            inflight,
            SAMPLER,
            FILTER,
        )


def _custom_sampler(sampler: Any, schedule: str, mode: str, problems: list[str], check_environment: bool) -> None:
    """``custom_sampler`` / ``sampler_kwargs`` / ``sync_refill_failed_groups`` go to a replay buffer: only
    ``schedule=replay_buffer`` has one."""
    custom = sampler.get("custom_sampler") or {}
    given = [
        f"{SAMPLER}.{key}"
        for key, value in (
            ("custom_sampler.path", custom.get("path")),
            ("sampler_kwargs", sampler.get("sampler_kwargs")),
            ("sync_refill_failed_groups", sampler.get("sync_refill_failed_groups")),
        )
        if value
    ]
    if not given:
        return
    if schedule == "replay_buffer" and mode in ASYNC_MODES and sampler.get("sync_refill_failed_groups"):
        logger.warning(
            "%s.sync_refill_failed_groups=true: no effect in %s, whose buffer evicts and refills every failed group",
            SAMPLER,
            mode,
        )
    if schedule != "replay_buffer":
        problems.append(
            f"{', '.join(given)}: read by the replay buffer, which {SAMPLER}.schedule={schedule} does not use; set "
            f"{SAMPLER}.schedule=replay_buffer"
        )
    elif check_environment and custom.get("path"):
        from verl.trainer.ppo.replay_batches import sampler_class

        try:
            sampler_class(sampler, is_async=mode in ASYNC_MODES)
        except (ValueError, TypeError) as e:
            problems.append(str(e))
