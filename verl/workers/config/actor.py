"""Schema of ``actor_rollout_ref.actor.*`` and ``actor_rollout_ref.ref.*`` (veRL names and defaults).

``ActorConfig`` holds the policy-loss fields the algorithms read and the training fields the worker reads (batch
sizes, optimizer, FSDP engine, checkpoint contents). ``rollout_n`` and ``data_parallel_size`` are filled in by the
worker; ``ppo_mini_batch_size_per_rank`` is derived from them and never set by users.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from verl.algorithms.config import LOSS_AGG_MODES, RolloutCorrectionConfig, validate_kl_penalty_type
from verl.base_config import BaseConfig
from verl.workers.config.checkpoint import CheckpointConfig
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, role_optim_default
from verl.workers.config.profiler import RoleProfilerConfig
from verl.workers.config.sizes import per_rank_mini_batch_size

__all__ = [
    "GLOBAL_BATCH_INFO_KEYS",
    "LOSS_AGG_MODES",
    "ActorConfig",
    "FSDPActorConfig",
    "PolicyLossConfig",
    "RefConfig",
]

# Keys the actor may put in `ActorConfig.global_batch_info`; they are passed to `agg_loss` as keyword arguments.
GLOBAL_BATCH_INFO_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_number(key: str, value: object, low: float | None = None, *, strict: bool = False, optional=False) -> None:
    if value is None and optional:
        return
    bad = not _is_number(value) or (low is not None and (value <= low if strict else value < low))
    if bad:
        bound = "" if low is None else f" {'>' if strict else '>='} {low}"
        raise ValueError(f"{key}={value!r} must be a number{bound}{' or null' if optional else ''}")


@dataclass
class PolicyLossConfig(BaseConfig):
    """``actor.policy_loss``: which policy loss, and the knobs of the covariance-based ones.

    Args:
        loss_mode: name in the policy-loss registry: "vanilla", "gspo", "sapo", "gpg", "cispo", "clip_cov", "kl_cov",
            "geo_mean", "dppo_tv", "dppo_kl", "dro", "bypass_mode", or one a recipe registered with
            ``register_policy_loss``.
        clip_cov_ratio: fraction of tokens Clip-Cov detaches (Cui et al. 2025, arXiv:2505.22617).
        clip_cov_lb: lower bound of the covariance window Clip-Cov samples from.
        clip_cov_ub: upper bound of that window.
        kl_cov_ratio: fraction of tokens (largest covariance) KL-Cov penalises.
        ppo_kl_coef: KL-Cov's coefficient on |log π − log π_old|.
        dro_beta: the ``dro`` loss's β (required > 0 with ``loss_mode=dro``).
        rollout_correction: the rollout-correction settings the "bypass_mode" loss reads (a copy of
            ``algorithm.rollout_correction``, see ``rollout_corr_helper.bypass_policy_loss_config``); None otherwise.
    """

    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: float | None = None
    rollout_correction: RolloutCorrectionConfig | None = None

    def __post_init__(self) -> None:
        prefix = "actor.policy_loss"
        if not isinstance(self.loss_mode, str) or not self.loss_mode:
            raise ValueError(f"{prefix}.loss_mode={self.loss_mode!r} must name a registered policy loss")
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value <= 1:
                raise ValueError(f"{prefix}.{name}={value!r} must be a fraction in (0, 1]")
        _check_number(f"{prefix}.clip_cov_lb", self.clip_cov_lb)
        _check_number(f"{prefix}.clip_cov_ub", self.clip_cov_ub)
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(
                f"{prefix}.clip_cov_lb={self.clip_cov_lb} must be below {prefix}.clip_cov_ub={self.clip_cov_ub}"
            )
        _check_number(f"{prefix}.ppo_kl_coef", self.ppo_kl_coef, 0.0)
        if self.loss_mode == "dro" and not (_is_number(self.dro_beta) and self.dro_beta > 0):
            raise ValueError(f"{prefix}.dro_beta={self.dro_beta!r} must be a number > 0 with loss_mode=dro")
        if self.rollout_correction is not None and not isinstance(self.rollout_correction, RolloutCorrectionConfig):
            raise ValueError(
                f"{prefix}.rollout_correction must be a RolloutCorrectionConfig or None, got "
                f"{type(self.rollout_correction).__name__}"
            )
        if self.loss_mode == "bypass_mode" and self.rollout_correction is None:
            raise ValueError(
                f"{prefix}.loss_mode='bypass_mode' needs {prefix}.rollout_correction "
                f"(a copy of algorithm.rollout_correction)"
            )


@dataclass
class ActorConfig(BaseConfig):
    """``actor_rollout_ref.actor``: the policy-loss fields (veRL names and defaults).

    Args:
        clip_ratio: PPO clip ε (Schulman et al. 2017), the fallback for ``clip_ratio_low/high``.
        clip_ratio_low: ε_low, the ratio is clipped at 1 − ε_low; None: ``clip_ratio``.
        clip_ratio_high: ε_high, the ratio is clipped at 1 + ε_high (DAPO "clip-higher": 0.28); None: ``clip_ratio``.
        clip_ratio_c: dual-clip bound c > 1 for negative advantages (Ye et al. 2020, arXiv:1912.09729).
        policy_loss: which loss, and its own knobs.
        loss_agg_mode: how the per-token loss is reduced to one number, one of ``LOSS_AGG_MODES``: "token-mean",
            "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm" (veRL 0.10's meaning),
            "seq-mean-token-sum-norm-legacy" (the earlier meaning) or "token-sum".
        loss_scale_factor: divisor of "seq-mean-token-sum-norm" (None: the padded response length); set a constant
            to keep the scale fixed during training.
        entropy_coeff: weight of the entropy bonus (loss −= entropy_coeff · entropy).
        calculate_entropy: compute the entropy in the forward pass even when ``entropy_coeff`` is 0 (for metrics).
        use_kl_loss: add kl_loss_coef · KL(π‖π_ref) to the loss (GRPO style).
        kl_loss_coef: its coefficient.
        kl_loss_type: the KL estimator: "kl"/"k1", "abs", "mse"/"k2", "low_var_kl"/"k3"; a "+" suffix keeps that
            value with k2's gradient (straight-through).
        tau_pos: SAPO gate temperature for positive advantages (SAPO, arXiv:2511.20347).
        tau_neg: SAPO gate temperature for non-positive advantages.
        ppo_epochs: passes over each batch per step.
        calculate_sum_pi_squared: compute Σπ² per token in the old-log-prob pass (needed by the OTB estimators).
        skip_on_policy_old_log_prob: when the update is on-policy (one epoch, one mini-batch, the log-prob pass's
            micro-batches, nothing reading the old log-probs before it), take them from the update's own forward
            instead of a separate pass: bit-identical, one forward cheaper (`verl.trainer.ppo.on_policy`).
        skip_zero_advantage_samples: skip the forward/backward of samples whose advantage is exactly zero (GRPO
            groups with equal rewards) when nothing else reads them: no KL loss, no entropy bonus, a per-sample
            policy loss. The loss is unchanged (normalised over the whole mini-batch); the gradient differs only in
            the order of floating-point sums (`verl.workers.actor.zero_adv`). Metric: ``actor/zero_adv_skip_frac``.
        global_batch_info: set by the actor per micro-batch: ``dp_size``, ``batch_num_tokens``,
            ``global_batch_size`` (and optionally ``loss_scale_factor``), passed to ``agg_loss`` so that the loss does
            not depend on how the batch is split over ranks and micro-batches. Users leave it empty.
        strategy: training engine: "fsdp" or "fsdp2" (both select the FSDP2 engine); "megatron" in
            ``McoreActorConfig`` (``model_engine=megatron``).
        ppo_mini_batch_size: prompts per optimizer step, over all ranks; each brings ``rollout_n`` samples, split
            over the data-parallel ranks.
        ppo_micro_batch_size: deprecated global micro-batch size.
        ppo_micro_batch_size_per_gpu: samples per forward/backward pass on each rank (gradients accumulate over the
            micro-batches of a mini-batch); required unless ``use_dynamic_bsz``.
        use_dynamic_bsz: form micro-batches by a token budget instead of a sample count.
        ppo_max_token_len_per_gpu: that token budget per micro-batch.
        shuffle: reshuffle the samples before each PPO epoch (seeded with ``data_loader_seed`` + epoch).
        data_loader_seed: seed of that shuffle.
        grad_clip: the total gradient norm is clipped to this value before each optimizer step.
        ulysses_sequence_parallel_size: Ulysses sequence-parallel degree (1: off).
        use_torch_compile: compile the log-prob and entropy helpers with ``torch.compile``.
        use_remove_padding: forward packed sequences without pad tokens; null: ``model.use_remove_padding``.
        use_fused_kernels: fused log-prob/entropy kernels; null: ``model.use_fused_kernels``.
        use_prefix_grouper: forward the shared prompt of a group's responses once.
        freeze_vision_tower: keep a vision-language model's vision encoder frozen.
        entropy_from_logits_with_chunking: compute the entropy from the logits in chunks (a memory saving).
        entropy_checkpointing: recompute the entropy in the backward pass instead of keeping its activations.
        checkpoint: what a checkpoint of the actor holds.
        optim: the optimizer and its learning-rate schedule.
        fsdp_config: how the actor is sharded, cast and offloaded.
        router_replay.mode: MoE routing replay (record the rollout's expert routing and replay it in training);
            "disabled": off.
        profiler: profiler options of the actor.
        rollout_n: samples per prompt (the worker sets it from ``rollout.n``).
        data_parallel_size: data-parallel ranks (set by the worker).
    """

    # The strategies this class accepts (the Megatron subclass, McoreActorConfig, accepts "megatron").
    _strategies: ClassVar[tuple[str, ...]] = ("fsdp", "fsdp2")
    _strategy_hint: ClassVar[str] = "use fsdp or fsdp2 (megatron: the megatron_actor config, McoreActorConfig)"

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2
    clip_ratio_c: float = 3.0
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    entropy_coeff: float = 0.0
    calculate_entropy: bool = False
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    ppo_epochs: int = 1
    calculate_sum_pi_squared: bool = False
    skip_on_policy_old_log_prob: bool = True
    skip_zero_advantage_samples: bool = True
    global_batch_info: dict[str, Any] = field(default_factory=dict)
    # training: batch sizes (ppo_mini_batch_size in prompts, global), engine, optimizer
    strategy: str = "fsdp"
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int = 16384
    shuffle: bool = False
    data_loader_seed: int = 42
    grad_clip: float = 1.0
    ulysses_sequence_parallel_size: int = 1
    use_torch_compile: bool = True
    use_remove_padding: bool | None = None
    use_fused_kernels: bool | None = None
    use_prefix_grouper: bool = False
    freeze_vision_tower: bool = False
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    optim: FSDPOptimizerConfig = field(default_factory=role_optim_default)
    fsdp_config: FSDPEngineConfig = field(default_factory=FSDPEngineConfig)
    router_replay: dict[str, Any] = field(default_factory=lambda: {"mode": "disabled"})
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    # filled in by the worker, then derived
    rollout_n: int = 1
    data_parallel_size: int = 1
    ppo_mini_batch_size_per_rank: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        prefix = "actor"
        _check_number(f"{prefix}.clip_ratio", self.clip_ratio, 0.0)
        _check_number(f"{prefix}.clip_ratio_low", self.clip_ratio_low, 0.0, optional=True)
        _check_number(f"{prefix}.clip_ratio_high", self.clip_ratio_high, 0.0, optional=True)
        _check_number(f"{prefix}.clip_ratio_c", self.clip_ratio_c, 1.0, strict=True)
        if not isinstance(self.policy_loss, PolicyLossConfig):
            raise ValueError(
                f"{prefix}.policy_loss must be a PolicyLossConfig, got {type(self.policy_loss).__name__}; build "
                f"nested configs with verl.base_config.omega_conf_to_dataclass"
            )
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"{prefix}.loss_agg_mode={self.loss_agg_mode!r}; use one of {list(LOSS_AGG_MODES)}")
        _check_number(f"{prefix}.loss_scale_factor", self.loss_scale_factor, 0.0, strict=True, optional=True)
        _check_number(f"{prefix}.entropy_coeff", self.entropy_coeff)
        _check_number(f"{prefix}.kl_loss_coef", self.kl_loss_coef, 0.0)
        validate_kl_penalty_type(f"{prefix}.kl_loss_type", self.kl_loss_type)
        _check_number(f"{prefix}.tau_pos", self.tau_pos, 0.0, strict=True)
        _check_number(f"{prefix}.tau_neg", self.tau_neg, 0.0, strict=True)
        if not isinstance(self.ppo_epochs, int) or isinstance(self.ppo_epochs, bool) or self.ppo_epochs < 1:
            raise ValueError(f"{prefix}.ppo_epochs={self.ppo_epochs!r} must be an integer >= 1")
        for name in (
            "calculate_entropy",
            "use_kl_loss",
            "calculate_sum_pi_squared",
            "skip_on_policy_old_log_prob",
            "skip_zero_advantage_samples",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{prefix}.{name}={getattr(self, name)!r} must be true or false")
        if not isinstance(self.global_batch_info, dict):
            raise ValueError(f"{prefix}.global_batch_info must be a dict, got {type(self.global_batch_info).__name__}")
        unknown = sorted(set(self.global_batch_info) - set(GLOBAL_BATCH_INFO_KEYS))
        if unknown:
            raise ValueError(
                f"{prefix}.global_batch_info has unknown key(s) {unknown}; allowed: {list(GLOBAL_BATCH_INFO_KEYS)}"
            )
        if self.strategy not in self._strategies:
            raise ValueError(f"{prefix}.strategy={self.strategy!r}; {self._strategy_hint}")
        if self.ppo_micro_batch_size is not None:
            raise ValueError(
                f"{prefix}.ppo_micro_batch_size (global) is deprecated and not supported: set "
                f"{prefix}.ppo_micro_batch_size_per_gpu instead"
            )
        _check_number(f"{prefix}.grad_clip", self.grad_clip, 0.0, strict=True)
        self.ppo_mini_batch_size_per_rank = per_rank_mini_batch_size(
            prefix,
            self.ppo_mini_batch_size,
            self.rollout_n,
            self.data_parallel_size,
            self.ppo_micro_batch_size_per_gpu,
        )


FSDPActorConfig = ActorConfig


@dataclass
class RefConfig(BaseConfig):
    """``actor_rollout_ref.ref``: the frozen reference policy (its engine is always forward-only).

    Args:
        strategy: engine: "fsdp" or "fsdp2" (both select the FSDP2 engine); "megatron" in ``McoreRefConfig``.
        log_prob_micro_batch_size: deprecated global micro-batch size.
        log_prob_micro_batch_size_per_gpu: samples per forward pass of ``compute_ref_log_prob`` on each rank;
            null: the rank's whole share at once.
        log_prob_use_dynamic_bsz: form those micro-batches by a token budget instead.
        log_prob_max_token_len_per_gpu: that token budget per micro-batch.
        ulysses_sequence_parallel_size: Ulysses sequence-parallel degree (1: off).
        use_torch_compile: compile the log-prob helpers with ``torch.compile``.
        use_remove_padding: forward packed sequences without pad tokens; null: ``model.use_remove_padding``.
        entropy_from_logits_with_chunking: compute the entropy from the logits in chunks (a memory saving).
        entropy_checkpointing: recompute the entropy in the backward pass instead of keeping its activations.
        model: a reference model other than the policy's (veRL's override of ``actor_rollout_ref.model``); null:
            the policy's initial weights.
        fsdp_config: how the reference model is sharded and cast (always forward-only).
        profiler: profiler options of the reference policy.
    """

    # The strategies this class accepts (the Megatron subclass, McoreRefConfig, accepts "megatron").
    _strategies: ClassVar[tuple[str, ...]] = ("fsdp", "fsdp2")
    _strategy_hint: ClassVar[str] = "use fsdp or fsdp2 (megatron: the megatron_ref config, McoreRefConfig)"

    strategy: str = "fsdp"
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    ulysses_sequence_parallel_size: int = 1
    use_torch_compile: bool = True
    use_remove_padding: bool | None = None
    entropy_from_logits_with_chunking: bool = False
    entropy_checkpointing: bool = False
    model: dict[str, Any] | None = None
    fsdp_config: FSDPEngineConfig = field(default_factory=lambda: FSDPEngineConfig(forward_only=True))
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)

    def __post_init__(self) -> None:
        if self.strategy not in self._strategies:
            raise ValueError(f"ref.strategy={self.strategy!r}; {self._strategy_hint}")
        if self.log_prob_micro_batch_size is not None:
            raise ValueError(
                "ref.log_prob_micro_batch_size (global) is deprecated and not supported: set "
                "ref.log_prob_micro_batch_size_per_gpu instead"
            )
