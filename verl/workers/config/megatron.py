"""veRL's Megatron role configs: ``McoreOptimizerConfig``, ``McoreActorConfig``, ``McoreRefConfig``,
``McoreCriticConfig`` (``actor/megatron_actor.yaml``, ``ref/megatron_ref.yaml``, ``critic/megatron_critic.yaml``,
composed by ``ppo_megatron_trainer.yaml``). Each adds the ``megatron`` engine block
(`verl.workers.config.engine.McoreEngineConfig`) that `verl.workers.engine.megatron_engine.MegatronEngine` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from verl.workers.config.actor import ActorConfig, RefConfig
from verl.workers.config.critic import CriticConfig
from verl.workers.config.engine import McoreEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig

__all__ = ["McoreActorConfig", "McoreCriticConfig", "McoreOptimizerConfig", "McoreRefConfig"]

_HINT = "a Megatron role config (megatron_actor / megatron_ref / megatron_critic) takes strategy megatron"
MCORE_LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")


@dataclass
class McoreOptimizerConfig(FSDPOptimizerConfig):
    """``optim`` of a Megatron role (``optim/megatron.yaml``): the shared optimizer keys plus Megatron's scheduler.

    Args:
        optimizer: Megatron's optimizer name ("adam", "sgd").
        lr_warmup_init: learning rate at the start of warmup.
        lr_decay_steps: steps of the decay phase; null: the whole run.
        lr_decay_style: "constant", "linear", "cosine", "inverse-square-root" or "WSD".
        min_lr: learning rate at the end of the decay.
        weight_decay_incr_style: how the weight decay changes over the run ("constant", "linear", "cosine").
        lr_wsd_decay_style: decay shape of the WSD schedule's last phase.
        lr_wsd_decay_steps: length of that phase.
        use_checkpoint_opt_param_scheduler: take the scheduler's settings from the checkpoint when resuming.
        use_layer_wise_distributed_optimizer: wrap a Muon optimizer in Megatron's layer-wise distributed one.
        muon_momentum / muon_nesterov: momentum of Muon's inner SGD, and whether it is Nesterov's.
        muon_split_qkv: orthogonalize the Q, K and V blocks of a fused QKV weight separately.
        muon_scale_mode / muon_extra_scale_factor: how Muon scales its update ("spectral", ...), and a factor on top.
        muon_coefficient_type / muon_num_ns_steps: the Newton-Schulz iteration's coefficients and step count.
        muon_tp_mode: how a tensor-parallel weight is orthogonalized ("blockwise", "allgather", ...).
        muon_fp32_matmul_prec: precision of Muon's fp32 matmuls ("medium", "high", "highest").
        muon_scalar_optimizer: optimizer for the non-matrix parameters under Muon.
        (The Megatron engine reads ``optimizer``, ``lr``, ``weight_decay``, ``betas``, ``lr_decay_style`` (constant or
        cosine) and the shared warm-up keys; a key of this block it does not read, set away from its default, is
        refused at start-up by name.)
    """

    optimizer: str = "adam"
    lr_warmup_init: float = 0.0
    lr_decay_steps: int | None = None
    lr_decay_style: str = "constant"
    min_lr: float = 0.0
    weight_decay_incr_style: str = "constant"
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_steps: int | None = None
    use_checkpoint_opt_param_scheduler: bool = False
    use_layer_wise_distributed_optimizer: bool = False
    muon_momentum: float = 0.95
    muon_nesterov: bool = False
    muon_split_qkv: bool = True
    muon_scale_mode: str = "spectral"
    muon_coefficient_type: str = "quintic"
    muon_num_ns_steps: int = 5
    muon_tp_mode: str = "blockwise"
    muon_fp32_matmul_prec: str = "medium"
    muon_extra_scale_factor: float = 1.0
    muon_scalar_optimizer: str = "adam"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lr_decay_style not in MCORE_LR_DECAY_STYLES:
            raise ValueError(f"optim.lr_decay_style={self.lr_decay_style!r}; use one of {list(MCORE_LR_DECAY_STYLES)}")
        for name in ("lr_decay_steps", "lr_wsd_decay_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"optim.{name}={value!r} must be an integer >= 0 or null")


def _refuse_no_weights(config: ActorConfig | RefConfig | CriticConfig, section: str) -> None:
    if not config.load_weight:
        raise ValueError(f"{section}.load_weight=false: the Megatron engine always starts from the HF weights")


def _mcore_optim() -> McoreOptimizerConfig:
    return McoreOptimizerConfig(min_lr_ratio=0.0)


def _mcore_critic_optim() -> McoreOptimizerConfig:
    return McoreOptimizerConfig(lr=1e-5, min_lr_ratio=0.0)


@dataclass
class McoreActorConfig(ActorConfig):
    """``actor_rollout_ref.actor`` of ``ppo_megatron_trainer`` (veRL's ``McoreActorConfig``).

    Args:
        megatron: how the model is split and trained (tensor/pipeline parallel sizes, dtype, optimizer sharding).
        load_weight: load the HF weights into the Megatron model (false is refused: a run starts from them).
    """

    _strategies: ClassVar[tuple[str, ...]] = ("megatron",)
    _strategy_hint: ClassVar[str] = _HINT

    strategy: str = "megatron"
    optim: McoreOptimizerConfig = field(default_factory=_mcore_optim)
    megatron: McoreEngineConfig = field(default_factory=McoreEngineConfig)
    load_weight: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _refuse_no_weights(self, "actor_rollout_ref.actor")


@dataclass
class McoreCriticConfig(CriticConfig):
    """``critic`` of ``ppo_megatron_trainer`` (veRL's ``McoreCriticConfig``).

    Args:
        megatron: how the value model is split and trained.
        load_weight: load the HF weights into the Megatron model (false is refused).
    """

    _strategies: ClassVar[tuple[str, ...]] = ("megatron",)
    _strategy_hint: ClassVar[str] = _HINT

    strategy: str = "megatron"
    optim: McoreOptimizerConfig = field(default_factory=_mcore_critic_optim)
    megatron: McoreEngineConfig = field(default_factory=McoreEngineConfig)
    load_weight: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _refuse_no_weights(self, "critic")


@dataclass
class McoreRefConfig(RefConfig):
    """``actor_rollout_ref.ref`` of ``ppo_megatron_trainer``: the reference policy on a forward-only Megatron engine
    laid out as the actor's.

    Args:
        megatron: the reference model's engine block (``forward_only`` always).
        load_weight: load the HF weights into the Megatron model (false is refused).
    """

    _strategies: ClassVar[tuple[str, ...]] = ("megatron",)
    _strategy_hint: ClassVar[str] = _HINT

    strategy: str = "megatron"
    megatron: McoreEngineConfig = field(default_factory=lambda: McoreEngineConfig(forward_only=True))
    load_weight: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _refuse_no_weights(self, "actor_rollout_ref.ref")
