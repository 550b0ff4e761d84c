"""``python -m verl.trainer.main_ppo [key=value ...]``: the PPO/GRPO trainer (Hydra command line, veRL's keys).

With neither ``actor_rollout_ref.model.path`` nor ``data.train_files`` given, the built-in demo preset is layered
under the overrides: a tiny Qwen2, its tokenizer and a synthetic arithmetic task (materialised under
``$VERL_CACHE_DIR``), GRPO on one CPU worker with the console logger. See docs/quickstart.md.

``main`` → ``run_ppo`` (validates the whole config, starts Ray) → ``TaskRunner`` (in this process; a recipe's
decorated runner is a Ray actor) → ``RayPPOTrainer.init_workers()`` / ``fit()``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

from verl.experimental.reward_loop.reward_model import colocated_judge
from verl.trainer.config.layout import resolve_layout, rollout_pool, trainer_mode, trainer_mode_name
from verl.trainer.config.validate import rollout_pool_size, validate_config, world_size
from verl.trainer.config.validate_reward import reward_pool_size
from verl.trainer.constants_ppo import ppo_worker_env
from verl.utils.ray_utils import cpu_threads_per_worker, required_logical_cpus

if TYPE_CHECKING:  # imported on first use (module __getattr__): the driver does not import torch
    from verl.utils.dataset.rl_dataset import create_rl_dataset, create_rl_sampler

__all__ = [
    "DEMO_PRESET",
    "TaskRunner",
    "create_rl_dataset",
    "create_rl_sampler",
    "demo_preset",
    "load_tokenizer",
    "main",
    "run_ppo",
]

logger = logging.getLogger(__name__)

GLOBAL_POOL, REWARD_POOL, ROLLOUT_POOL, TEACHER_POOL = "global_pool", "reward_pool", "rollout_pool", "teacher_pool"

_DATASET_EXPORTS = ("create_rl_dataset", "create_rl_sampler")


def __getattr__(name: str) -> Any:
    """veRL's ``main_ppo.create_rl_dataset`` / ``create_rl_sampler``, imported on first use so that the driver
    (which only validates and starts Ray) does not import torch."""
    if name in _DATASET_EXPORTS:
        from verl.utils.dataset import rl_dataset

        return getattr(rl_dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    preset = demo_preset()
    if config.get("model_engine") == "megatron":  # the Megatron roles' engine block (fp32 for the CPU demo too)
        for role in (preset.actor_rollout_ref.actor, preset.actor_rollout_ref.ref):
            del role["fsdp_config"]
            role.megatron = {"dtype": "float32"}
        preset.critic = {"megatron": {"dtype": "float32"}}
    return OmegaConf.merge(config, preset, user)


class TaskRunner:
    """Runs one training job inside Ray: tokenizer, data, rewards, workers, trainer.

    veRL's recipe hooks: ``role_worker_mapping`` (``{Role: worker class}``) and ``mapping`` (``{Role: pool
    name}``), filled by ``add_actor_rollout_worker`` / ``add_critic_worker`` / ``add_reward_model_worker`` /
    ``add_ref_policy_worker``, and ``init_resource_pool_mgr``; a recipe subclasses it and overrides what it changes
    (and passes it to :func:`run_ppo` as ``task_runner_class``).
    """

    #: the trainer class ``run`` builds (a recipe's runner may name its ``RayPPOTrainer`` subclass here instead of
    #: rewriting ``run``); None: the class of ``trainer.v1.trainer_mode`` (``get_trainer_cls``: ``RayPPOTrainer``
    #: for the built-in modes)
    trainer_class: type | None = None

    def __init__(self) -> None:
        self.role_worker_mapping: dict[Any, Any] = {}
        self.mapping: dict[Any, str] = {}

    def add_actor_rollout_worker(self, config: DictConfig) -> tuple[type, type]:
        """Map the actor-rollout role to the FSDP worker; returns ``(worker class, worker-group class)``."""
        from verl.single_controller.ray import RayWorkerGroup
        from verl.trainer.ppo.utils import Role
        from verl.workers.fsdp_workers import ActorRolloutRefWorker

        self.role_worker_mapping[Role.ActorRollout] = ray.remote(ActorRolloutRefWorker)
        self.mapping[Role.ActorRollout] = GLOBAL_POOL
        return ActorRolloutRefWorker, RayWorkerGroup

    def add_critic_worker(self, config: DictConfig) -> None:
        """Map the critic role to the FSDP critic worker (it runs when the config needs a critic)."""
        from verl.trainer.ppo.utils import Role
        from verl.workers.fsdp_workers import CriticWorker

        self.role_worker_mapping[Role.Critic] = ray.remote(CriticWorker)
        self.mapping[Role.Critic] = GLOBAL_POOL

    def add_reward_model_worker(self, config: DictConfig) -> None:
        """The reward model's pool (when ``reward.reward_model.enable``): its own with
        ``reward.reward_model.enable_resource_pool``, else the training workers'. The model is served
        (`verl.experimental.reward_loop.reward_model`: the trainer starts its replicas); a recipe that maps
        ``Role.RewardModel`` to ``RewardModelWorker`` itself gets veRL's older path, a worker group scoring each
        batch after generation."""
        from verl.trainer.ppo.utils import Role

        if config.reward.reward_model.enable:
            own_pool = config.reward.reward_model.get("enable_resource_pool", False)
            self.mapping[Role.RewardModel] = REWARD_POOL if own_pool else GLOBAL_POOL

    def add_reward_model_resource_pool(self, config: DictConfig) -> None:
        """veRL 0.10's name of :meth:`add_reward_model_worker`."""
        self.add_reward_model_worker(config)

    def add_teacher_model_resource_pool(self, config: DictConfig) -> None:
        """veRL 0.10's teacher pool of on-policy distillation (``distillation.enabled``): ``teacher_pool`` of
        ``distillation.n_gpus_per_node × nnodes`` bundles, where the teachers' servers run."""
        from verl.trainer.ppo.utils import Role, need_teacher_policy

        if need_teacher_policy(config):
            self.mapping[Role.TeacherModel] = TEACHER_POOL

    def add_ref_policy_worker(self, config: DictConfig, ref_policy_cls: type) -> None:
        """Map the reference-policy role when a KL term needs it (it runs inside the actor's workers)."""
        from verl.trainer.ppo.utils import Role, need_reference_policy

        if need_reference_policy(config):
            self.role_worker_mapping[Role.RefPolicy] = ray.remote(ref_policy_cls)
            self.mapping[Role.RefPolicy] = GLOBAL_POOL

    def init_resource_pool_mgr(self, config: DictConfig) -> Any:
        """``global_pool`` of ``trainer.n_gpus_per_node × trainer.nnodes`` workers (and ``reward_pool`` of
        ``reward.reward_model.n_gpus_per_node × nnodes`` with ``reward.reward_model.enable_resource_pool``;
        ``rollout_pool`` of the ``actor_rollout_ref.rollout.n_gpus_per_node × nnodes`` rollout servers in
        ``trainer.v1.trainer_mode=separate_async``; ``teacher_pool`` of ``distillation.n_gpus_per_node × nnodes``
        with ``distillation.enabled``)."""
        from verl.trainer.ppo.utils import ResourcePoolManager, Role

        spec = {GLOBAL_POOL: [config.trainer.n_gpus_per_node] * config.trainer.nnodes}
        if rollout_pool_size(config):
            nnodes, n_gpus_per_node = rollout_pool(config)
            spec[ROLLOUT_POOL] = [n_gpus_per_node] * nnodes
            self.mapping[Role.Rollout] = ROLLOUT_POOL
        if config.reward.reward_model.get("enable_resource_pool", False):
            rm = config.reward.reward_model
            if rm.n_gpus_per_node <= 0 or rm.nnodes <= 0:
                raise ValueError(
                    "reward.reward_model.enable_resource_pool needs reward.reward_model.n_gpus_per_node and nnodes > 0"
                )
            spec[REWARD_POOL] = [rm.n_gpus_per_node] * rm.nnodes
        if Role.TeacherModel in self.mapping:
            spec[TEACHER_POOL] = [config.distillation.n_gpus_per_node] * config.distillation.nnodes
        use_gpu = config.trainer.get("device", "auto") != "cpu"
        resources = {GLOBAL_POOL: config.trainer.get("custom_resources"), ROLLOUT_POOL: _rollout_resources(config)}
        resources = {pool: dict(r) for pool, r in resources.items() if r}
        return ResourcePoolManager(spec, self.mapping, use_gpu=use_gpu, custom_resources=resources)

    def run(self, config: DictConfig) -> None:
        """Build everything from ``config`` and train with :attr:`trainer_class`."""
        # in an actor: INFO lines reach the driver's console; in the driver, a logging set up (Hydra's) is kept
        in_actor = ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=in_actor)

        from verl.trainer.ppo.reward import load_reward_fns
        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset, create_rl_sampler

        OmegaConf.resolve(config)
        actor_rollout_cls, ray_worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_worker(config)
        self.add_teacher_model_resource_pool(config)
        self.add_ref_policy_worker(config, actor_rollout_cls)
        tokenizer = load_tokenizer(config.actor_rollout_ref.model)
        reward_fn, val_reward_fn = load_reward_fns(config, tokenizer)
        train_dataset = create_rl_dataset(config.data.train_files, config.data, tokenizer)
        val_dataset = (
            create_rl_dataset(config.data.val_files, config.data, tokenizer, is_train=False)
            if config.data.val_files
            else None
        )
        trainer = (self.trainer_class or get_trainer_cls(trainer_mode_name(config)))(
            config,
            tokenizer,
            self.role_worker_mapping,
            self.init_resource_pool_mgr(config),
            ray_worker_group_cls=ray_worker_group_cls,
            reward_fn=reward_fn,
            val_reward_fn=val_reward_fn,
            train_dataset=train_dataset,
            val_dataset=val_dataset,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train_dataset),
        )
        trainer.init_workers()
        trainer.fit()


