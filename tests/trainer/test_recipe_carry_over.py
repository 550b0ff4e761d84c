"""A veRL user's recipe, run unchanged: its own main with a ``ray.remote``-decorated TaskRunner subclass that builds
the trainer without datasets, a trainer subclass whose ``__init__`` skips ours (veRL's SPPO does) and whose ``fit()``
is written in veRL's recipe style (both of veRL's generation calls on a batch it repeated ``n`` times), a reward file
with veRL's exact signature, and an
``external_lib`` module that registers an estimator and a policy loss without ``**kwargs``.

One real run (subprocess, Ray, FSDP workers, the hf engine, CPU) feeds every assertion below.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.cli_runs import Prepared, cli_run, needs
from tests.trainer.test_main_ppo import demo_model, make_gsm8k, quickstart

MY_LIB = '''
"""External lib (actor_rollout_ref.model.external_lib): registrations, each leaving a marker with its process."""
import os

import torch

from verl.trainer.ppo.core_algos import register_adv_est, register_policy_loss


def _mark(what):
    with open(os.path.join(os.environ["CARRY_OVER_MARKERS"], f"{what}.{os.getpid()}"), "w") as f:
        f.write(what)


@register_adv_est("carry_over_grpo")
def outcome_minus_group_mean(token_level_rewards, response_mask, index):
    _mark("estimator")
    scores = token_level_rewards.sum(-1)
    means = {g: scores[[i for i, u in enumerate(index) if u == g]].mean() for g in set(index)}
    adv = torch.stack([scores[i] - means[u] for i, u in enumerate(index)])[:, None] * response_mask
    return adv, adv


@register_policy_loss("carry_over_pg")
def plain_policy_gradient(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):
    _mark("loss")
    loss = -(advantages * log_prob * response_mask).sum() / response_mask.sum().clamp(min=1)
    return loss, {"actor/carry_over_pg": 1.0}
'''

REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) / 100
"""

