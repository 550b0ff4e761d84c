"""The PPO-family algorithms, by their veRL names: registries, advantage estimators, policy losses, loss aggregation,
KL penalties and controllers, value/entropy losses, PF-PPO resampling.

Everything here is a pure tensor function (no distributed state); the implementation lives in small sibling modules
and this module gathers them. veRL's path ``verl.trainer.ppo.core_algos`` is this very module::

    from verl.trainer.ppo import core_algos  # or: from verl.algorithms import core_algos
    adv_fn = core_algos.get_adv_estimator_fn(config.algorithm.adv_estimator)
    loss_fn = core_algos.get_policy_loss_fn(config.actor.policy_loss.loss_mode)

Rollout correction (IS weights, rejection sampling, bypass mode) is in ``verl.algorithms.rollout_corr_helper``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verl.algorithms import cov_losses as _cov_losses  # noqa: F401  (registers clip_cov / kl_cov)
from verl.algorithms.advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from verl.algorithms.agg import agg_loss
from verl.algorithms.aux_losses import compute_entropy_loss, compute_value_loss
from verl.algorithms.cov_losses import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from verl.algorithms.group_advantages import (
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from verl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
    kl_penalty_forward,
)
from verl.algorithms.otb import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.algorithms.pf_ppo import compute_pf_ppo_reweight_data
from verl.algorithms.policy_losses import (
    compute_policy_loss,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from verl.algorithms.registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    PolicyLossFn,
    get_policy_loss_fn,
    lookup_adv_est,
    register_adv_est_in,
    register_policy_loss,
)

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "PolicyLossFn",
    "agg_loss",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_pf_ppo_reweight_data",
    "compute_policy_loss",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "register_adv_est",
    "register_policy_loss",
]


# These two read this module's ``ADV_ESTIMATOR_REGISTRY`` binding at call time (not the dict object bound at import),
# as veRL's do: code that swaps ``core_algos.ADV_ESTIMATOR_REGISTRY`` for a dict of its own (test isolation) registers
# into and looks up in that dict. Unswapped, it is the one dict of `verl.algorithms.registry`.
def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under ``name_or_enum`` (see `verl.algorithms.registry`)."""
    return register_adv_est_in(ADV_ESTIMATOR_REGISTRY, name_or_enum)


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The advantage estimator registered under ``name_or_enum``; ``ValueError`` listing the valid names if none."""
    return lookup_adv_est(ADV_ESTIMATOR_REGISTRY, name_or_enum)
