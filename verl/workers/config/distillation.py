"""On-policy distillation's config (veRL 0.10's ``distillation.*``; ``DistillationConfig``, ``DistillationLossConfig``,
``DistillationTeacherModelConfig`` at ``verl.workers.config``), read and checked once by
:meth:`DistillationConfig.from_config`.

Teachers: ``teacher_models`` maps an entry name to ``{key, model_path, num_replicas, inference}``. One entry (veRL's
default ``teacher_model``) is *the* teacher: its key becomes ``default``, every sample goes to it, and its replicas
fill the teacher pool (``n_gpus_per_node × nnodes`` ÷ the GPUs of one replica). With several entries the default
``teacher_model`` entry is dropped, as in veRL (start-up warns when it had a ``model_path``: name every teacher), each
entry needs a ``key`` and ``num_replicas``, the replicas must fill the pool exactly, and a sample goes to the teacher
whose key is its ``teacher_key`` field (:meth:`DistillationConfig.route`; an unknown value is an error naming it).
Teachers compute log-probs of the student's prompt + response: their ``inference.prompt_length`` is the student's
prompt and response lengths together, and they generate one token.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

__all__ = ["DistillationConfig", "DistillationLossConfig", "DistillationTeacherModelConfig"]

logger = logging.getLogger(__name__)

DEFAULT_TEACHER = "teacher_model"  # veRL's name of the single-teacher entry


def _loss_settings(loss_mode: str) -> Any:
    """The registered settings of ``loss_mode`` (imported here: the config is read where torch is not)."""
    from verl.algorithms.distillation import get_distillation_loss_settings

    return get_distillation_loss_settings(loss_mode)


def _plain(section: Any) -> dict[str, Any]:
    if section is None:
        return {}
    if OmegaConf.is_config(section):
        return OmegaConf.to_container(section, resolve=True)
    return dict(section)


def _known(cls: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(values) - set(cls.__dataclass_fields__) - {"_target_"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
    return {k: v for k, v in values.items() if k != "_target_"}


@dataclass(frozen=True)
class DistillationLossConfig:
    """``distillation.distillation_loss`` (veRL's YAML defaults); see :mod:`verl.algorithms.distillation`."""

    loss_mode: str = "k3"
    topk: int | None = 32
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    log_prob_min_clamp: float | None = None
    use_policy_gradient: bool = False
    policy_loss_mode: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    use_chunked_topk: bool = False
    chunked_topk_chunk_size: int = 4096

    def __post_init__(self) -> None:
        where = "distillation.distillation_loss"
        settings = _loss_settings(self.loss_mode)  # an unregistered name raises, naming them all
        if settings.use_topk and (not isinstance(self.topk, int) or self.topk <= 0):
            raise ValueError(f"{where}.topk={self.topk!r}: loss_mode={self.loss_mode} needs the teacher's top-k, k > 0")
        if self.policy_loss_mode != "vanilla":
            raise ValueError(f"{where}.policy_loss_mode={self.policy_loss_mode!r}: only 'vanilla' is built (veRL's)")
        if not self.use_policy_gradient and self.loss_mode in ("kl", "k1"):
            raise ValueError(
                f"{where}.loss_mode={self.loss_mode} with use_policy_gradient=false: the gradient of k1 does not "
                "depend on the teacher; use k3 or forward_kl_topk, or use_policy_gradient=true"
            )
        for name in ("loss_max_clamp", "chunked_topk_chunk_size"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{where}.{name}={value}: must be > 0")
        if self.use_policy_gradient and settings.use_topk:
            logger.warning(
                "%s: loss_mode=%s with use_policy_gradient=true uses only the sampled token's log-prob gradient; "
                "the teacher's top-k distribution mostly goes unused (use_policy_gradient=false suits it better)",
                where,
                self.loss_mode,
            )

    @property
    def use_topk(self) -> bool:
        """Whether the teacher sends its top-k (else the sampled token's log-prob)."""
        return _loss_settings(self.loss_mode).use_topk

    @property
    def teacher_logprobs_k(self) -> int:
        """The ``prompt_logprobs`` a teacher is asked for: ``topk`` for a top-k loss, 0 for an estimator."""
        return int(self.topk) if self.use_topk else 0


@dataclass(frozen=True)
class DistillationTeacherModelConfig:
    """One teacher: its routing ``key``, ``model_path``, ``num_replicas`` and serving engine (``inference``: the
    student's ``actor_rollout_ref.rollout`` settings under these)."""

    key: str | None = None
    model_path: str | None = None
    num_replicas: int = 0
    inference: dict[str, Any] = field(default_factory=dict)

    @property
    def per_replica_world_size(self) -> int:
        """Devices of one replica: its tensor × data × pipeline parallel sizes."""
        size = 1
        for name in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
            size *= int(self.inference.get(name) or 1)
        return size


@dataclass(frozen=True)
class DistillationConfig:
    """``distillation.*``: ``teacher_models`` here is keyed by each teacher's routing key (see the module
    docstring)."""

    enabled: bool = False
    n_gpus_per_node: int = 0
    nnodes: int = 0
    teacher_models: dict[str, DistillationTeacherModelConfig] = field(default_factory=dict)
    teacher_key: str = "data_source"
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)

    @classmethod
    def from_config(cls, section: Any) -> DistillationConfig:
        """The checked config of a ``distillation`` section (a mapping or DictConfig; None: disabled)."""
        values = _known(cls, _plain(section), "distillation")
        loss = DistillationLossConfig(
            **_known(DistillationLossConfig, _plain(values.pop("distillation_loss", None)), "distillation_loss")
        )
        entries = {name: _plain(entry) for name, entry in _plain(values.pop("teacher_models", None)).items()}
        config = cls(distillation_loss=loss, **values)
        if not config.enabled:
            return config
        teachers = config._resolve_teachers(entries)
        return cls(**{**config.__dict__, "teacher_models": teachers})

    @property
    def pool_size(self) -> int:
        """Devices of the teacher pool: ``n_gpus_per_node × nnodes``."""
        return int(self.n_gpus_per_node) * int(self.nnodes)

    def _resolve_teachers(self, entries: dict[str, dict[str, Any]]) -> dict[str, DistillationTeacherModelConfig]:
        if self.pool_size <= 0:
            raise ValueError(
                f"distillation.enabled=true: the teacher pool distillation.n_gpus_per_node={self.n_gpus_per_node} "
                f"× distillation.nnodes={self.nnodes} is empty; give the teachers devices (CPU: worker processes)"
            )
        if not entries:
            raise ValueError("distillation.enabled=true but distillation.teacher_models names no teacher")
        if len(entries) > 1 and DEFAULT_TEACHER in entries:
            dropped = entries.pop(DEFAULT_TEACHER)
            if dropped.get("model_path"):
                logger.warning(
                    "distillation.teacher_models.%s (model_path=%s) is dropped because other teachers are named "
                    "(veRL's rule): give every teacher its own entry name",
                    DEFAULT_TEACHER,
                    dropped["model_path"],
                )
        teachers: dict[str, DistillationTeacherModelConfig] = {}
        for name, entry in entries.items():
            where = f"distillation.teacher_models.{name}"
            teacher = DistillationTeacherModelConfig(**_known(DistillationTeacherModelConfig, entry, where))
            if not teacher.model_path:
                raise ValueError(f"{where}.model_path is not set")
            if len(entries) == 1:  # the teacher: every sample, the whole pool
                per_replica = teacher.per_replica_world_size
                if self.pool_size % per_replica:
                    raise ValueError(
                        f"{where}: one replica takes {per_replica} device(s), which does not divide the teacher "
                        f"pool's {self.pool_size}"
                    )
                teacher = DistillationTeacherModelConfig(
                    "default", teacher.model_path, self.pool_size // per_replica, teacher.inference
                )
            elif not teacher.key or not teacher.num_replicas:
                raise ValueError(f"{where}: with several teachers each needs a key and num_replicas > 0")
            if teacher.key in teachers:
                raise ValueError(f"{where}.key={teacher.key!r}: another teacher has this key")
            teachers[teacher.key] = teacher
        used = sum(t.num_replicas * t.per_replica_world_size for t in teachers.values())
        if used != self.pool_size:
            raise ValueError(
                f"distillation.teacher_models: the teachers' replicas take {used} device(s), the teacher pool "
                f"(n_gpus_per_node × nnodes) has {self.pool_size}; they must match"
            )
        return teachers

    def route(self, value: Any) -> DistillationTeacherModelConfig:
        """The teacher of a sample whose ``teacher_key`` field is ``value`` (the only teacher when there is one)."""
        if len(self.teacher_models) == 1:
            return next(iter(self.teacher_models.values()))
        if value not in self.teacher_models:
            raise ValueError(
                f"distillation.teacher_key={self.teacher_key!r}: a sample's value {value!r} names no teacher; "
                f"teachers: {sorted(self.teacher_models)}"
            )
        return self.teacher_models[value]