def load_tokenizer(model: Any) -> Any:
    """The policy's tokenizer (``model.tokenizer_path`` or ``model.path``), with ``model.custom_chat_template``."""
    from verl.utils.hf_tokenizer import hf_tokenizer

    tokenizer = hf_tokenizer(model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code)
    if model.get("custom_chat_template"):
        tokenizer.chat_template = model.custom_chat_template
    return tokenizer


def _import_external_lib(config: DictConfig) -> None:
    """Import ``actor_rollout_ref.model.external_lib`` here too, so what it registers (estimators, losses, reward
    managers) is known to validation; a module that does not exist is left for validation to report by name."""
    from verl.utils.import_utils import import_external_libs, is_package_available

    lib = OmegaConf.select(config, "actor_rollout_ref.model.external_lib")
    names = [lib] if isinstance(lib, str) else list(lib or [])
    import_external_libs([name for name in names if is_package_available(name)])


def _rollout_resources(config: DictConfig) -> Any:
    return (config.get("rollout") or {}).get("custom_resources")


def run_ppo(config: DictConfig, task_runner_class: Any = None, schema: DictConfig | None = None) -> None:
    """Validate ``config`` (every problem at once, before Ray starts), start Ray, run the job in a TaskRunner.

    ``task_runner_class``: a recipe's runner (default :class:`TaskRunner`), a plain class or one already decorated
    with ``ray.remote`` (veRL's recipes pass ``ray.remote(num_cpus=1)(MyRunner)``). A decorated runner is a Ray
    actor started with the workers' environment. A plain one runs in this process when this call starts Ray (the
    job's environment is then the workers' already): no actor to start, and the trainer's modules are imported
    while Ray starts; with Ray already initialised, it is an actor too. ``schema``: the keys allowed (default: the
    base config plus what the running Hydra app's primary yaml declares; see `verl.trainer.config.schema`)."""
    _import_external_lib(config)
    start = time.perf_counter()
    resolve_layout(config)  # veRL's older names read into the newer ones (each named in a warning)
    validate_config(config, schema=schema)
    logger.info(
        "driver: config validated in %.2f s; %.2f s of CPU since the interpreter started",
        time.perf_counter() - start,
        time.process_time(),
    )
    runner_cls = task_runner_class or TaskRunner
    in_process = not isinstance(runner_cls, ray.actor.ActorClass) and not ray.is_initialized()
    if in_process:
        warm = threading.Thread(target=_import_trainer_stack, name="verl-import", daemon=True)
        warm.start()
        _init_ray(config)
        warm.join()
        runner_cls().run(config)
        return
    if not ray.is_initialized():
        _init_ray(config)
    runtime_env = {"env_vars": ppo_worker_env(config)}
    if isinstance(runner_cls, ray.actor.ActorClass):  # decorated by the recipe: keep its options, add the env
        runner_cls = runner_cls.options(runtime_env=runtime_env)
    else:
        runner_cls = ray.remote(num_cpus=0, runtime_env=runtime_env)(runner_cls)
    ray.get(runner_cls.remote().run.remote(config))


