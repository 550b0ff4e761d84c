"""Validate the whole trainer config before any worker starts, reporting every problem at once.

Each problem names the key, the value and the fix. Checks: keys that the schema does not have (the composed
``ppo_trainer`` config, plus what a recipe's own yaml declares: `verl.trainer.config.schema`; ``_target_`` keys
are accepted anywhere), values of the wrong type, the config dataclasses' own validation, batch sizes that do not
divide over the workers, the rollout engine's limits (``rollout.mode``, vLLM's tensor-parallel size), the
``async_training`` settings against ``trainer.mode`` (`verl.trainer.config.validate_async`), the profiler, and keys
verl accepts but does not act on
(`verl.trainer.config.unread`: a value without effect here logs a warning; a value whose meaning verl would get
wrong is an error). With ``check_environment``, also what
this machine must have: the rollout engine's package, the local model folders and the ``model.external_lib``
modules.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.base_config import omega_conf_to_dataclass
from verl.trainer.config.algorithm import SUM_PI_SQUARED_ESTIMATORS, AlgoConfig
from verl.trainer.config.compose import CONFIG_DIR, compose_config, is_group_override
from verl.trainer.config.derived import (
    RESIDENT_BACKENDS,
    SEPARATE_BACKENDS,
    uses_bypass_mode,
)
from verl.trainer.config.errors import ConfigError
from verl.trainer.config.layout import resolve_layout, rollout_pool, trainer_mode, trainer_mode_name
from verl.trainer.config.schema import PLUS_KEYS, extend_schema, running_schema
from verl.trainer.config.unread import is_away, report_unread
from verl.trainer.config.validate_async import check_async_training
from verl.trainer.config.validate_distillation import check_distillation
from verl.trainer.config.validate_engine import check_model_engine, role_dp_size
from verl.trainer.config.validate_lora import check_lora
from verl.trainer.config.validate_reward import check_reward
from verl.trainer.config.validate_v1 import check_v1_trainer
from verl.trainer.ppo.v1.trainer_base import registered_trainers
from verl.workers.config import ActorConfig, CriticConfig, HFModelConfig, RefConfig, RolloutConfig
from verl.workers.config.rollout import ROLLOUT_MODES

__all__ = ["ConfigError", "base_config", "need_critic", "need_reference_policy", "validate_config", "world_size"]

logger = logging.getLogger(__name__)

BASE_YAML = CONFIG_DIR / "ppo_trainer.yaml"
TARGET = "_target_"


def base_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The schema and defaults: ``ppo_trainer`` composed from its Hydra groups (cached; a fresh copy each call,
    struct mode off). ``overrides``: Hydra overrides, e.g. ``["actor@actor_rollout_ref.actor=dp_actor"]``."""
    return compose_config("ppo_trainer", tuple(overrides))


def world_size(config: Any) -> int:
    """Worker processes of the global pool: ``trainer.n_gpus_per_node × trainer.nnodes``."""
    return int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)


def rollout_pool_size(config: Any) -> int:
    """Rollout servers on a pool of their own (``trainer.v1.trainer_mode=separate_async``):
    ``actor_rollout_ref.rollout.n_gpus_per_node × nnodes`` (the older top-level ``rollout.*`` are read into them:
    `verl.trainer.config.layout`); 0 in the other modes."""
    if trainer_mode(config) != "separate_async":
        return 0
    nnodes, n_gpus_per_node = rollout_pool(config)
    return nnodes * n_gpus_per_node


def need_critic(config: Any) -> bool:
    """A critic runs when ``critic.enable`` says so, or (unset) when the estimator is GAE."""
    enable = config.critic.get("enable")
    return bool(enable) if enable is not None else config.algorithm.adv_estimator == "gae"


def need_reference_policy(config: Any) -> bool:
    """A reference policy runs when a KL term needs it."""
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def _is_open(value: Any) -> bool:
    """A schema dict that accepts any keys (an empty mapping such as ``engine_kwargs`` or ``override_config``)."""
    return isinstance(value, DictConfig) and len(value) == 0


