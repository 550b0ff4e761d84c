"""`RayPPOTrainer`: the single-controller PPO/GRPO loop over worker groups, one trainer for every trainer mode.

``fit()`` runs one step per training batch, the same named stages in every mode: the batch comes from the mode's
rollout source (``rollout_source.next_batch``: gen → gen_max → reward, scheduled by the mode; several generation
batches with DAPO's dynamic sampling, a filter on the source) and is trained (``_train_part``: old_log_prob → ref →
values → adv → update_critic → update_actor; once per part when the source streams the step in mini-batches,
``_train_parts``), then ``_finish_step``: update_weights → testing → save_checkpoint. Each stage is
timed under veRL's timer name (``timing_s/<name>``), all inside ``step``. What a checkpoint restores is one object,
``trainer.state`` (:class:`~verl.trainer.ppo.trainer_state.TrainerState`: step, epoch, weight version, KL
coefficient, data position, the source's state).

A recipe's own ``fit()`` (a subclass, written in veRL's recipe style) finds veRL's helpers here with veRL's
arguments and return values, and the stages of our ``fit()`` are built on the same helpers: ``_get_gen_batch``,
``async_rollout_manager.generate_sequences``, ``_compute_or_extract_reward``, ``_balance_batch(batch, metrics)``,
``_compute_old_log_prob`` → ``(DataProto, mfu)``, ``_compute_ref_log_prob`` / ``_compute_values`` /
``_update_critic`` / ``_update_actor`` → ``DataProto``, ``checkpoint_manager.update_weights()`` /
``sleep_replicas()``, ``_validate()``, ``_save_checkpoint()`` / ``_load_checkpoint()``, ``_start_profiling`` /
``_stop_profiling``, ``_log_rollout_data`` and ``_dump_generations`` (the stage helpers from ``TrainerStages``,
``_get_gen_batch`` and the last three groups from ``TrainerGeneration``, ``TrainerCheckpointing``,
``TrainerProfiling`` and ``GenerationDumps``, each in the module of its concern; each declares what it reads of the
trainer). The worker groups are spawned by :func:`~verl.trainer.ppo.worker_setup.spawn_worker_groups`, the data
loaders built by :func:`~verl.trainer.ppo.trainer_data.build_dataloaders`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

from verl.experimental.dataset.sampler import AbstractCurriculumSampler
from verl.experimental.reward_loop.reward_model import RewardModelManager, colocated_judge, served_reward_model
from verl.experimental.reward_loop.router import reward_router
from verl.experimental.teacher_loop import MultiTeacherModelManager
from verl.protocol import DataProto
from verl.single_controller.ray import RayWorkerGroup
from verl.single_controller.ray.base import WorkerDiedError
from verl.single_controller.ray.health import placement, raise_if_workers_died
from verl.trainer.config.derived import total_training_steps, uses_bypass_mode, with_derived_settings
from verl.trainer.config.layout import resolve_layout, trainer_mode
from verl.trainer.ppo.core_algos import AdvantageEstimator, get_kl_controller
from verl.trainer.ppo.dynamic_sampling import StepState, accumulate_groups
from verl.trainer.ppo.generation import TrainerGeneration
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_spec_decode_metrics,
    compute_staleness_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    reduce_metrics,
)
from verl.trainer.ppo.on_policy import old_log_prob_in_update
from verl.trainer.ppo.profiling import TrainerProfiling
from verl.trainer.ppo.reward import load_reward_fns
from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode
from verl.trainer.ppo.rollout_manager import (
    CheckpointManager,
    create_rollout_manager,
    route_generation,
    start_rollout_servers,
)
from verl.trainer.ppo.rollout_source import PromptStream, Rollouter, RolloutFilter, get_rollout_source_class
from verl.trainer.ppo.stages import TrainerStages
from verl.trainer.ppo.step_policy import StepPolicy
from verl.trainer.ppo.trainer_checkpoint import TrainerCheckpointing
from verl.trainer.ppo.trainer_data import build_dataloaders
from verl.trainer.ppo.trainer_state import TrainerState
from verl.trainer.ppo.utils import (
    ResourcePoolManager,
    Role,
    apply_kl_penalty,
    compute_advantage,
    compute_response_mask,
    need_critic,
    need_reference_policy,
    need_teacher_policy,
)
from verl.trainer.ppo.v1.metrics import MetricsAggregator
from verl.trainer.ppo.v1.multi_trajectory import PADDING_COLUMN, final_rows, has_multi_outputs, pad_rows
from verl.trainer.ppo.v1.trainer_base import TrainerHooks
from verl.trainer.ppo.validation import GenerationDumps, ValidationSamples
from verl.trainer.ppo.worker_setup import spawn_worker_groups
from verl.utils.import_utils import import_external_libs
from verl.utils.profiler import marked_timer
from verl.utils.rollout_skip import RolloutSkip
from verl.utils.seqlen_balancing import balance_batch
from verl.utils.tracking import DapoFilteredRewardTableLogger, Tracking, ValidationGenerationsLogger
from verl.utils.tracking.tables import FILTERED_REWARD_TABLE_KEY

__all__ = [
    "AdvantageEstimator",
    "RayPPOTrainer",
    "ResourcePoolManager",
    "Role",
    "apply_kl_penalty",
    "compute_advantage",
    "compute_response_mask",
    "compute_spec_decode_metrics",  # veRL's import path; lives in metric_utils
    "marked_timer",
]

logger = logging.getLogger(__name__)


class RayPPOTrainer(
    TrainerHooks, TrainerStages, TrainerGeneration, TrainerCheckpointing, TrainerProfiling, GenerationDumps
):
    """The driver: owns the data, the reward function and the worker groups, and runs the training loop.

    Args:
        config: the full trainer config (validated); never modified — ``self.config`` is a resolved copy with the
            derived settings filled in once, here (:func:`~verl.trainer.config.derived.with_derived_settings`).
        tokenizer: the policy's tokenizer (decoding for rewards, EOS / pad ids).
        role_worker_mapping: ``{Role: worker class}`` (a plain class or a ``ray.remote`` one).
        resource_pool_manager: where each role runs.
        reward_fn / val_reward_fn: reward managers (``reward_fn(batch, return_dict=True)``).
        train_dataset / val_dataset / collate_fn / train_sampler: the data (see ``verl.utils.dataset``).
    """

    def __init__(
        self,
        config: DictConfig,
        tokenizer: Any,
        role_worker_mapping: dict[Role, Any],
        resource_pool_manager: ResourcePoolManager,
        ray_worker_group_cls: type = RayWorkerGroup,
        processor: Any = None,
        reward_fn: Any = None,
        val_reward_fn: Any = None,
        train_dataset: Any = None,
        val_dataset: Any = None,
        collate_fn: Any = None,
        train_sampler: Any = None,
        device_name: str | None = None,
    ) -> None:
        self.config = resolve_layout(OmegaConf.create(OmegaConf.to_container(config, resolve=True)))
        self.tokenizer = tokenizer
        self.processor = processor
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager = resource_pool_manager
        self.ray_worker_group_cls = ray_worker_group_cls
        self.use_critic = need_critic(self.config)
        self.use_reference_policy = need_reference_policy(self.config)
        self.use_rm = Role.RewardModel in role_worker_mapping  # a recipe's own RewardModelWorker: veRL's older path
        if reward_fn is None and not self.use_rm:  # veRL 0.10's trainer takes none: the config's reward.* names it
            reward_fn, default_val_fn = load_reward_fns(self.config, tokenizer)
            val_reward_fn = default_val_fn if val_reward_fn is None else val_reward_fn
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        algo = self.config.algorithm
        self.kl_ctrl_in_reward = get_kl_controller(algo.kl_ctrl) if algo.use_kl_in_reward else None
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)
        self._init_derived()

    def _init_derived(self) -> None:
        """What the trainer derives from its config and data (after ``_create_dataloader``). Also run by
        ``init_workers`` for a veRL-style subclass whose ``__init__`` sets its own attributes without calling ours
        (SPPO's): what it set is kept."""
        # what model.external_lib registers (estimators run here, on the driver) must exist in this process too
        import_external_libs(self.config.actor_rollout_ref.model.get("external_lib"))
        # the reference policy runs inside the actor's workers (role actor_rollout_ref): ref_policy_wg is that group
        self.use_reference_policy = getattr(self, "use_reference_policy", need_reference_policy(self.config))
        self.ref_in_actor = self.use_reference_policy
        self.async_rollout_mode = True  # as veRL: rollout.mode=sync takes the same (server / agent-loop) path
        if not hasattr(self, "kl_ctrl_in_reward"):
            algo = self.config.algorithm
            self.kl_ctrl_in_reward = get_kl_controller(algo.kl_ctrl) if algo.use_kl_in_reward else None
        self._init_profiling()
        trainer = self.config.trainer
        self.generations_logger = ValidationGenerationsLogger(trainer.project_name, trainer.experiment_name)
        correction = self.config.algorithm.get("rollout_correction") or {}
        self.bypass_mode = uses_bypass_mode(self.config)
        self.rollout_correction = bool(correction.get("rollout_is") or correction.get("rollout_rs"))
        self.old_log_prob_in_update, why_not = old_log_prob_in_update(self)
        logger.info("old log-probs: %s", "from the update's forward" if self.old_log_prob_in_update else why_not)
        from verl.workers.actor.zero_adv import zero_adv_skip_reason

        why_kept = zero_adv_skip_reason(self.config.actor_rollout_ref.actor)
        logger.info("zero-advantage samples: %s", f"kept ({why_kept})" if why_kept else "skipped in the update")
        self.state = TrainerState(kl_ctrl=self.kl_ctrl_in_reward, dataloader=self.train_dataloader)
        self.rollout_filter = self._create_rollout_filter()
        schedule = OmegaConf.select(self.config, "trainer.v1.sampler.schedule", default="fixed_lag")
        source_cls = get_rollout_source_class(self.rollout_mode or trainer_mode(self.config), schedule)
        self.rollout_source = source_cls(self._rollouter())
        self.state.source = self.rollout_source
        self.prompts: PromptStream | None = None  # the training prompts, from fit(); a recipe's fit() reads the loader

    def _rollouter(self) -> Rollouter:
        """What the rollout source uses of this trainer, declared (the servers, the prompts and the weight push are
        made later: ``init_workers``, ``fit``)."""
        return Rollouter(
            config=self.config,
            state=self.state,
            rollout=self._rollout,
            prompts=lambda: self.prompts,
            total_training_steps=self.total_training_steps,
            rollout_filter=self.rollout_filter,
            updates_actor=self._updates_actor,
            sleep_replicas=lambda: self.checkpoint_manager.sleep_replicas(),
            servers=lambda: self.rollout_wg,
            trainer_workers=lambda: self.actor_rollout_wg,
            rollout_manager=lambda: self.async_rollout_manager,
            stage=self._stage,
            owner=type(self).__qualname__,
        )

    @property
    def global_steps(self) -> int:
        """veRL's step counter: ``state.global_steps`` (the step in progress, or the last one trained)."""
        return self.state.global_steps

    @global_steps.setter
    def global_steps(self, value: int) -> None:
        self.state.global_steps = int(value)

    # ------------------------------------------------------------------ set-up
    def _create_dataloader(self, train_dataset: Any, val_dataset: Any, collate_fn: Any, train_sampler: Any) -> None:
        """The train and validation loaders (veRL's): a dataset, sampler or ``collate_fn`` not given is built from
        ``config.data`` as ``main_ppo`` builds it (``create_rl_dataset``, ``create_rl_sampler``, the RL dataset's
        ``collate_fn``), so a recipe main may construct the trainer without data; no ``data.val_files``: no
        validation loader."""
        loaders = build_dataloaders(
            self.config.data, self.tokenizer, self.processor, train_dataset, val_dataset, collate_fn, train_sampler
        )
        self.train_dataset, self.val_dataset = loaders.train_dataset, loaders.val_dataset
        self.train_dataloader, self.val_dataloader = loaders.train_dataloader, loaders.val_dataloader
        self.total_training_steps = total_training_steps(self.config, len(self.train_dataloader))
        self.config = with_derived_settings(self.config, self.total_training_steps)

    def _create_rollout_filter(self) -> RolloutFilter | None:
        """The rollout filter hook: what the rollout source applies to each scored generation batch (keep part of
        it, and ask for more until the training batch is full). Default: DAPO's dynamic sampling
        (``algorithm.filter_groups``, :func:`~verl.trainer.ppo.dynamic_sampling.accumulate_groups`) when enabled,
        else none. A recipe overrides this to filter its own way."""
        if not (self.config.algorithm.get("filter_groups") or {}).get("enable", False):
            return None
        return functools.partial(accumulate_groups, config=self.config)

    def init_workers(self) -> None:
        """Create the pools and one fused worker per bundle for the roles of each pool; build their models. The
        rollout engines are inside the actor's workers (the hybrid engine), or, in a mode with resident servers,
        a worker group of their own (``self.rollout_wg``) on the actor's bundles or on the rollout pool."""
        if "rollout_source" not in vars(self):  # a veRL-style subclass __init__ that did not call ours
            self._init_derived()
        resident, separate = self.rollout_source.resident_servers, self.rollout_source.separate_pool
        groups, arr_role = spawn_worker_groups(
            self.resource_pool_manager,
            self.role_worker_mapping,
            self.config,
            roles={"critic": self.use_critic, "rm": self.use_rm, "ref": self.use_reference_policy},
            resident=resident,
            separate=separate,
            trainer_engines=self.rollout_source.trainer_engines,
            extra_per_bundle=int(colocated_judge(self.config)),
            worker_group_cls=self.ray_worker_group_cls,
        )
        pool = self.resource_pool_manager.get_resource_pool(arr_role)
        self.critic_wg = groups.get("critic")
        self.rm_wg = groups.get("rm")
        self.actor_rollout_wg = groups["actor_rollout"]
        self.ref_policy_wg = self.actor_rollout_wg if self.use_reference_policy else None
        self.rollout_wg = self.actor_rollout_wg
        self.teacher_manager = None
        if need_teacher_policy(self.config):  # the teachers' servers on their own pool, before the agent loops
            teacher_pool = self.resource_pool_manager.get_resource_pool(Role.TeacherModel)
            self.teacher_manager = MultiTeacherModelManager(self.config, teacher_pool)
        # our manager only starts its agent-loop workers (they import while the models are built); a recipe's own
        # manager class may call the engines at once, so it comes after them
        early = not resident and not self.config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
        if early:
            self._create_rollout_manager()
        self.reward_model_manager = None
        if served_reward_model(self.config) and Role.RewardModel not in self.role_worker_mapping:
            # the reward model's replicas (own pool, or beside the training workers), behind the router
            rm_pool = self.resource_pool_manager.get_resource_pool(Role.RewardModel)
            self.reward_model_manager = RewardModelManager(self.config, rm_pool, reward_router(self.config)[0])
        for wg in (self.critic_wg, self.rm_wg):  # the rollout last: it sizes its memory after the others
            if wg is not None:
                wg.init_model()
        self.actor_rollout_wg.init_model()
        if resident:  # beside the training workers, or on the rollout pool
            server_pool = self.resource_pool_manager.get_resource_pool(Role.Rollout) if separate else pool
            server_cls = self.role_worker_mapping.get(Role.Rollout)  # a recipe's own server class, if it maps one
            self.rollout_wg = start_rollout_servers(
                server_pool, self.config, self.actor_rollout_wg, separate, server_cls
            )
        if not early:
            self._create_rollout_manager()
        free_cache = self.config.actor_rollout_ref.rollout.free_cache_engine and not resident
        receivers = self.rollout_wg if separate else None  # a push staged in the servers of their own pool
        judge = self.reward_model_manager if colocated_judge(self.config) else None
        self.checkpoint_manager = CheckpointManager(self.actor_rollout_wg, self.state, free_cache, receivers, judge)
        if resident:  # the servers loaded the model from its path: they get the actor's weights as version 0
            self.checkpoint_manager.resync_weights()
        if self.config.actor_rollout_ref.rollout.get("skip_rollout", False):
            RolloutSkip(self.config, self.async_rollout_manager).wrap_generate_sequences()
        groups = {id(g): g for g in (self.actor_rollout_wg, self.rollout_wg)}  # one group, or training + servers
        route_generation(self.async_rollout_manager, groups.values())
        logger.info("placement: %s", "; ".join(placement(self._groups_by_role())))
        self.on_init_end()

    def _create_rollout_manager(self) -> None:
        """``self.async_rollout_manager`` over ``self.rollout_wg`` (it only starts its agent-loop workers; nothing
        is asked of the rollout engines until the first generation)."""
        self.async_rollout_manager = create_rollout_manager(
            self.config,
            self.rollout_wg,
            tokenizer=self.tokenizer,
            reward_fn=None if self.use_rm else self.reward_fn,  # a reward model scores after generation
            val_reward_fn=None if self.use_rm else self.val_reward_fn,
            step=lambda: self.global_steps,
            teacher_client=None if self.teacher_manager is None else self.teacher_manager.get_client(),
        )

    def _groups_by_role(self) -> dict[str, Any]:
        """The run's worker groups by role (the rollout servers' when they are workers of their own)."""
        groups = {"actor_rollout": self.actor_rollout_wg, "critic": self.critic_wg, "rm": self.rm_wg}
        if self.rollout_wg is not self.actor_rollout_wg:
            groups["rollout"] = self.rollout_wg
        return groups

    def _validate(self) -> dict[str, float]:
        """Generate ``val_kwargs.n`` responses per validation prompt with ``val_kwargs`` sampling, score them with
        the validation reward function, and return ``val-core/...`` and ``val-aux/...`` (see
        :func:`verl.trainer.ppo.validation.validation_metrics`). Also logs ``trainer.log_val_generations`` samples
        and dumps to ``trainer.validation_data_dir``."""
        if self.val_dataloader is None or self.val_reward_fn is None:
            return {}
        self.on_validate_begin()
        try:
            return self._validate_all()
        finally:
            self.on_validate_end()

    def _validate_all(self) -> dict[str, float]:
        trainer = self.config.trainer
        n = self.config.actor_rollout_ref.rollout.val_kwargs.n
        samples = ValidationSamples()
        with self.rollout_source.paused():  # the servers never mix validation requests with a training batch's
            for batch_dict in self.val_dataloader:
                batch = DataProto.from_single_dict(batch_dict)
                first = len(samples.uids) // n
                batch.non_tensor_batch["uid"] = np.array([f"val-{first + i}" for i in range(len(batch))], dtype=object)
                batch = self._generate(batch, n=n, validate=True).batch
                if has_multi_outputs(batch):  # veRL 0.10: a session is validated on its final output
                    batch = batch.select_idxs(final_rows(batch))
                samples.add(self.tokenizer, batch, *self._compute_or_extract_reward(batch, self.val_reward_fn))
        if trainer.log_val_generations > 0:
            picked = samples.pick(trainer.log_val_generations)
            self.generations_logger.log(self._logger_names(), picked, self.global_steps)
        if trainer.validation_data_dir:
            samples.dump(trainer.validation_data_dir, self.global_steps)
        return samples.metrics()

    def _logger_names(self) -> list[str]:
        names = self.config.trainer.logger
        return [names] if isinstance(names, str) else list(names)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> None:
        """Train for ``trainer.total_training_steps`` (or ``total_epochs`` over the data), logging every step: each
        step takes its batch from the mode's rollout source, then runs the update stages (:meth:`_finish_step`)."""
        if self.config.algorithm.adv_estimator is None:
            raise ValueError(
                "algorithm.adv_estimator is null: the trainer's fit() needs an advantage estimator (null is for a "
                "recipe whose own fit() computes the advantages)"
            )
        from tqdm import tqdm

        trainer = self.config.trainer
        tracker = Tracking(
            trainer.project_name,
            trainer.experiment_name,
            self._logger_names(),
            config=OmegaConf.to_container(self.config),
        )
        self._load_checkpoint()
        self.prompts = PromptStream(self.train_dataloader, self.state, trainer.total_epochs)
        progress = tqdm(
            total=self.total_training_steps, initial=self.global_steps, desc="Training Progress", dynamic_ncols=True
        )
        filtered_table = DapoFilteredRewardTableLogger(trainer.project_name, trainer.experiment_name)
        exit_code = 1
        self.on_train_begin()
        try:
            if trainer.val_before_train or trainer.val_only:
                tracker.log(self._validate(), step=self.global_steps)
            if trainer.val_only or self.global_steps >= self.total_training_steps:
                logger.info("not training: %s", "trainer.val_only=True" if trainer.val_only else "all steps are done")
            while not trainer.val_only and self.global_steps < self.total_training_steps:
                step = self._begin_step()
                self.on_step_begin()
                prepared = self.prepare_step()
                batch = self._train_parts(step)
                if batch is None:  # the data ran out
                    self._end_step(step)
                    break
                metrics = self._finish_step(batch, step)
                self.on_step_end()
                metrics.update(prepared)
                self._data_hooks(batch)
                filtered = metrics.pop(FILTERED_REWARD_TABLE_KEY, None)  # dynamic sampling's dropped groups
                if filtered:
                    filtered_table.log(self._logger_names(), filtered, self.global_steps)
                tracker.log(metrics, step=self.global_steps)
                progress.update(1)
            exit_code = 0
        except BaseException as error:  # a dead worker is named (role, rank, node), whoever noticed it first
            raise_if_workers_died(self._groups_by_role(), error)
            raise
        finally:
            self.rollout_source.close()
            progress.close()
            self.on_train_end()
            tracker.finish(exit_code=exit_code)

    @contextlib.contextmanager
    def _stage(self, name: str, timing: dict[str, float]) -> Iterator[None]:
        """Time a stage under ``timing_s/<name>``; a worker that dies in it is reported with the stage and step."""
        try:
            with marked_timer(name, timing):
                yield
        except WorkerDiedError as e:
            raise WorkerDiedError(f"in stage {name!r} of step {self.global_steps}: {e}") from e

    def _begin_step(self) -> StepState:
        """Start step ``global_steps + 1``: its clock (``timing_s/step`` spans every stage of the step, generation
        included) and, at a profiled step, the profilers."""
        self.state.global_steps += 1
        step = StepState(metrics={"training/global_step": self.global_steps})
        step.timer = marked_timer("step", step.timing)
        step.timer.start()
        if self._profile_edge(self.global_steps, -1):
            with self._stage("start_profile", step.timing):
                self._start_profiling(True)
        return step

    def _end_step(self, step: StepState) -> None:
        """Stop a step that will not be trained (the data ran out): its clock and a profiler it started."""
        step.timer.stop()
        if self._profile_edge(self.global_steps, -1):
            self._stop_profiling(True)

    def _data_hooks(self, batch: DataProto) -> None:
        """veRL's data hooks after a trained step: a curriculum sampler's ``update(batch)`` and the dataset's
        ``on_batch_end(batch)``."""
        sampler = getattr(self.train_dataloader, "sampler", None)
        if isinstance(sampler, AbstractCurriculumSampler):
            sampler.update(batch=batch)
        on_batch_end = getattr(self.train_dataset, "on_batch_end", None)
        if callable(on_batch_end):
            on_batch_end(batch=batch)

    def _rollout(
        self,
        batch: DataProto,
        step: StepState,
        *,
        epoch: int | None = None,
        seed_step: int | None = None,
        first_prompt: int | None = None,
    ) -> DataProto:
        """Generate ``rollout.n`` responses per prompt with the engines' current weights (and ReMax's greedy
        baseline) and score them: the generation stages a rollout source schedules. ``epoch`` (the prompts' pass
        over the data) and ``seed_step`` (the step number that seeds the sampling) default to the trainer's; a
        source generating ahead of the trainer gives the batch's own; ``first_prompt`` numbers the prompts (it seeds
        their samples; default: after the step's earlier generation batches)."""
        timing, metrics = step.timing, step.metrics
        epoch = self.state.epoch if epoch is None else epoch
        self._step_uids(batch, epoch, seed_step)
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        prompts = batch
        with self._stage("gen", timing):  # DAPO's extra generation batches of a step get fresh seeds
            if first_prompt is None:
                first_prompt = step.gen_batches * len(prompts)
            keep_failed = self.rollout_source.keeps_failed_samples
            generated = self._generate(prompts, first_prompt=first_prompt, seed_step=seed_step, keep_failed=keep_failed)
        batch = generated.batch
        timing.update(generated.timing)
        metrics.update(generated.metrics)
        if self.config.algorithm.adv_estimator == "remax":
            with self._stage("gen_max", timing):
                self._compute_reward_baselines(prompts, batch)
        with self._stage("reward", timing):
            metrics.update(self._compute_reward(batch))
        return batch

    def _train_parts(self, step: StepState) -> DataProto | None:
        """The step's batch from the rollout source, trained up to the actor's update; None when the data ran out.

        A source that streams (``parts_per_step`` > 1: ``separate_async`` under veRL's schedule) hands the batch out
        one PPO mini-batch at a time; each part goes through the stages as it arrives, its old-log-prob pass on the
        step's π_old (:class:`~verl.trainer.ppo.step_policy.StepPolicy`), and the parts' metrics are reduced into one
        value each (:class:`~verl.trainer.ppo.v1.metrics.MetricsAggregator`); timings add up."""
        parts = self.rollout_source.parts_per_step
        policy = StepPolicy(self.actor_rollout_wg, parts, active=not self.bypass_mode and self._updates_actor())
        aggregator, trained = MetricsAggregator(), []
        try:
            for index in range(parts):
                part = step if parts == 1 else dataclasses.replace(step, metrics={})
                self.on_sample_begin()
                batch = self.rollout_source.next_batch(part)
                self.on_sample_end()
                if batch is None:
                    if trained:
                        logger.warning(
                            "the data ran out in step %d after %d of its %d parts: those are trained",
                            self.global_steps,
                            index,
                            parts,
                        )
                    break
                batch = self._train_part(batch, part, policy, index)
                trained.append(batch)
                if parts > 1:
                    aggregator.add_step_metrics(part.metrics, sample_count=len(batch))
        finally:
            policy.end()
        if parts > 1 and trained:
            step.metrics.update(aggregator.get_aggregated_metrics())
            step.metrics["training/parameter_sync_step"] = len(trained)  # the local updates before the push
        return (DataProto.concat(trained) if len(trained) > 1 else trained[0]) if trained else None

    def _train_part(self, batch: DataProto, step: StepState, policy: StepPolicy, index: int) -> DataProto:
        """Log-probs, values, advantages and the updates of one part of the step (the whole batch unless the source
        streams); metrics into ``step``. Returns the part as trained (PF-PPO resamples it)."""
        timing, metrics = step.timing, step.metrics
        grown = has_multi_outputs(batch)  # multi-output sessions: more rows than prompts × n, padded for the ranks
        if grown:
            batch = pad_rows(batch, self.actor_rollout_wg.world_size)
        if self.config.trainer.balance_batch:  # over the ranks that train it
            _, balance_metrics = balance_batch(batch, self.actor_rollout_wg.world_size)
            metrics.update(balance_metrics)
        # the update's forward is the old policy's only when it is one mini-batch (verl.trainer.ppo.on_policy)
        old_in_update = self.old_log_prob_in_update and self._updates_actor() and not grown
        if self.bypass_mode:  # the rollout's log-probs are the old ones: no forward pass
            apply_bypass_mode(batch)
        elif old_in_update:  # the update's own forward gives them (verl.trainer.ppo.on_policy)
            batch.meta_info["old_log_prob_in_update"] = True
        else:
            with self._stage("old_log_prob", timing), policy.old_log_prob_pass(index):
                metrics.update(self._old_log_prob_stage(batch))
        if self.use_reference_policy:
            with self._stage("ref", timing):
                batch.union(self._compute_ref_log_prob(batch))
        if self.use_critic:
            with self._stage("values", timing):
                batch.union(self._compute_values(batch))
        with self._stage("adv", timing):
            metrics.update(self._compute_advantage(batch))
            if self.config.algorithm.use_pf_ppo:
                batch = self._pf_ppo_resample(batch)
        if self.use_critic:
            with self._stage("update_critic", timing):
                metrics.update(reduce_metrics(self._update_critic(batch).meta_info["metrics"]))
        if self._updates_actor():
            with self._stage("update_actor", timing):
                update = self._update_actor(batch)
                metrics.update(reduce_metrics(update.meta_info["metrics"]))
                if batch.meta_info.pop("old_log_prob_in_update", False):
                    batch.union(update.select(batch_keys=["old_log_probs"]))
        if PADDING_COLUMN in batch.non_tensor_batch:  # the padding rows trained nothing: the step's metrics skip them
            batch = batch.select_idxs(~batch.non_tensor_batch.pop(PADDING_COLUMN).astype(bool))
        return batch

    def _finish_step(self, batch: DataProto, step: StepState) -> dict[str, Any]:
        """Everything after the updates: weight push, validation and checkpoint; returns the step's metrics."""
        trainer = self.config.trainer
        timing, metrics = step.timing, step.metrics
        workers = self.resource_pool_manager.get_n_gpus()
        last = self.global_steps >= self.total_training_steps
        metrics.update(compute_staleness_metrics(batch, self.state.weight_version))
        with contextlib.ExitStack() as stack:
            stack.callback(step.timer.stop)
            if trainer.rollout_data_dir:
                self._log_rollout_data(batch, self._reward_extra_infos(batch), timing, trainer.rollout_data_dir)
            if self._updates_actor():
                self.rollout_source.before_weights(step)
                with self._stage("update_weights", timing):
                    metrics.update(self.checkpoint_manager.update_weights())
                self.rollout_source.on_weights(self.state.weight_version)
            if trainer.test_freq > 0 and (last or self.global_steps % trainer.test_freq == 0):
                with self._stage("testing", timing):
                    metrics.update(self._validate())
            if trainer.save_freq > 0 and (last or self.global_steps % trainer.save_freq == 0):
                with self._stage("save_checkpoint", timing):
                    self._save_checkpoint()
            if self._profile_edge(self.global_steps, +1):
                with self._stage("stop_profile", timing):
                    self._stop_profiling(True)
        finals = batch.select_idxs(final_rows(batch)) if has_multi_outputs(batch) else batch
        metrics.update(compute_data_metrics(finals, use_critic=self.use_critic))  # a session's final output (veRL)
        metrics.update(compute_timing_metrics(batch, timing))
        metrics.update(compute_throughout_metrics(batch, timing, workers))
        return metrics