def _init_ray(config: DictConfig) -> None:
    """``ray.init`` with ``ray_kwargs.ray_init``; the job's environment is the workers' (`ppo_worker_env`).

    A cluster of its own is sized for the config's workers, its computing processes share the cores, and the
    environment goes into this process's before Ray starts (Ray's processes inherit it): the idle workers Ray
    starts with the node then match the job and host its first actors, instead of new processes started after
    them. On an existing cluster the environment travels as the job's runtime env."""
    ray_init = OmegaConf.to_container(config.ray_kwargs.ray_init, resolve=True) or {}
    # veRL 0.10's runtime_env.py_executable: the interpreter (or `uv run ...` prefix) of Ray's worker processes
    runtime_env = {k: v for k, v in (ray_init.pop("runtime_env", None) or {}).items() if v is not None}
    ray_init = {k: v for k, v in ray_init.items() if v is not None}
    env = ppo_worker_env(config)
    if ray_init.get("address") or os.environ.get("RAY_ADDRESS"):
        ray.init(runtime_env={"env_vars": env, **runtime_env}, include_dashboard=False, **ray_init)
        return
    if runtime_env:
        ray_init["runtime_env"] = runtime_env
    workers = world_size(config) + rollout_pool_size(config) + reward_pool_size(config)
    ray_init.setdefault("num_cpus", required_logical_cpus(workers))
    if "OMP_NUM_THREADS" not in os.environ:  # Ray's default is one thread per worker
        # colocate_async runs a resident rollout server beside each training worker
        computing = workers + (world_size(config) if trainer_mode(config) == "colocate_async" else 0)
        computing += world_size(config) if colocated_judge(config) else 0  # a judge replica beside each worker
        env["OMP_NUM_THREADS"] = str(cpu_threads_per_worker(computing))
        logger.info(
            "%d computing process(es) on %s cores: OMP_NUM_THREADS=%s each (set it to override)",
            computing,
            os.cpu_count(),
            env["OMP_NUM_THREADS"],
        )
    os.environ.update(env)
    ray.init(include_dashboard=False, **ray_init)


