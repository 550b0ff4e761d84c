"""Schema of the ``algorithm.*`` config group: advantage estimator, discounting, KL in the reward, rollout correction.

Field names and defaults are veRL's (``algorithm.adv_estimator=grpo``, ``algorithm.kl_ctrl.kl_coef=0.001``, …). Every
dataclass validates itself in ``__post_init__`` and names the offending key, its value and the allowed values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from verl.base_config import BaseConfig, omega_conf_to_dataclass

__all__ = [
    "KL_PENALTY_TYPES",
    "LOSS_AGG_MODES",
    "SUM_PI_SQUARED_ESTIMATORS",
    "SUPPORTED_ROLLOUT_RS_OPTIONS",
    "AlgoConfig",
    "FilterGroupsConfig",
    "KLControlConfig",
    "PFPPOConfig",
    "RolloutCorrectionConfig",
    "parse_rollout_is_threshold",
    "parse_rollout_rs_thresholds",
    "validate_kl_penalty_type",
]

# KL estimators of `kl_penalty` (http://joschu.net/blog/kl-approx.html); a trailing "+" means "this forward value,
# k2's gradient" (straight-through). "full" is reserved by veRL and not implemented.
KL_PENALTY_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")

# How `agg_loss` reduces a (bs, response_length) loss matrix to a scalar (`actor.loss_agg_mode`, `critic.loss_agg_mode`;
# see verl.algorithms.agg.agg_loss). "seq-mean-token-sum-norm-legacy" is what "seq-mean-token-sum-norm" meant before
# veRL 0.8 (Σ of all token losses ÷ loss_scale_factor, no mean over sequences).
LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "seq-mean-token-sum-norm-legacy",
)

# Rejection-sampling criteria of `rollout_corr_helper.compute_rollout_rejection_mask`: the statistic is a KL estimator
# of log r = log π_train − log π_rollout (k1 = −log r, k2 = ½(log r)², k3 = r − 1 − log r), taken per token or summed,
# averaged or maxed over each sequence. k1 options take "lower_upper" ratio bounds, the others one upper bound.
SUPPORTED_ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)

# Advantage estimators that read the actor's Σπ² per token (``actor.calculate_sum_pi_squared``) and old log-probs.
SUM_PI_SQUARED_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")


def validate_kl_penalty_type(key: str, value: object) -> None:
    """Raise ``ValueError`` naming ``key`` unless ``value`` is a KL estimator name, optionally with a "+" suffix."""
    base = value[:-1] if isinstance(value, str) and value.endswith("+") else value
    if base not in KL_PENALTY_TYPES:
        raise ValueError(
            f"{key}={value!r} is not a KL estimator; use one of {list(KL_PENALTY_TYPES)}, optionally with a '+' "
            f"suffix (forward value of that estimator, gradient of k2)"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_rollout_is_threshold(value: str | float, key: str = "rollout_is_threshold") -> tuple[float | None, float]:
    """``2.0`` or ``"2.0"`` → (None, 2.0): truncate at the upper bound (TIS); ``"0.5_2.0"`` → (0.5, 2.0): zero the
    weights outside [lower, upper] (IcePop-style masked IS).

    Returns:
        ``(lower, upper)``; ``lower`` is ``None`` for truncation.
    """
    if isinstance(value, bool) or not (_is_number(value) or isinstance(value, str)):
        raise ValueError(f"{key}={value!r} must be a positive number or a 'lower_upper' string such as '0.5_2.0'")
    text = str(value).strip()
    parts = text.split("_") if isinstance(value, str) else [text]
    try:
        bounds = [float(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"{key}={value!r} must be a positive number or a 'lower_upper' string such as '0.5_2.0'"
        ) from None
    if len(bounds) not in (1, 2) or not all(math.isfinite(b) and b > 0 for b in bounds):
        raise ValueError(f"{key}={value!r} must be one positive bound or two ('lower_upper') positive bounds")
    if len(bounds) == 1:
        return None, bounds[0]
    if bounds[0] > bounds[1]:
        raise ValueError(f"{key}={value!r}: the lower bound must not exceed the upper bound")
    return bounds[0], bounds[1]


def parse_rollout_rs_thresholds(
    rollout_rs: str, rollout_rs_threshold: str | float | None, key: str = "rollout_rs_threshold"
) -> dict[str, tuple[float | None, float]]:
    """Parse ``rollout_rs`` (comma-separated options) and its thresholds into ``{option: (lower, upper)}``.

    One threshold is shared by all options, or there is one per option (comma-separated). A k1 option bounds the
    ratio: ``"lower_upper"``, or a single ``u`` meaning ``[1/u, u]``; k2/k3 options take a single upper bound.
    """
    if not isinstance(rollout_rs, str):
        raise ValueError(
            f"rollout_rs={rollout_rs!r} must be a comma-separated string of {SUPPORTED_ROLLOUT_RS_OPTIONS}"
        )
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    unknown = [o for o in options if o not in SUPPORTED_ROLLOUT_RS_OPTIONS]
    if not options or unknown:
        raise ValueError(
            f"rollout_rs={rollout_rs!r}: unknown option(s) {unknown}; use {list(SUPPORTED_ROLLOUT_RS_OPTIONS)}"
        )
    if rollout_rs_threshold is None:
        raise ValueError(f"{key} must be set when rollout_rs={rollout_rs!r}")
    specs = [s.strip() for s in str(rollout_rs_threshold).split(",") if s.strip()]
    if len(specs) == 1:
        specs = specs * len(options)
    if len(specs) != len(options):
        raise ValueError(
            f"{key}={rollout_rs_threshold!r} gives {len(specs)} thresholds for {len(options)} rollout_rs options; "
            f"give one shared threshold or one per option"
        )
    parsed = {}
    for option, spec in zip(options, specs):
        lower, upper = parse_rollout_is_threshold(spec, key=f"{key} (for {option})")
        if option.endswith("k1"):
            parsed[option] = (1.0 / upper if lower is None else lower, upper)
        elif lower is not None:
            raise ValueError(f"{key}={spec!r} for {option}: k2/k3 options take a single upper bound, not 'lower_upper'")
        else:
            parsed[option] = (None, upper)
    return parsed


@dataclass
class KLControlConfig(BaseConfig):
    """``algorithm.kl_ctrl``: the coefficient β of the KL penalty in the reward.

    Args:
        type: "fixed" (β stays ``kl_coef``) or "adaptive" (Ziegler et al. 2019, β tracks ``target_kl``).
        kl_coef: β, or its initial value for "adaptive".
        horizon: adaptive controller horizon, in samples.
        target_kl: KL the adaptive controller aims for.
    """

    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1

    def __post_init__(self) -> None:
        if self.type not in ("fixed", "adaptive"):
            raise ValueError(f"algorithm.kl_ctrl.type={self.type!r}; use 'fixed' or 'adaptive'")
        if not _is_number(self.kl_coef) or self.kl_coef < 0:
            raise ValueError(f"algorithm.kl_ctrl.kl_coef={self.kl_coef!r} must be a number >= 0")
        if not _is_number(self.horizon) or self.horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon={self.horizon!r} must be > 0")
        if not _is_number(self.target_kl) or self.target_kl <= 0:
            raise ValueError(f"algorithm.kl_ctrl.target_kl={self.target_kl!r} must be > 0")


@dataclass
class FilterGroupsConfig(BaseConfig):
    """``algorithm.filter_groups`` (DAPO dynamic sampling): drop prompt groups whose ``metric`` has zero std.

    Args:
        enable: turn the filter on.
        metric: per-sample metric to test, e.g. "acc", "score", "seq_reward", "seq_final_reward".
        max_num_gen_batches: give up after this many generation batches per step (<= 0: no limit); read by the
            ``fixed_lag`` schedule (``trainer.v1.sampler.schedule``), not by ``replay_buffer`` (nor by veRL 0.10).
        max_inflight_gen_batches: the prompts one refill may dispatch, in training batches, under
            ``trainer.v1.sampler.schedule=replay_buffer`` (veRL 0.10's replay buffer); ``fixed_lag`` generates
            batches of ``data.gen_batch_size`` one after another (a value other than 1 warns there).
    """

    enable: bool = False
    metric: str | None = None
    max_num_gen_batches: int = 0
    max_inflight_gen_batches: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.enable, bool):
            raise ValueError(f"algorithm.filter_groups.enable={self.enable!r} must be true or false")
        if self.enable and not (isinstance(self.metric, str) and self.metric):
            raise ValueError(
                "algorithm.filter_groups.metric must name a per-sample metric (e.g. 'acc', 'score', 'seq_reward') "
                "when algorithm.filter_groups.enable=true"
            )
        if not isinstance(self.max_num_gen_batches, int) or isinstance(self.max_num_gen_batches, bool):
            raise ValueError(
                f"algorithm.filter_groups.max_num_gen_batches={self.max_num_gen_batches!r} must be an integer"
            )


@dataclass
class PFPPOConfig(BaseConfig):
    """``algorithm.pf_ppo`` (Policy Filtration PPO, arXiv:2409.06957): resample the batch weighted by score.

    Args:
        reweight_method: "pow" (|score|^weight_pow), "max_min" (only the best and worst), "max_random" (best 4×).
        weight_pow: exponent of "pow".
    """

    reweight_method: str = "pow"
    weight_pow: float = 2.0

    def __post_init__(self) -> None:
        if self.reweight_method not in ("pow", "max_min", "max_random"):
            raise ValueError(
                f"algorithm.pf_ppo.reweight_method={self.reweight_method!r}; use 'pow', 'max_min' or 'max_random'"
            )
        if not _is_number(self.weight_pow) or self.weight_pow < 0:
            raise ValueError(f"algorithm.pf_ppo.weight_pow={self.weight_pow!r} must be a number >= 0")


@dataclass
class RolloutCorrectionConfig(BaseConfig):
    """``algorithm.rollout_correction``: correct the mismatch between the rollout engine's policy and the trainer's.

    See Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference Mismatch",
    and Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (TIS).

    Args:
        rollout_is: importance weights π_train/π_rollout per "token" or per "sequence" (product); None: none.
        rollout_is_threshold: a number truncates the weights at it (TIS); "lower_upper" zeroes the weights outside
            [lower, upper] (masked IS, IcePop-style).
        rollout_is_batch_normalize: rescale the weights to mean 1 over the batch.
        rollout_rs: rejection sampling: comma-separated options of ``SUPPORTED_ROLLOUT_RS_OPTIONS``; rejected tokens or
            sequences leave the response mask. None: none.
        rollout_rs_threshold: bounds for ``rollout_rs`` (see :func:`parse_rollout_rs_thresholds`).
        bypass_mode: use the rollout log-probs as the old log-probs (skip the old-log-prob forward pass).
        loss_type: policy loss in bypass mode: "ppo_clip" (ratio against the rollout policy) or "reinforce"
            (−w·A·log π with the IS weights w).
    """

    rollout_is: str | None = None
    rollout_is_threshold: str | float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"

    def __post_init__(self) -> None:
        prefix = "algorithm.rollout_correction"
        if self.rollout_is not in (None, "token", "sequence"):
            raise ValueError(f"{prefix}.rollout_is={self.rollout_is!r}; use null, 'token' or 'sequence'")
        parse_rollout_is_threshold(self.rollout_is_threshold, key=f"{prefix}.rollout_is_threshold")
        if self.rollout_rs is not None:
            parse_rollout_rs_thresholds(
                self.rollout_rs, self.rollout_rs_threshold, key=f"{prefix}.rollout_rs_threshold"
            )
        for name in ("rollout_is_batch_normalize", "bypass_mode"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{prefix}.{name}={getattr(self, name)!r} must be true or false")
        if self.loss_type not in ("ppo_clip", "reinforce"):
            raise ValueError(f"{prefix}.loss_type={self.loss_type!r}; use 'ppo_clip' or 'reinforce'")

    @classmethod
    def decoupled_token_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Token-level truncated IS (token-TIS) with a separately computed old policy."""
        return cls(rollout_is="token", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_seq_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Sequence-level truncated IS (seq-TIS) with a separately computed old policy."""
        return cls(rollout_is="sequence", rollout_is_threshold=threshold)

    @classmethod
    def decoupled_seq_is_rs(
        cls, is_threshold: float = 2.0, rs_threshold: str | float = "0.5_2.0"
    ) -> RolloutCorrectionConfig:
        """Seq-TIS plus rejection of sequences whose product ratio leaves the bounds (seq-MIS)."""
        return cls(
            rollout_is="sequence",
            rollout_is_threshold=is_threshold,
            rollout_rs="seq_sum_k1",
            rollout_rs_threshold=rs_threshold,
        )

    @classmethod
    def decoupled_geo_rs(cls, rs_threshold: str | float = "0.999_1.001") -> RolloutCorrectionConfig:
        """Reject sequences whose geometric-mean ratio leaves the bounds (Geo-RS); no IS weights."""
        return cls(rollout_rs="seq_mean_k1", rollout_rs_threshold=rs_threshold)

    @classmethod
    def bypass_ppo_clip(cls) -> RolloutCorrectionConfig:
        """Bypass mode, PPO-clip loss against the rollout policy."""
        return cls(bypass_mode=True, loss_type="ppo_clip")

    @classmethod
    def bypass_pg_is(cls, threshold: float = 2.0) -> RolloutCorrectionConfig:
        """Bypass mode, REINFORCE loss with seq-TIS weights."""
        return cls(rollout_is="sequence", rollout_is_threshold=threshold, bypass_mode=True, loss_type="reinforce")


@dataclass
class AlgoConfig(BaseConfig):
    """``algorithm``: which advantage estimator, and how rewards are discounted and KL-penalised.

    Args:
        gamma: discount factor γ (GAE, REINFORCE++).
        lam: GAE λ.
        adv_estimator: name in the advantage-estimator registry ("gae", "grpo", "rloo", …, or one a recipe
            registered with ``register_adv_est``).
        norm_adv_by_std_in_grpo: divide GRPO advantages by the group std (False: Dr.GRPO).
        use_kl_in_reward: subtract β·KL(π_old‖π_ref) from the token rewards.
        kl_penalty: KL estimator for the reward penalty: "kl"/"k1", "abs", "mse"/"k2", "low_var_kl"/"k3", optionally
            with a "+" suffix (see ``KL_PENALTY_TYPES``).
        kl_ctrl: the coefficient β.
        use_pf_ppo: resample the batch by score before the update (PF-PPO).
        pf_ppo: PF-PPO settings.
        filter_groups: DAPO dynamic sampling (off unless ``enable``; None: off too, veRL's older default).
        rollout_correction: train/inference mismatch correction.
        gdpo_reward_keys: GDPO's reward components (keys of the scoring function's dict), required by
            ``adv_estimator=gdpo``; veRL's scripts add it with ``+algorithm.gdpo_reward_keys=[...]``.
        gdpo_reward_weights: their weights (None: equal).
    """

    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    use_pf_ppo: bool = False
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    filter_groups: FilterGroupsConfig | None = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    gdpo_reward_keys: list[str] | None = None
    gdpo_reward_weights: list[float] | None = None

    def __post_init__(self) -> None:
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value <= 1.0:
                raise ValueError(f"algorithm.{name}={value!r} must be a number in [0, 1]")
        # null: a recipe whose own fit() computes advantages (SPPO); the trainer's fit() refuses it
        if self.adv_estimator is not None and (not isinstance(self.adv_estimator, str) or not self.adv_estimator):
            raise ValueError(
                f"algorithm.adv_estimator={self.adv_estimator!r} must name a registered advantage estimator "
                f"(e.g. 'gae', 'grpo', 'rloo', 'reinforce_plus_plus', 'remax', 'opo', 'gpg')"
            )
        for name in ("norm_adv_by_std_in_grpo", "use_kl_in_reward", "use_pf_ppo"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"algorithm.{name}={getattr(self, name)!r} must be true or false")
        validate_kl_penalty_type("algorithm.kl_penalty", self.kl_penalty)
        keys, weights = self.gdpo_reward_keys, self.gdpo_reward_weights
        if self.adv_estimator == "gdpo" and not keys:
            raise ValueError(
                "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components to normalise "
                "(+algorithm.gdpo_reward_keys=[...], keys of the scoring function's dict)"
            )
        if keys is not None and weights is not None and len(weights) != len(keys):
            raise ValueError(
                f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(keys)} gdpo_reward_keys"
            )
        nested = {
            "kl_ctrl": (KLControlConfig, False),
            "pf_ppo": (PFPPOConfig, False),
            "filter_groups": (FilterGroupsConfig, True),
            "rollout_correction": (RolloutCorrectionConfig, False),
        }
        for name, (cls, optional) in nested.items():
            value = getattr(self, name)
            if isinstance(value, Mapping) and not isinstance(value, BaseConfig):
                # veRL passes nested sections as dicts (``pf_ppo={"reweight_method": ...}``): build the config (unknown
                # keys are refused by name). This is the field's one resolution during construction.
                try:
                    value = omega_conf_to_dataclass(value, cls)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"algorithm.{name}: {e}") from e
                object.__setattr__(self, name, value)
            if not (isinstance(value, cls) or (optional and value is None)):
                raise ValueError(
                    f"algorithm.{name} must be a {cls.__name__}{' or None' if optional else ''}, got "
                    f"{type(value).__name__}; build nested configs with verl.base_config.omega_conf_to_dataclass"
                )