ROOT = Path(__file__).resolve().parents[2]
RECIPE_MAIN = '''
"""python -m my_recipe.main_my: a recipe in veRL's style (own TaskRunner, own trainer fit)."""
import uuid
from collections import defaultdict

import hydra
import numpy as np
import ray
import torch
from omegaconf import OmegaConf

from verl import DataProto
from verl.trainer.main_ppo import TaskRunner, run_ppo
from verl.trainer.ppo.core_algos import agg_loss
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from verl.trainer.ppo.ray_trainer import AdvantageEstimator, RayPPOTrainer, compute_advantage, compute_response_mask
from verl.trainer.ppo.reward import load_reward_manager
from verl.trainer.ppo.utils import need_reference_policy, need_reward_model
from verl.utils import hf_tokenizer
from verl.utils.fs import copy_to_local
from verl.utils.metric import reduce_metrics
from verl.utils.profiler import marked_timer
from verl.utils.tracking import Tracking, ValidationGenerationsLogger


class MyTrainer(RayPPOTrainer):
    def __init__(self, config, tokenizer, role_worker_mapping, resource_pool_manager, ray_worker_group_cls=None,
                 processor=None, reward_fn=None, val_reward_fn=None, train_dataset=None, val_dataset=None,
                 collate_fn=None, train_sampler=None, device_name=None):
        # veRL's SPPO style: sets its own attributes and never calls RayPPOTrainer.__init__
        self.tokenizer, self.processor, self.config = tokenizer, processor, config
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.hybrid_engine = config.actor_rollout_ref.hybrid_engine
        self.role_worker_mapping, self.resource_pool_manager = role_worker_mapping, resource_pool_manager
        self.use_reference_policy = need_reference_policy(role_worker_mapping)
        self.use_rm = need_reward_model(role_worker_mapping)
        self.use_critic = False
        self.ray_worker_group_cls = ray_worker_group_cls
        self.validation_generations_logger = ValidationGenerationsLogger()
        self.device_name = device_name if device_name else self.config.trainer.device
        self.init_style = "verl"
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)

    def fit(self):
        logger = Tracking(
            project_name=self.config.trainer.project_name,
            experiment_name=self.config.trainer.experiment_name,
            default_backend=self.config.trainer.logger,
            config=OmegaConf.to_container(self.config, resolve=True),
        )
        self.global_steps = 0
        self._load_checkpoint()
        self.global_steps += 1
        n = self.config.actor_rollout_ref.rollout.n
        assert self.config.algorithm.adv_estimator != AdvantageEstimator.GAE
        for epoch in range(self.config.trainer.total_epochs):
            for batch_dict in self.train_dataloader:
                metrics, timing_raw = {}, defaultdict(float)
                do_profile = self.global_steps in (self.config.global_profiler.steps or [])
                with marked_timer("start_profile", timing_raw):
                    self._start_profiling(do_profile)
                batch = DataProto.from_single_dict(batch_dict)
                batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
                gen_batch = self._get_gen_batch(batch)
                gen_batch_output = gen_batch.repeat(repeat_times=n, interleave=True)
                is_last_step = self.global_steps >= self.total_training_steps
                with marked_timer("step", timing_raw):
                    with marked_timer("gen", timing_raw, "red"):
                        if self.global_steps % 2:  # both of veRL's calls: one response per (repeated) row
                            gen_batch_output = self.async_rollout_manager.generate_sequences(gen_batch_output)
                        else:
                            gen_batch_output = self.actor_rollout_wg.generate_sequences(gen_batch_output)
                        metrics["recipe/gen_rows"] = len(gen_batch_output)
                        timing_raw.update(gen_batch_output.meta_info["timing"])
                        gen_batch_output.meta_info.pop("timing", None)
                    batch = batch.repeat(repeat_times=n, interleave=True)
                    batch = batch.union(gen_batch_output)
                    if "response_mask" not in batch.batch.keys():
                        batch.batch["response_mask"] = compute_response_mask(batch)
                    if self.config.trainer.balance_batch:
                        self._balance_batch(batch, metrics=metrics)
                    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
                    with marked_timer("reward", timing_raw, "yellow"):
                        reward_tensor, reward_extra_infos_dict = self._compute_or_extract_reward(batch, self.reward_fn)
                    with marked_timer("old_log_prob", timing_raw, "blue"):
                        old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
                        entropys = old_log_prob.batch["entropys"]
                        loss_agg_mode = self.config.actor_rollout_ref.actor.loss_agg_mode
                        entropy = agg_loss(entropys, batch.batch["response_mask"], loss_agg_mode)
                        metrics["actor/entropy"] = entropy.detach().item()
                        metrics["perf/mfu/actor_infer"] = old_log_prob_mfu
                        old_log_prob.batch.pop("entropys")
                        batch = batch.union(old_log_prob)
                    if self.use_reference_policy:
                        with marked_timer("ref", timing_raw, "olive"):
                            worker = self.actor_rollout_wg if self.ref_in_actor else self.ref_policy_wg
                            batch = batch.union(worker.compute_ref_log_prob(batch))
                    with marked_timer("adv", timing_raw, "brown"):
                        batch.batch["token_level_scores"] = reward_tensor
                        if reward_extra_infos_dict:
                            batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra_infos_dict.items()})
                        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                        batch = compute_advantage(
                            batch,
                            adv_estimator=self.config.algorithm.adv_estimator,
                            gamma=self.config.algorithm.gamma,
                            lam=self.config.algorithm.lam,
                            num_repeat=n,
                            norm_adv_by_std_in_grpo=self.config.algorithm.norm_adv_by_std_in_grpo,
                        )
                    with marked_timer("update_actor", timing_raw, "red"):
                        actor_output = self._update_actor(batch)
                        metrics["recipe/mini_batches"] = len(actor_output.meta_info["metrics"]["actor/pg_loss"])
                    metrics.update(reduce_metrics(actor_output.meta_info["metrics"]))
                    with marked_timer("update_weights", timing_raw, "red"):
                        self.checkpoint_manager.update_weights()
                    rollout_data_dir = self.config.trainer.get("rollout_data_dir", None)
                    if rollout_data_dir:
                        self._log_rollout_data(batch, reward_extra_infos_dict, timing_raw, rollout_data_dir)
                if self.config.trainer.test_freq > 0 and (
                    is_last_step or self.global_steps % self.config.trainer.test_freq == 0
                ):
                    with marked_timer("testing", timing_raw, "green"):
                        metrics.update(self._validate())
                if self.config.trainer.save_freq > 0 and (
                    is_last_step or self.global_steps % self.config.trainer.save_freq == 0
                ):
                    with marked_timer("save_checkpoint", timing_raw, "green"):
                        self._save_checkpoint()
                with marked_timer("stop_profile", timing_raw):
                    self._stop_profiling(do_profile)
                metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
                metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
                n_gpus = self.resource_pool_manager.get_n_gpus()
                metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=n_gpus))
                metrics["recipe/fit_step"] = self.global_steps
                metrics["recipe/verl_style_init"] = float(self.init_style == "verl")
                logger.log(data=metrics, step=self.global_steps)
                if is_last_step:
                    logger.finish()
                    return
                self.global_steps += 1


class MyRunner(TaskRunner):
    def run(self, config):
        OmegaConf.resolve(config)
        actor_rollout_cls, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_worker(config)
        self.add_ref_policy_worker(config, actor_rollout_cls)
        tokenizer = hf_tokenizer(copy_to_local(config.actor_rollout_ref.model.path))
        reward_kwargs = config.reward_model.get("reward_kwargs", {})
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0, **reward_kwargs)
        val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1)
        trainer = MyTrainer(  # no datasets: the trainer builds them from config.data, as veRL's does
            config=config,
            tokenizer=tokenizer,
            processor=None,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=ray_worker_group_cls,
            reward_fn=reward_fn,
            val_reward_fn=val_reward_fn,
        )
        trainer.init_workers()
        trainer.fit()


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config):
    run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(MyRunner))


if __name__ == "__main__":
    main()
'''