def _import_trainer_stack() -> None:
    """What an in-process runner imports first (torch, tensordict, the trainer, the workers' classes, the
    tokenizer's and the datasets' libraries), imported beside ``ray.init``, which mostly waits on the processes it
    starts."""
    import pyarrow.parquet  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    import verl.trainer.ppo.ray_trainer  # noqa: F401
    import verl.workers.fsdp_workers  # noqa: F401


@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """The command-line entry point."""
    from hydra.core.hydra_config import HydraConfig

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    config = with_demo_preset(config, list(HydraConfig.get().overrides.task))
    run_ppo(config)


def upsert_existing_plus_overrides(argv: list[str], base: DictConfig) -> list[str]:
    """``argv`` with each ``+key=value`` whose key the config has turned into ``++key=value`` (set, not add).

    veRL 0.10's config declares keys its earlier config did not (``algorithm.filter_groups.*``), so an earlier
    script's ``+algorithm.filter_groups.enable=True`` would make Hydra refuse to add a key that exists; setting it
    is what the script means in either generation."""
    out = []
    for arg in argv:
        key = arg[1:].split("=", 1)[0] if arg.startswith("+") and not arg.startswith("++") and "=" in arg else None
        exists = key is not None and "@" not in key and OmegaConf.select(base, key, default=_ABSENT) is not _ABSENT
        out.append("+" + arg if exists else arg)
    return out


_ABSENT = object()


if __name__ == "__main__":
    import sys

    from verl.trainer.config.compose import compose_config

    sys.argv[1:] = upsert_existing_plus_overrides(sys.argv[1:], compose_config("ppo_trainer"))
    main()
