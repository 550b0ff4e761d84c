"""The SFT trainer's config (``sft_trainer.yaml``): start-up validation and the typed views the trainer reads.

`validate_sft_config` reports every problem of a composed config at once, as `ConfigError`, before any process
group starts (the same rules as the RL trainer's `verl.trainer.config.validate`): keys the YAML does not have and
values of the wrong type; values out of range; keys accepted for veRL's command lines that do nothing here
(`SFT_UNREAD`: a warning naming the key when it is harmless, an error when ignoring it would change the result);
with ``check_environment``, the local model folder, the data files and the ``external_lib`` modules.

`build_engine_config` / `build_optim_config` map veRL's SFT keys onto the engine's ``FSDPEngineConfig`` and
``FSDPOptimizerConfig``; `SFTSettings` is the frozen, typed view of the rest.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.base_config import BaseConfig
from verl.trainer.config.compose import compose_config
from verl.trainer.config.unread import Unread
from verl.trainer.config.validate import ConfigError, _walk
from verl.workers.config.checkpoint import CHECKPOINT_CONTENTS
from verl.workers.config.engine import FSDP_STRATEGIES, FSDPEngineConfig
from verl.workers.config.lora import LoraSpec
from verl.workers.config.optimizer import LR_SCHEDULER_TYPES, FSDPOptimizerConfig

__all__ = [
    "RESUME_MODES",
    "SFT_CONFIG_NAME",
    "SFT_UNREAD",
    "TRUNCATION_MODES",
    "SFTSettings",
    "build_engine_config",
    "build_optim_config",
    "launcher_world_size",
    "sft_base_config",
    "sft_settings",
    "validate_sft_config",
]

logger = logging.getLogger(__name__)

SFT_CONFIG_NAME = "sft_trainer"
TRUNCATION_MODES = ("error", "left", "right")
RESUME_MODES = ("auto", "disable", "resume_path")
DEVICES = ("auto", "cpu", "cuda")
# What every SFT checkpoint holds (exact resume needs all of them); "hf_model" (the full weights) is always saved too.
REQUIRED_CONTENTS = ("model", "optimizer", "extra")

# Keys accepted so that veRL's SFT command lines keep working, but that nothing here acts on (see
# verl.trainer.config.unread for the meaning of "warn" and "error").
SFT_UNREAD: tuple[Unread, ...] = (
    Unread("data.micro_batch_size", "warn", "micro-batches follow data.micro_batch_size_per_gpu"),
    Unread(
        "data.balance_dp_token",
        "warn",
        "the loss is always the token mean over the whole global batch (balanced over ranks and micro-batches)",
    ),
    Unread("data.use_shm", "warn", "the data files are read in place (no shared-memory copy)"),
    Unread("model.fsdp_config.wrap_policy.min_num_params", "warn", "FSDP2 shards each decoder layer"),
    Unread("model.use_liger", "warn", "Liger kernels are not used"),
    Unread("ulysses_sequence_parallel_size", "error", "sequence parallelism is not implemented"),
    Unread(
        "use_remove_padding",
        "warn",
        "micro-batches are forwarded padded (trailing padding trimmed); the loss is the same",
    ),
    Unread("trainer.default_hdfs_dir", "error", "copying checkpoints to HDFS is not supported"),
)


def sft_base_config() -> DictConfig:
    """The schema and defaults: ``sft_trainer.yaml`` composed by Hydra (a fresh copy, struct mode off)."""
    return compose_config(SFT_CONFIG_NAME)


def launcher_world_size() -> int:
    """The number of processes the launcher started: torchrun's ``WORLD_SIZE``, else 1 (plain ``python -m``)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value


