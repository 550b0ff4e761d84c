"""Skipping the forward/backward of samples whose advantage is exactly zero (GRPO groups with equal rewards).

Such a sample adds exactly zero to the policy loss and its gradient when nothing else reads it: no KL loss, no
entropy bonus, and a policy loss that treats each sample on its own (``EXACT_LOSS_MODES``). The actor forwards the
other samples with gradients and the skipped ones in a no-grad pass (a quarter to a third of their cost: no backward,
no recomputed activations), and builds the loss from full-size tensors. So the loss and the metrics see every sample
(``ppo_kl``, the clip fractions, an on-policy update's old log-probs and entropys), the normalisers
(``global_batch_info``) count the whole mini-batch, and the gradient differs from the unskipped update's only by the
order of floating-point sums.

With several data-parallel ranks every rank must run the same sequence of FSDP forwards and backwards: the ranks
agree per micro-batch on which passes run, and a rank with nothing to forward in a pass all others run forwards one
sample (with zero advantage, so zero gradient).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["EXACT_LOSS_MODES", "ZeroAdvantageSkip", "zero_adv_skip_reason", "zero_advantage_rows"]

# Built-in policy losses in which a sample with zero advantage has zero loss and gradient and no influence on the
# other samples' (clip_cov/kl_cov pick tokens by a batch covariance; bypass_mode may normalise IS weights over the
# batch).
EXACT_LOSS_MODES = ("vanilla", "gspo", "sapo", "gpg", "cispo", "geo_mean")


def zero_adv_skip_reason(config: Any) -> str | None:
    """None when the skip is exact for this actor config; otherwise why it is off (for the start-up log)."""
    if not config.skip_zero_advantage_samples:
        return "actor.skip_zero_advantage_samples=false"
    if config.use_kl_loss:
        return "the KL loss (use_kl_loss=true) reads every sample"
    if config.entropy_coeff != 0:
        return f"the entropy bonus (entropy_coeff={config.entropy_coeff}) reads every sample"
    mode = config.policy_loss.loss_mode
    if mode not in EXACT_LOSS_MODES:
        return f"policy loss {mode!r} is not one of {list(EXACT_LOSS_MODES)}, where a zero-advantage sample is inert"
    return None


def zero_advantage_rows(advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(bs,) bool: rows whose advantage is exactly 0 on every response token (rows without tokens included)."""
    return ((advantages == 0) | (response_mask == 0)).all(dim=-1)


def _any_rank(flags: list[bool]) -> list[bool]:
    """Each flag OR-ed over the default process group (unchanged without one)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flags
    tensor = torch.tensor([int(f) for f in flags], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]


class ZeroAdvantageSkip:
    """The plan for one micro-batch: which rows take the gradient pass, which are skipped, which no-grad pass runs.

    Args:
        advantages, response_mask: the micro-batch's, (bs, response_length).
        must_backward: a backward must run (the mini-batch's last micro-batch, when none has run yet: the optimizer
            then steps on zero gradients as the unskipped update would, rather than on none).
    """

    def __init__(self, advantages: torch.Tensor, response_mask: torch.Tensor, must_backward: bool):
        skip = zero_advantage_rows(advantages, response_mask)
        keep_idx, skip_idx = (~skip).nonzero().flatten(), skip.nonzero().flatten()
        self.grad_pass, no_grad_pass = _any_rank([len(keep_idx) > 0 or must_backward, len(skip_idx) > 0])
        if self.grad_pass and len(keep_idx) == 0:  # join the others' backward with one inert sample
            keep_idx, skip_idx = skip_idx[:1], skip_idx[1:]
        self.keep_idx, self.skip_idx = keep_idx, skip_idx
        # rows of the no-grad pass: the skipped ones, or one row only to keep the ranks' FSDP passes in step
        self.no_grad_rows = None
        if no_grad_pass:
            self.no_grad_rows = skip_idx if len(skip_idx) else torch.zeros(1, dtype=torch.long)

    @property
    def skipped(self) -> int:
        """Rows whose gradient pass was skipped."""
        return len(self.skip_idx)

    def assemble(self, kept: dict[str, torch.Tensor], skipped: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Full-size outputs in the micro-batch's row order from the kept rows' (with gradients) and the skipped
        rows' (detached) outputs."""
        if not len(self.skip_idx):
            return kept
        if not len(self.keep_idx):
            return skipped
        order = torch.cat([self.keep_idx, self.skip_idx])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        out = {}
        for key, value in kept.items():
            other = skipped[key].to(device=value.device, dtype=value.dtype)
            out[key] = torch.cat([value, other]).index_select(0, inverse.to(value.device))
        return out