@cli_run("recipe_carry_over", cost_s=70)
def _recipe_carry_over(tmp: Path) -> Prepared:
    """Write the recipe, the lib and the reward file into a user folder and run ``python -m my_recipe.main_my``."""
    data, model = make_gsm8k(tmp), demo_model(tmp)
    (tmp / "my_recipe").mkdir()
    (tmp / "my_recipe" / "__init__.py").write_text("")
    (tmp / "my_recipe" / "main_my.py").write_text(textwrap.dedent(RECIPE_MAIN))
    (tmp / "my_lib.py").write_text(MY_LIB)
    (tmp / "my_reward.py").write_text(REWARD)
    markers = tmp / "markers"
    markers.mkdir()
    overrides = quickstart(
        data,
        model,
        "algorithm.adv_estimator=carry_over_grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=carry_over_pg",
        "actor_rollout_ref.model.external_lib=my_lib",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=3",  # 16 samples: mini-batches of 6 + 6 + 4, as veRL
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.rollout.mode=async",
        "data.dataloader_num_workers=0",
        f"custom_reward_function.path={tmp / 'my_reward.py'}",
        "global_profiler.tool=torch",
        "actor_rollout_ref.actor.profiler.enable=true",  # veRL: a role records only when its profiler is enabled
        "global_profiler.steps=[1]",
        f"global_profiler.save_path={tmp / 'profile'}",
        f"trainer.rollout_data_dir={tmp / 'rollouts'}",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "trainer.logger=[console,file]",
    )
    env = {
        "CARRY_OVER_MARKERS": str(markers),
        "PYTHONPATH": os.pathsep.join(
            [str(tmp), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    return Prepared(overrides, env, module="my_recipe.main_my")


@pytest.fixture
def recipe_run(cli_runs):
    run = cli_runs["recipe_carry_over"]
    return run.work, run.returncode, run.output, [r["data"] for r in run.records if r["data"]]


@needs("recipe_carry_over")
def test_the_recipe_trains_with_its_own_fit(recipe_run):
    tmp, code, output, steps = recipe_run
    assert code == 0, output[-4000:]
    assert [s["recipe/fit_step"] for s in steps] == [1, 2]
    # its __init__ skipped ours: init_workers completed it
    assert all(s["recipe/verl_style_init"] == 1.0 for s in steps)
    # an early-2026 command line: its custom_reward_function.path is read into veRL 0.10's reward.* with a warning
    assert "custom_reward_function.path=" in output
    assert "is veRL's older name of reward.custom_reward_function.path" in output
    # a batch repeated n=2 times gives one response per row through either call; a last partial mini-batch trains
    assert [s["recipe/gen_rows"] for s in steps] == [16, 16] and [s["recipe/mini_batches"] for s in steps] == [3, 3]
    assert all(s["critic/score/mean"] > 0 for s in steps)  # veRL's signature, no **kwargs: scored, not zeroed
    val = steps[-1]["val-core/openai/gsm8k/acc/mean@1"]  # _validate() at the last step
    assert isinstance(val, float) and 0.0 <= val <= 1.0, val  # a finite mean of 0/1 scores ("nan" is a string)
    assert steps[0]["actor/carry_over_pg"] == 1.0  # the registered loss ran in the actor
    assert "timing_s/generate_sequences" in steps[0] and "global_seqlen/mean" in steps[0]


@needs("recipe_carry_over")
def test_external_lib_registrations_run_in_the_driver_and_the_workers(recipe_run):
    tmp, code, output, _ = recipe_run
    assert code == 0, output[-4000:]
    pids = {kind: {p.suffix for p in (tmp / "markers").glob(f"{kind}.*")} for kind in ("estimator", "loss")}
    assert pids["estimator"] and pids["loss"]
    assert not pids["estimator"] & pids["loss"]  # the estimator in the driver, the loss in a Ray worker


@needs("recipe_carry_over")
def test_checkpoint_profile_and_rollout_dumps(recipe_run):
    tmp, code, output, _ = recipe_run
    assert code == 0, output[-4000:]
    assert (tmp / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert (tmp / "ckpt" / "global_step_2" / "actor").is_dir()  # _save_checkpoint() with no argument
    traces = list((tmp / "profile").rglob("*.json"))
    assert traces and all("step1" in t.name for t in traces), traces  # global_profiler.steps=[1] only
    assert json.loads(traces[0].read_text())["traceEvents"]
    assert sorted(p.name for p in (tmp / "rollouts").glob("*.jsonl")) == ["1.jsonl", "2.jsonl"]
