"""``python -m verl.trainer.main_ppo [key=value ...]``: the PPO/GRPO trainer (Hydra command line, veRL's keys).

With neither ``actor_rollout_ref.model.path`` nor ``data.train_files`` given, the built-in demo preset is layered
under the overrides: a tiny Qwen2, its tokenizer and a synthetic arithmetic task (materialised under
``$VERL_CACHE_DIR``), GRPO on one CPU worker with the console logger. See docs/quickstart.md.

``main`` → ``run_ppo`` (validates the whole config, starts Ray) → ``TaskRunner`` (a Ray actor) →
``RayPPOTrainer.init_workers()`` / ``fit()``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer.config.validate import validate_config, world_size
from verl.utils.ray_utils import required_logical_cpus

__all__ = ["DEMO_PRESET", "TaskRunner", "demo_preset", "main", "run_ppo"]

logger = logging.getLogger(__name__)

# The demo's sizes (layered under the user's overrides; model and data paths are filled in at start-up).
DEMO_PRESET: dict[str, Any] = {
    "data": {
        "train_batch_size": 16,
        "max_prompt_length": 32,
        "max_response_length": 8,
        "dataloader_num_workers": 0,
        "shuffle": True,
        "seed": 1,
    },
    "actor_rollout_ref": {
        "model": {"enable_gradient_checkpointing": False},
        "actor": {
            "ppo_mini_batch_size": 16,
            "ppo_micro_batch_size_per_gpu": 64,
            "use_kl_loss": False,
            "optim": {"lr": 3e-3},
            "fsdp_config": {"dtype": "float32"},
            "entropy_coeff": 0.0,
        },
        "rollout": {
            "name": "hf",
            "n": 4,
            "dtype": "float32",
            "log_prob_micro_batch_size_per_gpu": 64,
            "tensor_model_parallel_size": 1,
        },
        "ref": {"fsdp_config": {"dtype": "float32"}},
    },
    "algorithm": {"adv_estimator": "grpo"},
    "trainer": {
        "n_gpus_per_node": 1,
        "nnodes": 1,
        "logger": ["console"],
        "total_epochs": 1,
        "total_training_steps": 40,
        "val_before_train": False,
        "test_freq": -1,
        "save_freq": -1,
        "project_name": "verl_demo",
        "experiment_name": "grpo_arithmetic",
    },
}


def demo_preset() -> DictConfig:
    """The demo preset with the built-in assets' paths (materialised on first use)."""
    from verl.utils.demo import ensure_demo_assets

    assets = ensure_demo_assets()
    preset = OmegaConf.create(DEMO_PRESET)
    preset.actor_rollout_ref.model.path = str(assets.model_path)
    preset.data.train_files = str(assets.train_files)
    preset.data.val_files = str(assets.val_files)
    return preset


def with_demo_preset(config: DictConfig, overrides: list[str]) -> DictConfig:
    """``config`` with the demo preset under the user's ``overrides`` when they name no model and no data."""
    named = {o.lstrip("+~").split("=", 1)[0] for o in overrides}
    if "actor_rollout_ref.model.path" in named or "data.train_files" in named:
        return config
    logger.info("no model and no data given: running the built-in demo (GRPO on a tiny model, CPU)")
    user = OmegaConf.from_dotlist([o.lstrip("+") for o in overrides if not o.startswith("~")])
    return OmegaConf.merge(config, demo_preset(), user)


class TaskRunner:
    """Runs one training job inside Ray: tokenizer, data, rewards, workers, trainer."""

    def run(self, config: DictConfig) -> None:
        from transformers import AutoTokenizer

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)

        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
        from verl.trainer.ppo.reward import load_reward_manager
        from verl.trainer.ppo.utils import ResourcePoolManager, Role
        from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset, create_rl_sampler
        from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker

        model = config.actor_rollout_ref.model
        tokenizer = AutoTokenizer.from_pretrained(
            model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code
        )
        if model.get("custom_chat_template"):
            tokenizer.chat_template = model.custom_chat_template
        role_worker_mapping = {
            Role.ActorRolloutRef: ActorRolloutRefWorker,
            Role.Critic: CriticWorker,
            Role.RewardModel: RewardModelWorker,
        }
        spec = {"global_pool": [config.trainer.n_gpus_per_node] * config.trainer.nnodes}
        mapping = {role: "global_pool" for role in role_worker_mapping}
        manager = ResourcePoolManager(spec, mapping, use_gpu=config.trainer.get("device", "auto") != "cpu")
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
        val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1)
        train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer)
        val_dataset = (
            create_rl_dataset(config.data.val_files, config.data, tokenizer, is_train=False)
            if config.data.val_files
            else None
        )
        trainer = RayPPOTrainer(
            config,
            tokenizer,
            role_worker_mapping,
            manager,
            reward_fn=reward_fn,
            val_reward_fn=val_reward_fn,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
        )
        trainer.init_workers()
        trainer.fit()


def _worker_env() -> dict[str, str]:
    """Environment for the Ray workers: verl's own ``VERL_*`` settings travel with the job."""
    env = {"TOKENIZERS_PARALLELISM": "false", "RAY_AUTH_MODE": "disabled"}
    env.update({k: v for k, v in os.environ.items() if k.startswith("VERL_")})
    return env


def run_ppo(config: DictConfig, task_runner_class: type | None = None) -> None:
    """Validate ``config`` (every problem at once, before Ray starts), start Ray, run the job in a TaskRunner."""
    validate_config(config)
    if not ray.is_initialized():
        ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True) or {}
        ray_init = {k: v for k, v in ray_init.items() if v is not None}
        ray_init.setdefault("num_cpus", required_logical_cpus(world_size(config)))
        env = {
            "TOKENIZERS_PARALLELISM": "false",
            "RAY_AUTH_MODE": "disabled",
            "VERL_CACHE_DIR": os.environ.get("VERL_CACHE_DIR", ""),
        }
        ray.init(runtime_env={"env_vars": {k: v for k, v in env.items() if v}}, include_dashboard=False, **ray_init)
    runner_cls = ray.remote(num_cpus=0, runtime_env={"env_vars": _worker_env()})(task_runner_class or TaskRunner)
    ray.get(runner_cls.remote().run.remote(config))


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """The command-line entry point."""
    from hydra.core.hydra_config import HydraConfig

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    config = with_demo_preset(config, list(HydraConfig.get().overrides.task))
    run_ppo(config)


if __name__ == "__main__":
    main()
