"""Schema of ``critic`` (veRL's ``FSDPCriticConfig`` field names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from verl.base_config import BaseConfig
from verl.workers.config.checkpoint import CheckpointConfig
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.lora import LoraSpec
from verl.workers.config.optimizer import FSDPOptimizerConfig, role_optim_default
from verl.workers.config.profiler import RoleProfilerConfig
from verl.workers.config.sizes import per_rank_mini_batch_size

__all__ = ["CriticConfig", "CriticModelConfig", "FSDPCriticConfig"]


@dataclass
class CriticModelConfig(BaseConfig):
    """``critic.model``: the value model (a LM backbone; a scalar head is added when the folder has none).

    Args:
        path: value-model folder; a causal LM gets a freshly initialized scalar head.
        tokenizer_path: its tokenizer folder.
        override_config: attributes set on the HF config before the model is built.
        external_lib: a module imported before the model is loaded (to register custom architectures).
        trust_remote_code: allow the model's custom code.
        enable_gradient_checkpointing: recompute activations in backward.
        enable_activation_offload: offload activations to host memory during training.
        use_remove_padding: forward packed sequences without pad tokens.
        use_shm: copy the model to shared memory before loading it.
        fsdp_config: how the value model is sharded, cast and offloaded: veRL's older place of ``critic.fsdp``.
        lora_rank: LoRA rank of the value model; 0 disables LoRA. With LoRA the adapters and the value head train.
        lora_alpha: LoRA scaling factor α.
        target_modules: modules LoRA adapts ("all-linear" or a list of names; the value head is trained in full).
    """

    path: str = "~/models/deepseek-llm-7b-chat"
    tokenizer_path: str | None = None
    override_config: dict[str, Any] = field(default_factory=dict)
    external_lib: str | None = None
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    use_remove_padding: bool = True
    use_shm: bool = False
    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: Any = "all-linear"

    def __post_init__(self) -> None:
        LoraSpec.from_config(self, key="critic.model")  # raises ValueError naming a bad lora_* key


def _critic_optim() -> FSDPOptimizerConfig:
    return role_optim_default(lr=1e-5)


@dataclass
class CriticConfig(BaseConfig):
    """``critic``: the value model's training (PPO with GAE uses it; ``enable`` null = only when needed).

    ``rollout_n`` and ``data_parallel_size`` are set by the worker; ``ppo_mini_batch_size_per_rank`` is derived from
    them (ppo_mini_batch_size × rollout_n ÷ data_parallel_size). Users set neither.

    Args:
        enable: run a critic; null: only when ``algorithm.adv_estimator`` is "gae".
        strategy: training engine: "fsdp" or "fsdp2" (both select the FSDP2 engine); "megatron" in
            ``McoreCriticConfig`` (``model_engine=megatron``).
        optim: the optimizer and its learning-rate schedule.
        model: the value model.
        fsdp: how the value model is sharded, cast and offloaded (veRL 0.10's place; the older
            ``model.fsdp_config`` is read when this one is left at its defaults, and both set differently is an
            error): :attr:`fsdp_engine`.
        ppo_mini_batch_size: prompts per critic optimizer step, over all ranks.
        ppo_micro_batch_size: deprecated global micro-batch size.
        ppo_micro_batch_size_per_gpu: samples per forward/backward pass on each rank; required when the critic runs,
            unless ``use_dynamic_bsz``.
        forward_micro_batch_size: deprecated global micro-batch size of ``compute_values``.
        forward_micro_batch_size_per_gpu: samples per forward pass of ``compute_values`` on each rank; null: the
            rank's whole share at once.
        use_dynamic_bsz: form micro-batches by a token budget instead of a sample count.
        ppo_max_token_len_per_gpu: token budget per training micro-batch.
        forward_max_token_len_per_gpu: token budget per ``compute_values`` micro-batch.
        ppo_epochs: passes over each batch per step.
        shuffle: reshuffle the samples before each epoch (seeded with ``data_loader_seed`` + epoch).
        data_loader_seed: seed of that shuffle.
        cliprange_value: value clip range c: predictions are clipped to V_old ± c in the clipped value loss.
        loss_agg_mode: how the value loss is reduced over tokens (see ``actor.loss_agg_mode``).
        grad_clip: the total gradient norm is clipped to this value before each optimizer step.
        ulysses_sequence_parallel_size: Ulysses sequence-parallel degree (1: off).
        checkpoint: what a checkpoint of the critic holds.
        profiler: profiler options of the critic.
        rollout_n: samples per prompt (the worker sets it from ``rollout.n``).
        data_parallel_size: data-parallel ranks (set by the worker).
    """

    # The strategies this class accepts (the Megatron subclass, McoreCriticConfig, accepts "megatron").
    _strategies: ClassVar[tuple[str, ...]] = ("fsdp", "fsdp2")
    _strategy_hint: ClassVar[str] = "use fsdp or fsdp2 (megatron: the megatron_critic config, McoreCriticConfig)"

    enable: bool | None = None
    strategy: str = "fsdp"
    optim: FSDPOptimizerConfig = field(default_factory=_critic_optim)
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    fsdp: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    forward_micro_batch_size: int | None = None
    forward_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int = 32768
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 42
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    grad_clip: float = 1.0
    ulysses_sequence_parallel_size: int = 1
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    rollout_n: int = 1
    data_parallel_size: int = 1
    ppo_mini_batch_size_per_rank: int = field(init=False, default=0)

    @property
    def fsdp_engine(self) -> FSDPEngineConfig:
        """The value model's FSDP settings: ``fsdp``, or the older ``model.fsdp_config`` when ``fsdp`` is left at
        its defaults."""
        return self.fsdp if self.fsdp != FSDPEngineConfig() else self.model.fsdp_config

    def __post_init__(self) -> None:
        if self.strategy not in self._strategies:
            raise ValueError(f"critic.strategy={self.strategy!r}; {self._strategy_hint}")
        for name in ("ppo_micro_batch_size", "forward_micro_batch_size"):
            if getattr(self, name) is not None:
                raise ValueError(
                    f"critic.{name} (global) is deprecated and not supported: set critic.{name}_per_gpu instead"
                )
        if not self.cliprange_value > 0:
            raise ValueError(f"critic.cliprange_value={self.cliprange_value!r} must be > 0")
        default, older = FSDPEngineConfig(), self.model.fsdp_config
        if self.fsdp != default and older != default and self.fsdp != older:
            raise ValueError(
                "critic.fsdp and critic.model.fsdp_config (its older name) are set differently; set only critic.fsdp"
            )
        self.ppo_mini_batch_size_per_rank = per_rank_mini_batch_size(
            "critic",
            self.ppo_mini_batch_size,
            self.rollout_n,
            self.data_parallel_size,
            self.ppo_micro_batch_size_per_gpu,
        )


FSDPCriticConfig = CriticConfig
