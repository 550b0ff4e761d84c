"""`DataParallelPPOActor`: log-probs and the PPO policy update over a data-parallel (FSDP) policy model.

The actor sees this rank's share of a batch. ``update_policy`` walks ``ppo_epochs`` × mini-batches × micro-batches,
accumulating gradients over the micro-batches of a mini-batch and stepping the optimizer once per mini-batch. Loss
aggregation gets the *global* token and sequence counts of the mini-batch (summed over the data-parallel ranks), so
the gradient does not depend on how the batch was split over ranks and micro-batches.

Two switches change how the work is cut, not the result: ``use_remove_padding`` forwards each micro-batch without
its pad tokens (packed into one row with flash attention, trimmed to the columns some row uses otherwise;
`verl.utils.padding`), and ``use_dynamic_bsz`` forms micro-batches by a token budget
instead of a row count (`verl.utils.seqlen_balancing.rearrange_micro_batches`), restoring the row order of outputs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist

from verl.algorithms.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.base_config import omega_conf_to_dataclass
from verl.protocol import DataProto
from verl.utils.fsdp_utils import engine_of
from verl.utils.padding import forward_without_padding, pad_input, takes_logits_to_keep
from verl.utils.py_functional import call_with_accepted_kwargs
from verl.utils.seqlen_balancing import rearrange_micro_batches, restore_order
from verl.utils.torch_functional import entropy_from_logits, logprobs_from_logits
from verl.utils.ulysses import check_sp_size
from verl.workers.actor.distillation_term import DistillationTerm, reduce_micro_metrics
from verl.workers.actor.zero_adv import ZeroAdvantageSkip, zero_adv_skip_reason
from verl.workers.config.actor import ActorConfig, RefConfig
from verl.workers.config.distillation import DistillationConfig
from verl.workers.engine.base import TrainingEngine, as_engine

__all__ = [
    "DataParallelPPOActor",
    "ForwardOutputs",
    "UpdateStep",
    "global_counts",
    "resolve_actor_config",
    "split_micro_batches",
]

logger = logging.getLogger(__name__)


def iter_mini_batches(data: DataProto, config: Any, mini_size: int):
    """``config.ppo_epochs`` passes over ``data`` in mini-batches of ``mini_size`` rows (reshuffled per epoch with
    ``data_loader_seed + epoch`` when ``shuffle``). Yields ``(mini_batch, global batch info, local token count)``:
    the info (dp size, tokens and sequences over all ranks) is what ``agg_loss`` needs to be split-invariant."""
    for epoch in range(config.ppo_epochs):
        order = data
        if config.shuffle:
            generator = torch.Generator().manual_seed(config.data_loader_seed + epoch)
            order = data.select_idxs(torch.randperm(len(data), generator=generator))
        for mini_batch in order.split(mini_size):
            mask = mini_batch.batch["response_mask"]
            tokens, seqs, dp_size = global_counts(mask)
            info = {"dp_size": dp_size, "batch_num_tokens": tokens, "global_batch_size": seqs}
            yield mini_batch, info, max(float(mask.sum()), 1.0)


def global_counts(response_mask: torch.Tensor) -> tuple[float, float, int]:
    """(valid tokens, sequences with a valid token) of ``response_mask`` summed over all ranks, and the dp size."""
    local = torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).to(torch.float64).cpu()
    dp_size = 1
    if dist.is_available() and dist.is_initialized():
        dp_size = dist.get_world_size()
        dist.all_reduce(local)
    return float(local[0]), float(local[1]), dp_size


def split_micro_batches(
    data: DataProto, micro_batch_size: int | None, use_dynamic_bsz: bool = False, max_token_len: int | None = None
) -> tuple[list[DataProto], list[list[int]] | None]:
    """Micro-batches of ``data``: ``micro_batch_size`` rows each, or with ``use_dynamic_bsz`` at most
    ``max_token_len`` valid tokens each (the count agreed over the default process group, so FSDP collectives line
    up). Returns them and, for dynamic ones, the row indices each holds (for ``restore_order``; None otherwise).

    Raises:
        ValueError: a missing or non-positive size or token budget.
    """
    if use_dynamic_bsz:
        if max_token_len is None:
            raise ValueError("use_dynamic_bsz needs a token budget (max_token_len / ppo_max_token_len_per_gpu)")
        group = dist.group.WORLD if dist.is_available() and dist.is_initialized() else None
        return rearrange_micro_batches(data, max_token_len=int(max_token_len), dp_group=group)
    if micro_batch_size is None or micro_batch_size <= 0:
        raise ValueError(f"micro-batch size must be a positive integer, got {micro_batch_size!r}")
    return data.split(int(micro_batch_size)), None


def inference_micro_batches(data: DataProto) -> tuple[list[DataProto], list[list[int]] | None]:
    """The micro-batches of a no-grad pass (log-probs, values) over ``data``'s model inputs, as its ``meta_info``
    asks: ``micro_batch_size`` rows each (default: the whole batch), or with ``use_dynamic_bsz`` at most
    ``max_token_len`` tokens each; see :func:`split_micro_batches`."""
    meta = data.meta_info
    return split_micro_batches(
        data.select(batch_keys=["responses", "input_ids", "attention_mask", "position_ids"]),
        meta.get("micro_batch_size") or len(data),
        bool(meta.get("use_dynamic_bsz", False)),
        meta.get("max_token_len"),
    )


def resolve_actor_config(config: Any) -> ActorConfig | RefConfig:
    """The typed config of an actor built from ``config``: an ``ActorConfig`` / ``RefConfig`` as it is; a mapping
    with a ``_target_`` (a recipe's ``ActorConfig`` subclass, e.g. SPPO's with ``sppo_eta``) as that class; any
    other mapping as an ``ActorConfig``, or as a ``RefConfig`` when its keys are a ref policy's (veRL's recipes
    pass ``config.ref`` to the same actor class). ``use_fused_kernels`` (which recipes set on ``config.ref``) must
    be false: fused kernels are not implemented."""
    if isinstance(config, ActorConfig | RefConfig):
        return config
    values = dict(config.items())
    if values.get("use_fused_kernels"):
        raise NotImplementedError("use_fused_kernels=true: fused log-prob kernels are not implemented")
    if values.get("_target_"):
        target = str(values["_target_"])
        if target.startswith("verl."):  # a recipe's own keys beside verl's class (SPIN's dpo_beta) are its code's
            from verl.base_config import _locate
            from verl.workers.config.builders import known_keys

            config = known_keys(config, _locate(target), "actor")
        return omega_conf_to_dataclass(config)
    ref_keys = {f.name for f in dataclasses.fields(RefConfig)}
    actor_keys = {f.name for f in dataclasses.fields(ActorConfig)}
    keys = set(values) - {"use_fused_kernels"}
    if keys <= ref_keys and not keys <= actor_keys:
        return omega_conf_to_dataclass({k: values[k] for k in keys}, RefConfig)
    return omega_conf_to_dataclass(config, ActorConfig)


def fold_micro_sums(sums: dict[str, float], micro: dict[str, float]) -> None:
    """Add one micro-batch's metric contributions (:meth:`DataParallelPPOActor._micro_batch_loss`) into the
    mini-batch's: the distillation term's ``_min`` / ``_max`` keep the extreme, everything else adds up."""
    for key, value in micro.items():
        if key.startswith("actor/distillation/") and key.endswith("_min"):
            sums[key] = min(sums.get(key, float("inf")), value)
        elif key.startswith("actor/distillation/") and key.endswith("_max"):
            sums[key] = max(sums.get(key, float("-inf")), value)
        else:
            sums[key] = sums.get(key, 0.0) + value


@dataclasses.dataclass(frozen=True)
class UpdateStep:
    """What every micro-batch of one mini-batch's update shares: the sampling temperature, whether the entropy is
    computed, whether the update is on-policy, the loss config (with the mini-batch's global counts) and this rank's
    token count in the mini-batch."""

    temperature: float
    calculate_entropy: bool
    on_policy: bool
    loss_config: Any
    local_tokens: float


class ForwardOutputs(tuple):
    """What ``_forward_micro_batch`` returns: the tuple ``(entropy, log_probs)`` that veRL-recipe's actors unpack
    (``entropy`` None unless asked for), also readable by key like veRL's later dict (``["log_probs"]``,
    ``["entropys"]``, ``["sum_pi_squared"]``, ``.get``, ``.keys``, ``in``)."""

    outputs: dict[str, torch.Tensor]

    def __new__(cls, outputs: dict[str, torch.Tensor]) -> ForwardOutputs:
        self = super().__new__(cls, (outputs.get("entropys"), outputs["log_probs"]))
        self.outputs = outputs
        return self

    def __getitem__(self, key: Any) -> Any:
        return self.outputs[key] if isinstance(key, str) else super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        return key in self.outputs if isinstance(key, str) else super().__contains__(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.outputs.get(key, default)

    def keys(self) -> Any:
        return self.outputs.keys()


class DataParallelPPOActor:
    """The PPO actor on one data-parallel rank.

    Args:
        config: the actor config: an ``ActorConfig`` (or ``RefConfig`` for a log-prob-only policy), or a mapping of
            ``ActorConfig`` fields. Per-rank sizes come from ``ppo_mini_batch_size_per_rank`` (ppo_mini_batch_size ×
            rollout_n ÷ data_parallel_size) and ``ppo_micro_batch_size_per_gpu``.
        actor_module, actor_optimizer: veRL's signature: a model (and optimizer) built by the caller, wrapped in a
            :class:`~verl.workers.engine.base.ModuleEngine`. Give ``engine`` instead to step through a training
            engine (the worker passes its ``FSDPEngine``).
        engine: the training engine whose ``module`` is forwarded and whose ``clip_grad_norm_and_step`` and
            ``eval_mode`` the actor uses. A module built by the worker's ``_build_model_optimizer`` carries its
            engine, which is used when the optimizer given is that engine's.

    For veRL recipes that override ``update_policy`` the actor also has ``_forward_micro_batch`` (veRL's call and
    return), ``_optimizer_step``, ``gradient_accumulation`` and ``ulysses_sequence_parallel_size`` (1; more is
    refused by name).
    """

    def __init__(
        self,
        config: Any,
        actor_module: torch.nn.Module | None = None,
        actor_optimizer: torch.optim.Optimizer | None = None,
        *,
        engine: TrainingEngine | None = None,
        distillation: DistillationConfig | None = None,
    ):
        self.config: ActorConfig | RefConfig = resolve_actor_config(config)
        # on-policy distillation's term of the update (distillation.enabled), see verl.workers.actor.distillation_term
        enabled = distillation is not None and distillation.enabled
        self.distillation = DistillationTerm(distillation) if enabled else None
        owner = engine_of(actor_module)
        if engine is None and owner is not None and owner.optimizer is actor_optimizer:
            engine = owner
        self.engine = engine = as_engine(engine, actor_module, actor_optimizer, "DataParallelPPOActor")
        self.actor_module = engine.module
        self.actor_optimizer = engine.optimizer
        self.use_remove_padding = bool(self.config.use_remove_padding)
        self.ulysses_sequence_parallel_size = int(self.config.ulysses_sequence_parallel_size)
        check_sp_size(self.ulysses_sequence_parallel_size)
        self.gradient_accumulation = 1  # veRL's attribute, set by recipes' update_policy
        # the LM head on the positions that read response tokens only (the prompt's logits are never used)
        self._response_logits_only = takes_logits_to_keep(self.actor_module)
        # filled by an on-policy update_policy: the old log-probs and entropys its forward computed
        self.on_policy_outputs: dict[str, torch.Tensor] | None = None
        # why zero-advantage samples are not skipped in the update (None: they are); see verl.workers.actor.zero_adv
        self.zero_adv_skip_reason = (
            zero_adv_skip_reason(self.config) if isinstance(self.config, ActorConfig) else "a log-prob-only policy"
        )
        if self.distillation is not None:
            self.zero_adv_skip_reason = "on-policy distillation (distillation.enabled) reads every sample"

    # ------------------------------------------------------------------ forward
    def _forward_micro_batch(
        self, micro_batch: Any, temperature: float, calculate_entropy: bool = False
    ) -> ForwardOutputs:
        """veRL's forward of one micro-batch (a ``DataProto``, a ``TensorDict`` or a dict of tensors with
        ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``): ``(entropy, log_probs)``, each (bs,
        response_length), ``entropy`` None unless ``calculate_entropy``; also readable by key (`ForwardOutputs`).
        With autograd on, both carry the graph."""
        return ForwardOutputs(self._forward_outputs(micro_batch, temperature, calculate_entropy))

    def _optimizer_step(self) -> torch.Tensor:
        """veRL's step: clip the gradients to ``config.grad_clip``, step the optimizer unless the norm is NaN or
        infinite (then the gradients are dropped, a warning logged); returns the norm before clipping, a tensor."""
        return torch.tensor(self.engine.clip_grad_norm_and_step(self.config.grad_clip))

    def _forward_outputs(
        self,
        micro_batch: Any,
        temperature: float,
        calculate_entropy: bool,
        calculate_sum_pi_squared: bool = False,
        entropy_grad: bool = True,
        distillation_pieces: bool = False,
    ) -> dict[str, torch.Tensor]:
        """``log_probs`` of the response tokens, and their ``entropys`` / ``sum_pi_squared`` (Σ_v π_v² of the
        tempered distribution, for the optimal-token-baseline estimators) when asked for. Shape: (micro_bs,
        response_length) each. ``entropy_grad=False`` computes the entropy outside autograd (a metric only).
        ``distillation_pieces``: also the top-k distillation loss's pieces (the batch's ``teacher_ids`` /
        ``teacher_logprobs`` against these logits, see `verl.workers.actor.distillation_term`).

        With ``use_remove_padding`` the model sees no pad tokens (see `verl.utils.padding`); outputs at padding
        (where the token that predicts a response token is itself padding) are 0.
        """
        batch = micro_batch.batch if isinstance(micro_batch, DataProto) else micro_batch
        responses = batch["responses"]
        bs, response_length = responses.shape
        slot = None
        if self.use_remove_padding:
            output, keep, slot = forward_without_padding(
                self.actor_module,
                batch["input_ids"],
                batch["attention_mask"],
                batch["position_ids"],
                response_length,
                response_logits_only=self._response_logits_only,
            )
            logits = output.logits.flatten(0, 1)[keep]  # (kept, vocab)
        else:
            extra = {"logits_to_keep": response_length + 1} if self._response_logits_only else {}
            output = self.actor_module(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"],
                use_cache=False,
                **extra,
            )
            logits = output.logits[:, -response_length - 1 : -1, :]
        return self._response_outputs(
            logits,
            batch,
            temperature,
            calculate_entropy,
            calculate_sum_pi_squared=calculate_sum_pi_squared,
            entropy_grad=entropy_grad,
            distillation_pieces=distillation_pieces,
            slot=slot,
        )

    def _response_outputs(
        self,
        logits: torch.Tensor,
        batch: Any,
        temperature: float,
        calculate_entropy: bool,
        *,
        calculate_sum_pi_squared: bool = False,
        entropy_grad: bool = True,
        distillation_pieces: bool = False,
        slot: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        """What :meth:`_forward_outputs` returns, from the logits that predict the response tokens: (bs,
        response_length, vocab), or (kept, vocab) with ``slot`` the kept positions of the flattened (bs ·
        response_length) layout (padding removed)."""
        responses = batch["responses"]
        bs, response_length = responses.shape
        labels = responses if slot is None else responses.reshape(-1)[slot]
        if temperature != 1.0:
            logits = logits / temperature
        out = {"log_probs": logprobs_from_logits(logits, labels)}
        if calculate_entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                out["entropys"] = entropy_from_logits(logits)
        if calculate_sum_pi_squared:
            out["sum_pi_squared"] = torch.softmax(logits.float(), dim=-1).square().sum(-1)
        if distillation_pieces:
            out.update(self.distillation.topk_pieces(logits, batch, slot))
        if slot is not None:
            out = {key: pad_input(value, slot, bs, response_length) for key, value in out.items()}
        return out

    def compute_log_prob(
        self, data: DataProto, calculate_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(log_probs, entropys)`` of ``data``'s responses under the current policy, each (bs, response_length);
        ``entropys`` is None unless asked for. See :meth:`compute_log_prob_outputs`."""
        out = self.compute_log_prob_outputs(data, calculate_entropy=calculate_entropy)
        return out["log_probs"], out.get("entropys")

    @torch.no_grad()
    def compute_log_prob_outputs(
        self, data: DataProto, calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False
    ) -> dict[str, torch.Tensor]:
        """``{"log_probs"[, "entropys"][, "sum_pi_squared"]}`` of ``data``'s responses under the current policy,
        each (bs, response_length).

        Reads ``meta_info``: ``micro_batch_size`` (default: the whole batch), ``temperature`` (default 1.0), and
        ``use_dynamic_bsz`` / ``max_token_len`` (token-budget micro-batches; rows come back in ``data``'s order).
        """
        meta = data.meta_info
        temperature = float(meta.get("temperature", 1.0))
        micro_batches, order = inference_micro_batches(data)
        parts: dict[str, list[torch.Tensor]] = defaultdict(list)
        with self.engine.eval_mode():  # eval, no grad; FSDP2 frees the gathered parameters after
            for micro in micro_batches:
                for key, value in self._forward_outputs(
                    micro, temperature, calculate_entropy, calculate_sum_pi_squared
                ).items():
                    parts[key].append(value)
        if order is not None:
            return {key: restore_order(values, order) for key, values in parts.items()}
        return {key: torch.cat(values) for key, values in parts.items()}

    # ------------------------------------------------------------------ update
    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes of mini-batch SGD on ``data`` (this rank's share). Returns ``actor/*`` metrics as
        lists (one entry per mini-batch; the driver averages them over ranks).

        With ``meta_info["old_log_prob_in_update"]`` (one epoch, one mini-batch: the update is on-policy) the batch
        needs no ``old_log_probs``: the update's own forward, before any step, computes the same log-probs as a
        separate pass would, so they serve as the old ones (detached), and they and the entropys are kept in
        :attr:`on_policy_outputs` (rows in ``data``'s order).

        Unless :attr:`zero_adv_skip_reason` says why not, samples whose advantage is exactly zero skip the gradient
        pass (`verl.workers.actor.zero_adv`); ``actor/zero_adv_skip_frac`` is the fraction skipped.
        """
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy needs an optimizer: this actor was built for inference only")
        cfg = self.config
        on_policy = bool(data.meta_info.get("old_log_prob_in_update", False))
        self.on_policy_outputs = None
        temperature = float(data.meta_info.get("temperature", 1.0))
        mini_size = cfg.ppo_mini_batch_size_per_rank
        micro_size = cfg.ppo_micro_batch_size_per_gpu or mini_size
        data = self._update_batch(data, on_policy)
        calculate_entropy = cfg.entropy_coeff != 0 or cfg.calculate_entropy

        metrics: dict[str, list[float]] = defaultdict(list)
        self.actor_module.train()
        for mini_batch, batch_info, local_tokens in iter_mini_batches(data, cfg, mini_size):
            micro_batches, order = split_micro_batches(
                mini_batch, micro_size, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu
            )
            step = UpdateStep(
                temperature,
                calculate_entropy,
                on_policy,
                dataclasses.replace(cfg, global_batch_info=batch_info),
                local_tokens,
            )
            sums, skipped, recorded = self._update_mini_batch(micro_batches, step)
            grad_norm = self.engine.clip_grad_norm_and_step(cfg.grad_clip)
            for key, value in sums.items():
                metrics[key].append(value)
            metrics["actor/grad_norm"].append(grad_norm)
            if self.zero_adv_skip_reason is None:
                metrics["actor/zero_adv_skip_frac"].append(skipped / len(mini_batch))
            if cfg.use_kl_loss:
                metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
            if on_policy:
                self.on_policy_outputs = {
                    key: restore_order(values, order) if order is not None else torch.cat(values)
                    for key, values in recorded.items()
                }
        return dict(metrics)

    def _update_mini_batch(
        self, micro_batches: list[DataProto], step: UpdateStep
    ) -> tuple[dict[str, float], int, dict[str, list[torch.Tensor]]]:
        """Forward and backward of one mini-batch's micro-batches (the gradients accumulate; the caller steps).
        Returns the mini-batch's metric sums, how many rows skipped the gradient pass, and, on-policy, the
        micro-batches' log-probs and entropys (``old_log_probs`` / ``entropys``)."""
        sums: dict[str, float] = {}
        recorded: dict[str, list[torch.Tensor]] = defaultdict(list)
        backward_ran, skipped = False, 0
        for index, micro in enumerate(micro_batches):
            must_backward = index == len(micro_batches) - 1 and not backward_ran
            forward, has_graph, n_skipped = self._forward_for_update(
                micro, step.temperature, step.calculate_entropy, step.on_policy, must_backward
            )
            skipped += n_skipped
            if step.on_policy:
                recorded["old_log_probs"].append(forward["log_probs"].detach())
                recorded["entropys"].append(forward["entropys"].detach())
            loss, micro_sums = self._micro_batch_loss(forward, micro, step)
            if has_graph:
                loss.backward()
                backward_ran = True
            fold_micro_sums(sums, micro_sums)
        return sums, skipped, recorded

    def _update_batch(self, data: DataProto, on_policy: bool) -> DataProto:
        """The keys of ``data`` the update reads (an error naming the missing ones); on-policy updates checked."""
        cfg = self.config
        mini_size = cfg.ppo_mini_batch_size_per_rank
        if on_policy and (cfg.ppo_epochs != 1 or mini_size != len(data)):
            raise ValueError(
                "old_log_prob_in_update needs one PPO epoch and one mini-batch (the update's first forward is then "
                f"the old policy's); got ppo_epochs={cfg.ppo_epochs}, {len(data) // mini_size} mini-batches"
            )
        keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "advantages"]
        if not on_policy:
            keys.append("old_log_probs")
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        if "rollout_is_weights" in data.batch.keys():
            keys.append("rollout_is_weights")
        if self.distillation is not None:
            keys += [k for k in self.distillation.batch_keys(on_policy) if k not in keys]
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_policy needs batch keys {missing}")
        return data.select(batch_keys=keys)

    def _micro_batch_loss(
        self, forward: dict[str, torch.Tensor], micro: Any, step: UpdateStep
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The update's loss of one micro-batch from its forward outputs (its share of the mini-batch's loss: policy
        loss, entropy bonus, KL loss, distillation term) and its metric contributions, which
        :func:`fold_micro_sums` adds into the mini-batch's."""
        cfg, loss_config, on_policy = self.config, step.loss_config, step.on_policy
        mb = micro.batch if isinstance(micro, DataProto) else micro
        batch_info = loss_config.global_batch_info
        mask = mb["response_mask"]
        share = float(mask.sum()) / step.local_tokens
        log_prob = forward["log_probs"]
        old_log_prob = log_prob.detach() if on_policy else mb["old_log_probs"]
        pg_loss, pg_metrics = call_with_accepted_kwargs(  # a user's loss gets what it declares
            get_policy_loss_fn(cfg.policy_loss.loss_mode),
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=mb["advantages"],
            response_mask=mask,
            loss_agg_mode=cfg.loss_agg_mode,
            config=loss_config,
            rollout_is_weights=mb["rollout_is_weights"] if "rollout_is_weights" in mb.keys() else None,
        )
        loss = pg_loss
        sums: dict[str, float] = {"actor/pg_loss": float(pg_loss.detach())}
        if cfg.entropy_coeff != 0 or cfg.calculate_entropy:
            entropy_loss = agg_loss(forward["entropys"], mask, cfg.loss_agg_mode, **batch_info)
            sums["actor/entropy"] = float(entropy_loss.detach())
            loss = loss - cfg.entropy_coeff * entropy_loss
        if cfg.use_kl_loss:
            kld = kl_penalty(log_prob, mb["ref_log_prob"], cfg.kl_loss_type)
            kl_loss = agg_loss(kld, mask, cfg.loss_agg_mode, **batch_info)
            loss = loss + cfg.kl_loss_coef * kl_loss
            sums["actor/kl_loss"] = float(kl_loss.detach())
        if self.distillation is not None:
            loss, distill_metrics = self.distillation.add(loss, loss_config, forward, mb, old_log_prob)
            reduce_micro_metrics(sums, distill_metrics, share)
        for key, value in pg_metrics.items():  # per-token rates: weight micro-batches by their tokens
            sums[key] = sums.get(key, 0.0) + float(value) * share
        return loss, sums

    def _forward_for_update(
        self, micro: DataProto, temperature: float, calculate_entropy: bool, on_policy: bool, must_backward: bool
    ) -> tuple[dict[str, torch.Tensor], bool, int]:
        """The update's forward of one micro-batch: full-size ``log_probs`` (and ``entropys`` when the entropy is
        computed or the update is on-policy), whether they carry a graph to backward through, and how many rows
        skipped the gradient pass (zero advantage: forwarded without gradients, see `verl.workers.actor.zero_adv`)."""
        want_entropy = calculate_entropy or on_policy
        if self.zero_adv_skip_reason is not None:
            pieces = self.distillation is not None and self.distillation.use_topk
            out = self._forward_outputs(
                micro, temperature, want_entropy, entropy_grad=calculate_entropy, distillation_pieces=pieces
            )
            return out, True, 0
        plan = ZeroAdvantageSkip(micro.batch["advantages"], micro.batch["response_mask"], must_backward)
        skipped: dict[str, torch.Tensor] = {}
        if plan.no_grad_rows is not None:
            with torch.no_grad():
                out = self._forward_outputs(micro.select_idxs(plan.no_grad_rows), temperature, want_entropy)
            skipped = out if plan.skipped else {}
        if not plan.grad_pass:
            return skipped, False, plan.skipped
        kept = self._forward_outputs(
            micro.select_idxs(plan.keep_idx), temperature, want_entropy, entropy_grad=calculate_entropy
        )
        return plan.assemble(kept, skipped), True, plan.skipped