# Keys that take a string or a list of strings (veRL accepts both).
STR_OR_LIST_KEYS = (
    "data.train_files",
    "data.val_files",
    "trainer.logger",
    "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.model.exclude_modules",
    "critic.model.target_modules",
    "model.target_modules",  # the SFT trainer's
)


def _type_problem(key: str, value: Any, default: Any) -> str | None:
    if key in STR_OR_LIST_KEYS and isinstance(value, ListConfig | list | str):
        return None
    if isinstance(default, str) and default.startswith("${"):  # the schema links it to another key: any type
        return None
    if default is None or value is None or isinstance(value, str) and value.startswith("${"):
        return None
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, ListConfig | list):
        ok = isinstance(value, ListConfig | list)
    else:
        return None
    if ok:
        return None
    return f"{key}={value!r} has the wrong type: expected {type(default).__name__} (default {default!r})"


def _walk(user: DictConfig, schema: DictConfig, prefix: str, problems: list[str]) -> None:
    """Unknown keys and wrong types of ``user`` against ``schema`` (both DictConfigs, unresolved)."""
    for key in user:
        path = f"{prefix}.{key}" if prefix else str(key)
        if key == TARGET:  # veRL's dataclass pointers: accepted anywhere, ignored when building
            continue
        if key not in schema and path in PLUS_KEYS:
            continue
        if key not in schema:
            known = ", ".join(sorted(str(k) for k in schema if k != TARGET))
            problems.append(f"unknown key {path!r}; the keys at {prefix or 'the top level'} are: {known}")
            continue
        unode, snode = user._get_node(key), schema._get_node(key)
        if isinstance(snode, DictConfig):
            if isinstance(unode, DictConfig):
                if not _is_open(snode):
                    _walk(unode, snode, path, problems)
            elif unode._value() is not None and not OmegaConf.is_interpolation(user, key):
                problems.append(f"{path} must be a mapping like its default, got {unode._value()!r}")
            continue
        problem = _type_problem(path, unode._value(), snode._value())
        if problem:
            problems.append(problem)


def _dataclass_problem(builder, section: str, problems: list[str]) -> Any:
    try:
        return builder()
    except (ValueError, TypeError) as e:
        problems.append(f"{section}: {e}")
        return None


def _sizes(config: Any, problems: list[str]) -> None:
    workers = world_size(config)
    data, actor, rollout = config.data, config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    samples = data.train_batch_size * rollout.n
    if samples % workers:
        problems.append(
            f"data.train_batch_size × actor_rollout_ref.rollout.n = {data.train_batch_size} × {rollout.n} = {samples} "
            f"is not divisible by {workers} workers (trainer.n_gpus_per_node × trainer.nnodes); change the batch size "
            "or the worker count"
        )
    if actor.ppo_mini_batch_size > data.train_batch_size:
        problems.append(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} is larger than "
            f"data.train_batch_size={data.train_batch_size}; lower it"
        )
    if not actor.use_dynamic_bsz and actor.ppo_micro_batch_size_per_gpu is None:
        problems.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is required unless use_dynamic_bsz=true")
    if not rollout.log_prob_use_dynamic_bsz and rollout.log_prob_micro_batch_size_per_gpu is None:
        problems.append(
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu is required unless log_prob_use_dynamic_bsz"
        )
    if need_critic(config):
        critic = config.critic
        if not critic.use_dynamic_bsz and critic.ppo_micro_batch_size_per_gpu is None:
            problems.append("critic.ppo_micro_batch_size_per_gpu is required (the critic runs: adv_estimator=gae)")