def _render(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _report_unread(config: DictConfig, base: DictConfig, problems: list[str]) -> None:
    for entry in SFT_UNREAD:
        value = _plain(OmegaConf.select(config, entry.key, default=None))
        default = _plain(OmegaConf.select(base, entry.key, default=None))
        if value == default or any(value == h and type(value) is type(h) for h in entry.harmless):
            continue
        if entry.consequence == "error":
            problems.append(f"{entry.key}={value!r}: {entry.why}; leave it at {_render(default)}")
        else:
            logger.warning("%s=%r has no effect here: %s", entry.key, value, entry.why)


def _positive_int(problems: list[str], key: str, value: Any, allow: tuple = ()) -> None:
    if value in allow and not isinstance(value, bool):
        return
    if not _is_int(value) or value < 1:
        extra = f" or {', '.join(_render(a) for a in allow)}" if allow else ""
        problems.append(f"{key}={value!r} must be an integer >= 1{extra}")


def _data(data: Any, world: int, problems: list[str]) -> None:
    if not data.train_files:
        problems.append("data.train_files is empty: give one parquet file or a list of them")
    _positive_int(problems, "data.train_batch_size", data.train_batch_size)
    _positive_int(problems, "data.micro_batch_size_per_gpu", data.micro_batch_size_per_gpu)
    if _is_int(data.train_batch_size) and data.train_batch_size % world:
        problems.append(
            f"data.train_batch_size={data.train_batch_size} is not divisible by the {world} ranks of this run; "
            "change the batch size or the number of processes"
        )
    _positive_int(problems, "data.max_length", data.max_length)
    if data.truncation not in TRUNCATION_MODES:
        problems.append(f"data.truncation={data.truncation!r}; use one of {list(TRUNCATION_MODES)}")
    for key in ("train_max_samples", "val_max_samples"):
        if not _is_int(data.get(key)):
            problems.append(f"data.{key}={data.get(key)!r} must be an integer (-1: all rows)")
    for key in ("prompt_dict_keys", "response_dict_keys"):
        value = _plain(data.get(key))
        if value is not None and (
            not isinstance(value, list | tuple) or not all(isinstance(k, str) and k for k in value)
        ):
            problems.append(f"data.{key}={value!r} must be null or a list of key names, e.g. [question]")
    for key in ("prompt_key", "response_key"):
        if not isinstance(data.get(key), str) or not data.get(key):
            problems.append(f"data.{key}={data.get(key)!r} must be a column name")
    multiturn = data.multiturn
    if not isinstance(multiturn.enable, bool):
        problems.append(f"data.multiturn.enable={multiturn.enable!r} must be true or false")
    if not isinstance(multiturn.messages_key, str) or not multiturn.messages_key:
        problems.append(f"data.multiturn.messages_key={multiturn.messages_key!r} must be a column name")
    for key in ("tools_key", "enable_thinking_key"):
        value = multiturn.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            problems.append(f"data.multiturn.{key}={value!r} must be a column name or null")
    if data.chat_template is not None and (not isinstance(data.chat_template, str) or not data.chat_template):
        problems.append("data.chat_template must be null or a Jinja chat template (a non-empty string)")
    custom = data.custom_cls
    if custom.path and not custom.name:
        problems.append(f"data.custom_cls.path={custom.path!r} needs data.custom_cls.name (the class name)")


def _model(model: Any, problems: list[str]) -> None:
    if not isinstance(model.partial_pretrain, str) or not model.partial_pretrain:
        problems.append("model.partial_pretrain must be the path of a Hugging Face model folder")
    if model.strategy not in FSDP_STRATEGIES:
        problems.append(f"model.strategy={model.strategy!r}; use one of {list(FSDP_STRATEGIES)} (both run FSDP2)")
    fsdp = model.fsdp_config
    if fsdp.offload_params and not fsdp.cpu_offload:
        logger.warning(
            "model.fsdp_config.offload_params=True has no effect here: it only qualifies cpu_offload (FSDP1's "
            "CPUOffload), which is false; set model.fsdp_config.cpu_offload=true or param_offload=true"
        )
    if fsdp.cpu_offload:
        from verl.utils.device import get_device_name

        if get_device_name() == "cpu":
            problems.append(
                "model.fsdp_config.cpu_offload=True (FSDP2's CPUOffloadPolicy) needs an accelerator; on a CPU "
                "device the shards already live in host memory: leave it at false"
            )
    try:
        LoraSpec.from_config(model, key="model")
    except ValueError as e:
        problems.append(str(e))
    try:
        build_engine_config(model, seed=1)
    except (ValueError, TypeError) as e:
        problems.append(str(e).replace("fsdp_config.", "model.fsdp_config."))


def _optim(optim: Any, base: Any, problems: list[str]) -> None:
    if optim.lr_scheduler not in LR_SCHEDULER_TYPES:
        hint = " (the warmup-stable-decay schedule is not implemented)" if optim.lr_scheduler == "wsd" else ""
        problems.append(f"optim.lr_scheduler={optim.lr_scheduler!r}{hint}; use one of {list(LR_SCHEDULER_TYPES)}")
        return
    ratio, alias = optim.warmup_steps_ratio, optim.get("lr_warmup_steps_ratio")
    if alias is not None and alias != ratio and ratio != base.warmup_steps_ratio:
        problems.append(
            f"optim.lr_warmup_steps_ratio={alias!r} conflicts with optim.warmup_steps_ratio={ratio!r}; set only one"
        )
        return
    for key, value in (("warmup_steps_ratio", ratio), ("lr_warmup_steps_ratio", alias)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1):
            problems.append(f"optim.{key}={value!r} must be a fraction in [0, 1]")
            return
    try:
        build_optim_config(optim, total_training_steps=-1)
    except (ValueError, TypeError) as e:
        problems.append(str(e))


def _trainer(trainer: Any, world: int, problems: list[str]) -> None:
    _positive_int(problems, "trainer.total_epochs", trainer.total_epochs)
    _positive_int(problems, "trainer.total_training_steps", trainer.total_training_steps, allow=(None,))
    for key in ("save_freq", "test_freq"):
        _positive_int(problems, f"trainer.{key}", trainer.get(key), allow=(-1,))
    _positive_int(problems, "trainer.max_ckpt_to_keep", trainer.max_ckpt_to_keep, allow=(None,))
    if not _is_int(trainer.seed):
        problems.append(f"trainer.seed={trainer.seed!r} must be an integer")
    if trainer.resume_mode not in RESUME_MODES:
        problems.append(f"trainer.resume_mode={trainer.resume_mode!r}; use one of {list(RESUME_MODES)}")
    elif trainer.resume_mode == "resume_path" or trainer.resume_from_path:
        path = trainer.resume_from_path
        if not path or "global_step_" not in os.path.basename(os.path.normpath(str(path))):
            problems.append(
                f"trainer.resume_from_path={path!r} must be a global_step_<N> checkpoint folder "
                f"(trainer.resume_mode={trainer.resume_mode})"
            )
        elif not os.path.isdir(os.path.expanduser(str(path))):
            problems.append(f"trainer.resume_from_path={path!r}: no such directory")
    checkpoint = trainer.checkpoint
    for key in ("save_contents", "load_contents"):
        contents = list(_plain(checkpoint.get(key)) or [])
        bad = [c for c in contents if c not in CHECKPOINT_CONTENTS]
        missing = [c for c in REQUIRED_CONTENTS if c not in contents]
        if bad or missing:
            problems.append(
                f"trainer.checkpoint.{key}={contents!r}: an SFT checkpoint always holds {list(REQUIRED_CONTENTS)} "
                "(exact resume needs each) plus the huggingface/ folder; leave it at [model, optimizer, extra]"
            )
    if trainer.device not in DEVICES:
        problems.append(f"trainer.device={trainer.device!r}; use one of {list(DEVICES)}")
    elif trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            problems.append("trainer.device=cuda but no CUDA device is visible; use trainer.device=auto or cpu")
    from verl.utils.tracking import available_backends

    names = [trainer.logger] if isinstance(trainer.logger, str) else list(trainer.logger or [])
    unknown = [n for n in names if n not in available_backends() and n != "tracking"]
    if unknown:
        problems.append(f"trainer.logger has unknown backend(s) {unknown}; available: {available_backends()}")
    if _is_int(trainer.nnodes) and _is_int(trainer.n_gpus_per_node):
        if trainer.nnodes * trainer.n_gpus_per_node != world:
            logger.warning(
                "trainer.nnodes × trainer.n_gpus_per_node = %d × %d, but the launcher started %d process(es): the "
                "launcher (torchrun --nproc_per_node / --nnodes) decides; these keys are only checked",
                trainer.nnodes,
                trainer.n_gpus_per_node,
                world,
            )
    else:
        problems.append("trainer.nnodes and trainer.n_gpus_per_node must be integers")


def _environment(config: Any, problems: list[str]) -> None:
    path = os.path.expanduser(str(config.model.partial_pretrain))
    if not os.path.isfile(os.path.join(path, "config.json")):
        problems.append(f"model.partial_pretrain={config.model.partial_pretrain!r}: no config.json in that folder")
    for key in ("train_files", "val_files"):
        value = config.data.get(key)
        files = [value] if isinstance(value, str) else list(value or [])
        for file in files:
            if not os.path.isfile(os.path.expanduser(str(file))):
                problems.append(f"data.{key}: {file!r} does not exist")
    lib = config.model.external_lib
    for name in [lib] if isinstance(lib, str) else list(lib or []):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            problems.append(f"model.external_lib={name!r}: no module named {name!r}")


def validate_sft_config(config: DictConfig, check_environment: bool = True, world_size: int | None = None) -> None:
    """Raise `ConfigError` listing every problem of ``config`` (a composed ``sft_trainer`` config); keys without
    effect log a warning. ``world_size``: the number of ranks (default: the launcher's, `launcher_world_size`)."""
    world = launcher_world_size() if world_size is None else world_size
    base = sft_base_config()
    problems: list[str] = []
    _walk(config, base, "", problems)
    if problems:  # unknown keys / wrong types: the rest would only repeat them
        raise ConfigError(problems)
    try:
        resolved = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    except Exception as e:  # a broken interpolation
        raise ConfigError([f"the config does not resolve: {e}"]) from e
    _report_unread(config, base, problems)
    _data(resolved.data, world, problems)
    _model(resolved.model, problems)
    _optim(resolved.optim, base.optim, problems)
    _trainer(resolved.trainer, world, problems)
    if check_environment and not problems:
        _environment(resolved, problems)
    if problems:
        raise ConfigError(problems)


# --------------------------------------------------------------------------------------------- typed views
def build_engine_config(model: Any, seed: int) -> FSDPEngineConfig:
    """``model.fsdp_config`` (veRL's SFT keys) as the engine's ``FSDPEngineConfig``: ``cpu_offload`` becomes
    FSDP2's ``offload_policy``; ``strategy`` comes from ``model.strategy``, ``seed`` from ``trainer.seed``."""
    fsdp = _plain(model.fsdp_config)
    return FSDPEngineConfig(
        wrap_policy=dict(fsdp.get("wrap_policy") or {}),
        param_offload=fsdp["param_offload"],
        optimizer_offload=fsdp["optimizer_offload"],
        offload_policy=fsdp["cpu_offload"],
        reshard_after_forward=fsdp["reshard_after_forward"],
        fsdp_size=fsdp["fsdp_size"],
        forward_prefetch=fsdp["forward_prefetch"],
        model_dtype=fsdp["model_dtype"],
        dtype=fsdp["dtype"],
        mixed_precision=fsdp.get("mixed_precision"),
        seed=seed,
        strategy=model.strategy,
    )


def build_optim_config(optim: Any, total_training_steps: int) -> FSDPOptimizerConfig:
    """``optim.*`` (veRL's SFT keys) as the engine's ``FSDPOptimizerConfig``: ``lr_scheduler`` is its
    ``lr_scheduler_type``, ``warmup_steps_ratio`` (or ``lr_warmup_steps_ratio``) its ``lr_warmup_steps_ratio``;
    ``total_training_steps`` spans all epochs (the schedule's length)."""
    optim = _plain(optim)
    alias = optim.get("lr_warmup_steps_ratio")
    return FSDPOptimizerConfig(
        lr=optim["lr"],
        betas=tuple(optim["betas"]),
        weight_decay=optim["weight_decay"],
        lr_warmup_steps_ratio=optim["warmup_steps_ratio"] if alias is None else alias,
        lr_warmup_steps=-1,
        total_training_steps=total_training_steps,
        clip_grad=optim["clip_grad"],
        lr_scheduler_type=optim["lr_scheduler"],
        min_lr_ratio=0.0,
        optimizer=optim["optimizer"],
        optimizer_impl=optim["optimizer_impl"],
        override_optimizer_config=optim.get("override_optimizer_config"),
    )


@dataclass
class SFTSettings(BaseConfig):
    """The trainer-level values of a validated ``sft_trainer`` config (frozen).

    Args:
        model_path: ``model.partial_pretrain`` (user-expanded).
        train_batch_size: global batch in rows; ``micro_batch_size_per_gpu``: rows per forward on one rank.
        total_epochs / total_training_steps: the run's length (``total_training_steps`` None: all epochs).
        save_freq / test_freq: every N steps (-1: only at the end).
        seed: data order and torch's random state.
        default_local_dir: the checkpoint root; resume_mode / resume_from_path: what to resume from.
        max_ckpt_to_keep: newest checkpoints kept (None: all).
        project_name / experiment_name / logger: the trackers.
        device: auto, cpu or cuda.
        enable_gradient_checkpointing / trust_remote_code / external_lib / chat_template: model and tokenizer.
    """

    model_path: str
    train_batch_size: int
    micro_batch_size_per_gpu: int
    total_epochs: int
    total_training_steps: int | None
    save_freq: int
    test_freq: int
    seed: int
    default_local_dir: str
    resume_mode: str
    resume_from_path: str | None
    max_ckpt_to_keep: int | None
    project_name: str
    experiment_name: str
    logger: tuple[str, ...]
    device: str
    enable_gradient_checkpointing: bool
    trust_remote_code: bool
    external_lib: tuple[str, ...]
    chat_template: str | None


def sft_settings(config: Any) -> SFTSettings:
    """The `SFTSettings` of a validated config (interpolations resolved)."""
    cfg = OmegaConf.create(_plain(config)) if isinstance(config, DictConfig) else config
    trainer, model, data = cfg.trainer, cfg.model, cfg.data
    lib = model.external_lib
    loggers = [trainer.logger] if isinstance(trainer.logger, str) else list(trainer.logger or [])
    resume_from = trainer.resume_from_path
    return SFTSettings(
        model_path=os.path.expanduser(str(model.partial_pretrain)),
        train_batch_size=int(data.train_batch_size),
        micro_batch_size_per_gpu=int(data.micro_batch_size_per_gpu),
        total_epochs=int(trainer.total_epochs),
        total_training_steps=None if trainer.total_training_steps is None else int(trainer.total_training_steps),
        save_freq=int(trainer.save_freq),
        test_freq=int(trainer.test_freq),
        seed=int(trainer.seed),
        default_local_dir=os.path.expanduser(str(trainer.default_local_dir)),
        resume_mode=str(trainer.resume_mode),
        resume_from_path=None if not resume_from else os.path.expanduser(str(resume_from)),
        max_ckpt_to_keep=None if trainer.max_ckpt_to_keep is None else int(trainer.max_ckpt_to_keep),
        project_name=str(trainer.project_name),
        experiment_name=str(trainer.experiment_name),
        logger=tuple(loggers),
        device=str(trainer.device),
        enable_gradient_checkpointing=bool(model.enable_gradient_checkpointing),
        trust_remote_code=bool(model.trust_remote_code),
        external_lib=tuple([lib] if isinstance(lib, str) else list(lib or [])),
        chat_template=data.chat_template,
    )
