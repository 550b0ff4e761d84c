"""Config schemas of the worker roles (veRL field names and defaults; frozen dataclasses)."""

from verl.workers.config.actor import ActorConfig, FSDPActorConfig, PolicyLossConfig, RefConfig
from verl.workers.config.checkpoint import CheckpointConfig
from verl.workers.config.critic import CriticConfig, CriticModelConfig, FSDPCriticConfig
from verl.workers.config.distillation import DistillationConfig, DistillationLossConfig, DistillationTeacherModelConfig
from verl.workers.config.engine import FSDPEngineConfig, McoreEngineConfig
from verl.workers.config.megatron import McoreActorConfig, McoreCriticConfig, McoreOptimizerConfig, McoreRefConfig
from verl.workers.config.model import HFModelConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, OptimConfig, OptimizerConfig
from verl.workers.config.profiler import RoleProfilerConfig
from verl.workers.config.rollout import (
    AgentLoopConfig,
    CheckpointEngineConfig,
    CustomAsyncServerConfig,
    MultiTurnConfig,
    PrometheusConfig,
    RolloutConfig,
    SamplingConfig,
    TraceConfig,
)

# veRL's name of the critic's model config (``_target_: verl.workers.config.FSDPCriticModelCfg``).
FSDPCriticModelCfg = CriticModelConfig

__all__ = [
    "RoleProfilerConfig",
    "ActorConfig",
    "AgentLoopConfig",
    "CheckpointConfig",
    "CheckpointEngineConfig",
    "CriticConfig",
    "CriticModelConfig",
    "CustomAsyncServerConfig",
    "DistillationConfig",
    "DistillationLossConfig",
    "DistillationTeacherModelConfig",
    "FSDPActorConfig",
    "FSDPCriticConfig",
    "FSDPCriticModelCfg",
    "FSDPEngineConfig",
    "FSDPOptimizerConfig",
    "HFModelConfig",
    "McoreActorConfig",
    "McoreCriticConfig",
    "McoreEngineConfig",
    "McoreOptimizerConfig",
    "McoreRefConfig",
    "MultiTurnConfig",
    "OptimConfig",
    "OptimizerConfig",
    "PolicyLossConfig",
    "PrometheusConfig",
    "RefConfig",
    "RolloutConfig",
    "SamplingConfig",
    "TraceConfig",
]