def _trainer(config: Any, problems: list[str]) -> None:
    mode = trainer_mode_name(config)
    if mode not in registered_trainers():  # a mode of register_trainer: its module imported (model.external_lib)
        problems.append(f"trainer.v1.trainer_mode={mode!r}; use one of {registered_trainers()}")
    check_model_engine(config, max(world_size(config), 1), problems)
    device = config.trainer.get("device", "auto")
    if device not in ("auto", "cpu", "cuda"):
        problems.append(f"trainer.device={device!r}; use auto, cpu or cuda")
    elif device == "cuda":
        import torch

        if not torch.cuda.is_available():
            problems.append("trainer.device=cuda but no CUDA device is visible; use trainer.device=auto or cpu")
    if world_size(config) < 1:
        problems.append("trainer.n_gpus_per_node × trainer.nnodes must be at least 1")
    for key, value in (
        ("trainer.custom_resources", config.trainer.get("custom_resources")),
        ("rollout.custom_resources", (config.get("rollout") or {}).get("custom_resources")),
    ):
        _custom_resources(key, value, problems)
    _resume(config.trainer, problems)
    check_async_training(config, mode, problems)


def _custom_resources(key: str, value: Any, problems: list[str]) -> None:
    """null, or a mapping of Ray custom resource names to amounts > 0 per bundle (not Ray's own CPU / GPU /
    memory)."""
    if value is None:
        return
    if not isinstance(value, Mapping) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in value.values()
    ):
        problems.append(f"{key}={value!r} must be null or a mapping of Ray resource names to amounts > 0")
        return
    reserved = sorted(set(map(str, value)) & {"CPU", "GPU", "memory", "object_store_memory"})
    if reserved:
        problems.append(
            f"{key}: {reserved} are Ray's own resources; name custom node resources (ray start --resources)"
        )


def _resume(trainer: Any, problems: list[str]) -> None:
    mode = trainer.resume_mode
    if mode not in ("auto", "disable", "resume_path"):
        problems.append(f"trainer.resume_mode={mode!r}; use auto, disable or resume_path")
    elif mode == "resume_path":
        path = trainer.resume_from_path
        if not path or "global_step_" not in os.path.basename(os.path.normpath(str(path))):
            problems.append(
                f"trainer.resume_mode=resume_path needs trainer.resume_from_path to be a global_step_<N> folder, "
                f"got {path!r}"
            )
    for key in ("max_actor_ckpt_to_keep", "max_critic_ckpt_to_keep"):
        value = trainer.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            problems.append(f"trainer.{key}={value!r} must be null (keep all) or a positive integer")
    if trainer.get("default_hdfs_dir"):
        problems.append("trainer.default_hdfs_dir: copying checkpoints to HDFS is not supported; leave it null")


def _rollout(config: Any, problems: list[str]) -> None:
    """``rollout.mode`` and the engines' limits, checked here so that they fail before Ray starts."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.mode not in ROLLOUT_MODES:
        problems.append(
            f"actor_rollout_ref.rollout.mode={rollout.mode!r}: use async (veRL's default) or sync; both take the "
            "same generation path here"
        )
    backend = (rollout.get("checkpoint_engine") or {}).get("backend", "naive")
    mode = trainer_mode(config)
    if mode == "sync" and backend == "shm":
        problems.append(
            "actor_rollout_ref.rollout.checkpoint_engine.backend=shm pushes weights into a rollout engine in another "
            "process of the node (trainer.v1.trainer_mode=colocate_async); the hybrid engine of the sync mode holds "
            "it in the training process: use backend=naive"
        )
    elif mode == "sync" and backend in ("gloo", "nccl"):
        problems.append(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend} broadcasts weights to rollout replicas on "
            "a pool of their own (trainer.v1.trainer_mode=separate_async); the hybrid engine of the sync mode holds "
            "the engine in the training process: use backend=naive"
        )
    elif mode == "colocate_async" and backend not in RESIDENT_BACKENDS:
        problems.append(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend!r}: trainer.v1.trainer_mode=colocate_async "
            f"pushes weights to the rollout servers of the node with one of {sorted(RESIDENT_BACKENDS)}"
        )
    elif mode == "separate_async" and backend not in SEPARATE_BACKENDS:
        problems.append(
            f"actor_rollout_ref.rollout.checkpoint_engine.backend={backend!r}: trainer.v1.trainer_mode=separate_async "
            f"pushes weights to the rollout pool over torch.distributed with one of {sorted(SEPARATE_BACKENDS)}"
        )
    tp = rollout.tensor_model_parallel_size
    if rollout.name == "vllm" and tp != 1:
        problems.append(
            f"actor_rollout_ref.rollout.name=vllm with actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: "
            "the in-process vLLM engine runs one engine per training rank (tensor parallel size 1); set "
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1"
        )
    elif rollout.name == "hf" and tp != 1:
        logger.warning(
            "actor_rollout_ref.rollout.tensor_model_parallel_size=%r has no effect here: the hf engine does not shard "
            "generation (each training rank generates its own share); set it to 1 to silence this warning",
            tp,
        )


def _agent_loops(config: Any, problems: list[str], check_environment: bool) -> None:
    """``rollout.agent.default_agent_loop`` names a registered loop or one of ``agent_loop_config_path``'s entries
    (the file is read, its targets are imported by the agent-loop workers)."""
    from verl.experimental.agent_loop.agent_loop import registered_agent_loops
    from verl.utils.import_utils import import_external_libs

    agent = config.actor_rollout_ref.rollout.agent
    key = "actor_rollout_ref.rollout.agent"
    if check_environment:
        with contextlib.suppress(Exception):  # a bad external_lib is reported by _external_libs
            import_external_libs(config.actor_rollout_ref.model.get("external_lib"))
    names = set(registered_agent_loops())
    path = agent.get("agent_loop_config_path")
    if path:
        if not os.path.isfile(path):
            if check_environment:
                problems.append(f"{key}.agent_loop_config_path={path!r}: no such file")
            return
        try:
            entries = OmegaConf.load(path)
        except Exception as e:  # noqa: BLE001 - any parse error is reported with the file
            problems.append(f"{key}.agent_loop_config_path={path!r}: not a YAML file: {e}")
            return
        if not isinstance(entries, ListConfig) or not all(isinstance(e, DictConfig) and e.get("name") for e in entries):
            problems.append(f"{key}.agent_loop_config_path={path!r}: must hold a list of {{name, _target_}} entries")
            return
        names.update(str(entry.name) for entry in entries)
    default = agent.default_agent_loop
    if default not in names:
        problems.append(
            f"{key}.default_agent_loop={default!r}: no agent loop of that name; registered: {sorted(names)} (add it "
            f"with {key}.agent_loop_config_path or @register in actor_rollout_ref.model.external_lib)"
        )


def _multi_turn(config: Any, problems: list[str], check_environment: bool) -> None:
    """``rollout.multi_turn``: the tool and interaction YAML files are loaded now (tools are built: a tool whose
    isolation cannot be set up, like the Python sandbox on a machine without namespaces, fails here)."""
    turn = config.actor_rollout_ref.rollout.multi_turn
    key = "actor_rollout_ref.rollout.multi_turn"
    data_tools = config.data.get("tool_config_path")
    if data_tools and turn.get("tool_config_path") and data_tools != turn.tool_config_path:
        problems.append(
            f"data.tool_config_path={data_tools!r} differs from {key}.tool_config_path={turn.tool_config_path!r}: "
            "the prompts would show other tools than the rollout runs"
        )
    from verl.experimental.agent_loop.tool_parser import ToolParser

    if turn.format not in ToolParser.names():
        problems.append(f"{key}.format={turn.format!r}: no tool-call parser of that name; known: {ToolParser.names()}")
    if not check_environment:
        return
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
    from verl.tools.tool_registry import load_all_tools

    if turn.get("tool_config_path") or turn.get("function_tool_path"):
        try:  # the YAML tools and the @function_tool file together (a name in both is an error naming both)
            load_all_tools(turn.get("tool_config_path"), turn.get("function_tool_path"))
        except Exception as e:  # noqa: BLE001 - every loading problem is reported with the key
            which = [n for n in ("tool_config_path", "function_tool_path") if turn.get(n)]
            problems.append(f"{key}.{' / '.join(which)}: {e}")
    if turn.get("interaction_config_path"):
        try:
            initialize_interactions_from_config(turn.interaction_config_path)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{key}.interaction_config_path: {e}")
    sources = ("tool_config_path", "function_tool_path", "interaction_config_path")
    if turn.enable and not any(turn.get(n) for n in sources):
        logger.warning(
            "%s.enable=True without tool_config_path, function_tool_path or interaction_config_path: no tools to call",
            key,
        )


def _profiler(config: Any, problems: list[str]) -> None:
    profiler = config.get("global_profiler") or {}
    tool = profiler.get("tool")
    if tool is not None and tool != "torch":
        problems.append(
            f"global_profiler.tool={tool!r}: only tool=torch is available here (torch.profiler over the steps in "
            "global_profiler.steps); use global_profiler.tool=torch or null"
        )
    steps = profiler.get("steps")
    if steps is not None and (
        not isinstance(steps, ListConfig | list) or any(isinstance(s, bool) or not isinstance(s, int) for s in steps)
    ):
        problems.append(f"global_profiler.steps={steps!r} must be null or a list of step numbers, e.g. [1, 5]")


def _looks_local(path: str) -> bool:
    """A path rather than a Hugging Face hub id such as ``Qwen/Qwen2.5-0.5B``."""
    return os.path.isabs(path) or path in (".", "..") or path.startswith(("~", "./", "../"))


def _running_model_keys(config: Any, leaf: str) -> list[str]:
    """``<role>.model.<leaf>`` of the roles that run: the actor always, the critic and the reward model when used."""
    roles = (
        ["actor_rollout_ref"]
        + ["critic"] * need_critic(config)
        + ["reward_model"] * bool(config.reward.reward_model.enable)
    )
    return [f"{role}.model.{leaf}" for role in roles]


def _local_paths(config: Any, problems: list[str]) -> None:
    """Local-looking model and tokenizer paths must be folders (a hub id is left to the loader)."""
    keys = ["actor_rollout_ref.model.tokenizer_path", *_running_model_keys(config, "path")]
    seen = set()
    for key in keys:
        value = OmegaConf.select(config, key, default=None)
        if not isinstance(value, str) or not value or value in seen:
            continue
        seen.add(value)
        if _looks_local(value) and not os.path.isdir(os.path.expanduser(value)):
            problems.append(f"{key}={value!r}: no such directory; give the path of an existing local model folder")


def _external_libs(config: Any, problems: list[str]) -> None:
    """Every ``model.external_lib`` of a role that runs must name an importable module."""
    seen = set()
    for key in _running_model_keys(config, "external_lib"):
        value = OmegaConf.select(config, key, default=None)
        names = [value] if isinstance(value, str) else list(value) if isinstance(value, ListConfig | list) else None
        if value is not None and (names is None or not all(isinstance(n, str) and n for n in names)):
            problems.append(f"{key}={value!r} must be a module name or a list of module names")
            continue
        for name in names or []:
            if name in seen:
                continue
            seen.add(name)
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):  # a missing parent package
                found = False
            if not found:
                problems.append(f"{key}={name!r}: no module named {name!r}; install it or fix the module name")


def _rollout_engine(config: Any, problems: list[str]) -> None:
    from verl.workers.rollout.registry import rollout_unavailable_reason

    name = config.actor_rollout_ref.rollout.name
    reason = rollout_unavailable_reason(name) if isinstance(name, str) else None
    if reason:
        problems.append(f"actor_rollout_ref.rollout.name={name!r}: {reason}; or use rollout.name=hf")


def _estimator(config: Any, problems: list[str]) -> None:
    estimator = config.algorithm.adv_estimator
    actor = config.actor_rollout_ref.actor
    if estimator in SUM_PI_SQUARED_ESTIMATORS and not actor.calculate_sum_pi_squared:
        problems.append(
            f"algorithm.adv_estimator={estimator!r} needs Σπ² per token from the old-log-prob pass: set "
            "actor_rollout_ref.actor.calculate_sum_pi_squared=true"
        )
    filter_groups = config.algorithm.get("filter_groups") or {}
    data = config.data
    if filter_groups.get("enable", False):
        if filter_groups.get("metric") == "seq_final_reward" and config.algorithm.use_kl_in_reward:
            problems.append(
                "algorithm.filter_groups.metric='seq_final_reward' with algorithm.use_kl_in_reward: the groups are "
                "filtered before the KL penalty exists; use 'seq_reward' or a reward metric such as 'acc'"
            )
    elif data.get("gen_batch_size", data.train_batch_size) != data.train_batch_size:
        problems.append(
            f"data.gen_batch_size={data.gen_batch_size} differs from data.train_batch_size={data.train_batch_size}: "
            "only dynamic sampling (algorithm.filter_groups.enable=true) generates more prompts than it trains on"
        )
    with contextlib.suppress(ValueError, TypeError):  # a bad async_training section is reported on its own
        if estimator in SUM_PI_SQUARED_ESTIMATORS and uses_bypass_mode(config):
            problems.append(
                f"algorithm.adv_estimator={estimator!r} needs the old-log-prob pass, which the bypass mode skips "
                "(algorithm.rollout_correction.bypass_mode or async_training.use_rollout_log_probs)"
            )


def _only_base(config: DictConfig, base: DictConfig, prefix: str = "") -> DictConfig:
    """``config`` without the keys a recipe's schema added (under non-open base mappings), so the config dataclasses
    are checked on the keys they know (veRL's ``+`` keys, `PLUS_KEYS`, among them); the recipe's own code reads the
    rest."""
    for key in list(config):
        path = f"{prefix}{key}"
        if key == TARGET or path in PLUS_KEYS:
            continue
        if key not in base:
            del config[key]
            continue
        node, bnode = config._get_node(key), base._get_node(key)
        if isinstance(node, DictConfig) and isinstance(bnode, DictConfig) and not _is_open(bnode):
            _only_base(node, bnode, f"{path}.")
    return config


def _own_keys_schema(config: DictConfig, base: DictConfig) -> tuple[DictConfig, list[str]]:
    """Outside a Hydra app (a recipe's TaskRunner actor validating what its yaml composed): ``base`` extended by
    the config's own keys, typos of base keys still reported; the keys added are logged."""
    schema, problems = extend_schema(base, config, where="the config (validated outside its Hydra app)")

    def added(b: DictConfig, s: DictConfig, prefix: str) -> list[str]:
        out = []
        for key in s:
            if key not in b:
                out.append(f"{prefix}{key}")
            elif isinstance(s._get_node(key), DictConfig) and isinstance(b._get_node(key), DictConfig):
                out += added(b._get_node(key), s._get_node(key), f"{prefix}{key}.")
        return out

    keys = added(base, schema, "")
    if keys:
        logger.warning(
            "validating outside a Hydra app: keys verl does not know are taken as the recipe's own (its code reads "
            "them): %s",
            ", ".join(keys),
        )
    return schema, problems


def validate_config(
    config: DictConfig,
    check_environment: bool = True,
    schema: DictConfig | None = None,
    own_keys_declared: bool = False,
) -> None:
    """Raise `ConfigError` listing every problem of ``config`` (a composed trainer config). ``check_environment``:
    also check that this environment can run it (the rollout engine's package is installed, local model paths are
    folders, ``model.external_lib`` modules import); off to check a config meant for another machine. Keys accepted
    but not acted on log a warning when set (see `verl.trainer.config.unread`).

    ``schema``: the keys allowed (default: the base config, plus, under a running Hydra app whose primary config is
    a recipe's yaml, the keys that yaml declares; see `verl.trainer.config.schema`). ``own_keys_declared``: outside
    a Hydra app, take the config's own extra keys as declared (veRL's ``verl.utils.config.validate_config``, called
    by recipes in their TaskRunner actor, where the recipe's yaml cannot be found)."""
    problems: list[str] = []
    # the schema of the model engine's role configs (model_engine=megatron: ppo_megatron_trainer's)
    base = base_config(["model_engine=megatron"] if config.get("model_engine", "dp") == "megatron" else [])
    if schema is None:
        found = running_schema(base)
        if found is None and own_keys_declared:
            from hydra.core.hydra_config import HydraConfig

            if not HydraConfig.initialized():
                found = _own_keys_schema(config, base)
        if found is not None:
            schema, problems = found[0], list(found[1])
    _walk(config, schema if schema is not None else base, "", problems)
    if problems:  # unknown keys / wrong types: the rest would only repeat them
        raise ConfigError(problems)
    config = resolve_layout(copy.deepcopy(config), base)  # veRL's older names read into the newer ones
    resolved = OmegaConf.to_container(config, resolve=True)
    cfg = _only_base(OmegaConf.create(resolved), base)
    arr = cfg.actor_rollout_ref
    _dataclass_problem(lambda: omega_conf_to_dataclass(arr.model, HFModelConfig), "actor_rollout_ref.model", problems)
    # a bad rollout.mode is reported by _rollout; check the rest of the rollout section as if it were async
    rollout_cfg = arr.rollout if arr.rollout.mode in ROLLOUT_MODES else OmegaConf.merge(arr.rollout, {"mode": "async"})
    rollout = _dataclass_problem(
        lambda: omega_conf_to_dataclass(rollout_cfg, RolloutConfig), "actor_rollout_ref.rollout", problems
    )
    n = rollout.n if rollout is not None else 1
    workers = max(world_size(cfg), 1)
    _dataclass_problem(
        lambda: dataclasses.replace(
            omega_conf_to_dataclass(arr.actor, ActorConfig),
            rollout_n=n,
            data_parallel_size=role_dp_size(arr.actor, workers),
        ),
        "actor_rollout_ref.actor",
        problems,
    )
    if need_reference_policy(cfg):
        _dataclass_problem(lambda: omega_conf_to_dataclass(arr.ref, RefConfig), "actor_rollout_ref.ref", problems)
    if need_critic(cfg):
        _dataclass_problem(
            lambda: dataclasses.replace(
                omega_conf_to_dataclass(cfg.critic, CriticConfig), data_parallel_size=role_dp_size(cfg.critic, workers)
            ),
            "critic",
            problems,
        )
    _dataclass_problem(lambda: omega_conf_to_dataclass(cfg.algorithm, AlgoConfig), "algorithm", problems)
    _sizes(cfg, problems)
    _trainer(cfg, problems)
    _rollout(cfg, problems)
    _agent_loops(cfg, problems, check_environment)
    _multi_turn(cfg, problems, check_environment)
    _profiler(cfg, problems)
    report_unread(config, problems, base)
    sync_step_set = is_away(config, base, "trainer.v1.separate_async.parameter_sync_step")
    check_v1_trainer(cfg, trainer_mode(cfg), problems, sync_step_set, check_environment)
    _estimator(cfg, problems)
    check_reward(cfg, problems)
    check_distillation(cfg, problems)
    check_lora(cfg, problems, check_environment, base)
    if check_environment:
        _rollout_engine(cfg, problems)
        _local_paths(cfg, problems)
        _external_libs(cfg, problems)
    if problems:
        raise ConfigError(problems)


def merged(overrides: Mapping[str, Any] | list[str] | None = None) -> DictConfig:
    """The base config with ``overrides``: a dotlist like ``["data.train_batch_size=8"]`` (group selections such as
    ``actor@actor_rollout_ref.actor=dp_actor`` are composed by Hydra; keys are merged, so an unknown key stays for
    validation to report) or a nested mapping."""
    if overrides is None:
        return base_config()
    if not isinstance(overrides, list):
        return OmegaConf.merge(base_config(), OmegaConf.create(overrides))
    groups = [o for o in overrides if is_group_override(o)]
    keys = [o for o in overrides if not is_group_override(o)]
    return OmegaConf.merge(base_config(groups), OmegaConf.from_dotlist(keys))
