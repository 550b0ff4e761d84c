"""Per-step metrics with veRL's names: data statistics, stage timings, throughput, speculative decoding, the
rollout's MoE load balance, the reduction of the per-worker lists that come back in ``meta_info["metrics"]``, and
(re-exported from `verl.trainer.ppo.validation_metrics`) the validation statistics."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.validation_metrics import bootstrap_metric, calc_maj_val, process_validation_metrics
from verl.utils.fs import copy_to_local
from verl.utils.metric import reduce_metrics  # re-exported here, veRL's older import path
from verl.utils.model import update_model_config

logger = logging.getLogger(__name__)

__all__ = [
    "RolloutMoELoadBalanceMetricsAccumulator",
    "bootstrap_metric",
    "calc_maj_val",
    "compute_data_metrics",
    "compute_moe_lb_metrics",
    "compute_rollout_moe_load_balance_metrics",
    "compute_spec_decode_metrics",
    "compute_partial_rollout_metrics",
    "compute_staleness_metrics",
    "compute_throughout_metrics",
    "compute_timing_metrics",
    "get_hf_config_override_kwargs",
    "get_metric_data_with_optional_routed_experts",
    "infer_moe_num_experts",
    "infer_rollout_moe_num_experts",
    "process_validation_metrics",
    "reduce_metrics",
]


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def compute_staleness_metrics(batch: DataProto, weight_version: int) -> dict[str, float]:
    """``async/weight_version``: the version of the weights the step trains from; ``async/staleness/{mean,max}``:
    over the samples, how many versions older than that the oldest token of each is (from each sample's
    ``weight_version_ranges``; samples without recorded versions are left out). 0 in ``sync``.

    veRL 0.10's names beside them, per trajectory (its ``global_steps − 1`` is our ``weight_version``; its
    ``min_global_steps`` / ``max_global_steps`` a sample's oldest and newest token version):
    ``training/off_policy/trajectory_spans/*`` (newest − oldest + 1: 1 for one version),
    ``training/off_policy/trajectory_staleness/*`` (weight_version − newest) and
    ``training/off_policy/trajectory_staleness_worst/*`` (weight_version − oldest: ``async/staleness``)."""
    metrics = {"async/weight_version": float(weight_version)}
    ranges = batch.non_tensor_batch.get("weight_version_ranges")
    samples = [[v for *_, v in sample] for sample in ranges if len(sample)] if ranges is not None else []
    if samples:
        oldest = np.asarray([min(s) for s in samples], dtype=np.float64)
        newest = np.asarray([max(s) for s in samples], dtype=np.float64)
        staleness = weight_version - oldest
        metrics["async/staleness/mean"] = float(staleness.mean())
        metrics["async/staleness/max"] = float(staleness.max())
        prefix = "training/off_policy/trajectory_"
        metrics.update(_stats(f"{prefix}spans", torch.from_numpy(newest - oldest + 1)))
        metrics.update(_stats(f"{prefix}staleness", torch.from_numpy(weight_version - newest)))
        metrics.update(_stats(f"{prefix}staleness_worst", torch.from_numpy(staleness)))
    return metrics


def compute_partial_rollout_metrics(batch: DataProto) -> dict[str, float]:
    """veRL's ``fully_async/partial/{total_partial_num,partial_ratio,max_partial_span}``: the samples whose tokens
    come from more than one weight version (a request resumed with newer weights), their share of the batch and the
    widest span of versions in one sample; and ``fully_async/partial/resumed_requests``: how often the version
    changes inside the samples' responses (each change is a request aborted at a push and resumed), from the
    samples' ``weight_version_ranges``."""
    ranges = batch.non_tensor_batch.get("weight_version_ranges")
    samples = [sample for sample in ranges if len(sample)] if ranges is not None else []
    if not samples:
        return {}
    spans = np.array([max(v for *_, v in s) - min(v for *_, v in s) for s in samples], dtype=np.float64)
    changes = sum(sum(a[2] != b[2] for a, b in zip(s, s[1:])) for s in samples)
    return {
        "fully_async/partial/total_partial_num": float((spans > 0).sum()),
        "fully_async/partial/partial_ratio": float((spans > 0).mean()),
        "fully_async/partial/max_partial_span": float(spans.max()),
        "fully_async/partial/resumed_requests": float(changes),
    }


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """``critic/score/*`` (sequence sums of ``token_level_scores``), ``critic/rewards/*``, ``critic/advantages/*``,
    ``critic/returns/*``, ``critic/values/*`` and ``critic/vf_explained_var`` (with a critic), ``response_length/*``
    (+ ``clip_ratio``), ``response/aborted_ratio`` (samples with an empty response: aborted before their first token)
    and ``response_length_non_aborted/*`` over the others, ``prompt_length/*`` (+ ``clip_ratio``), and
    ``num_turns/{min,max,mean}`` (and veRL 0.10's ``training/num_turns/*``) when the agent loops recorded
    ``__num_turns__`` (and ``tool_call_counts/{min,max,
    mean}`` when the tool agent ran)."""
    b = batch.batch
    response_mask = b["response_mask"].bool()
    max_response_length = b["responses"].shape[-1]
    prompt_mask = b["attention_mask"][:, :-max_response_length].bool()
    max_prompt_length = prompt_mask.shape[-1]
    response_length = response_mask.sum(-1).float()
    prompt_length = prompt_mask.sum(-1).float()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][response_mask]))
    metrics.update(_stats("critic/returns", b["returns"][response_mask]))
    if use_critic and "values" in b.keys():
        values = b["values"][response_mask]
        returns = b["returns"][response_mask]
        metrics.update(_stats("critic/values", values))
        variance = torch.var(returns)
        metrics["critic/vf_explained_var"] = float(1.0 - torch.var(returns - values) / (variance + 1e-5))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float((response_length == max_response_length).float().mean())
    aborted = response_length == 0  # veRL's reading: a request aborted before its first token
    metrics["response/aborted_ratio"] = float(aborted.float().mean())
    kept = response_length[~aborted]
    if kept.numel():
        metrics.update(_stats("response_length_non_aborted", kept))
        metrics["response_length_non_aborted/clip_ratio"] = float((kept == max_response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = float((prompt_length == max_prompt_length).float().mean())
    if "__num_turns__" in batch.non_tensor_batch:
        turns = np.asarray(batch.non_tensor_batch["__num_turns__"], dtype=np.float64)
        for stat in ("min", "max", "mean"):  # and veRL 0.10's name
            metrics[f"num_turns/{stat}"] = metrics[f"training/num_turns/{stat}"] = float(getattr(turns, stat)())
    if "tool_call_counts" in batch.non_tensor_batch:
        calls = np.array([c or 0 for c in batch.non_tensor_batch["tool_call_counts"]], dtype=np.float64)
        metrics.update({f"tool_call_counts/{stat}": float(getattr(calls, stat)()) for stat in ("min", "max", "mean")})
    return metrics


def _compute_response_info(batch: DataProto) -> dict[str, torch.Tensor]:
    """veRL's helper: ``prompt_length`` and ``response_length`` per sample (float) and the ``response_mask``.

    The response mask is the batch's ``response_mask`` when it has one (tool-observation tokens of agent loops are
    not generated, so they do not count), else the response part of ``attention_mask`` (veRL's reading).
    """
    b = batch.batch
    width = b["responses"].shape[-1]
    response_mask = b["response_mask"] if "response_mask" in b.keys() else b["attention_mask"][:, -width:]
    return {
        "response_mask": response_mask,
        "prompt_length": b["attention_mask"][:, :-width].sum(-1).float(),
        "response_length": response_mask.sum(-1).float(),
    }


def _token_counts(batch: DataProto) -> dict[str, int]:
    info = _compute_response_info(batch)
    response = int(info["response_length"].sum())
    prompt = int(info["prompt_length"].sum())
    return {
        "gen": response,
        "ref": response + prompt,
        "values": response + prompt,
        "adv": response,
        "update_critic": response + prompt,
        "update_actor": response + prompt,
    }


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` for every timed stage and ``timing_per_token_ms/<stage>`` where tokens are known (0.0 for
    a stage that saw none)."""
    tokens = _token_counts(batch)
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    for name, count in tokens.items():
        if name in timing_raw:  # 0.0 when the stage saw no tokens (veRL's), so every step logs the same keys
            metrics[f"timing_per_token_ms/{name}"] = float(timing_raw[name]) * 1000.0 / count if count > 0 else 0.0
    return metrics


def compute_throughout_metrics(batch: DataProto, timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """``perf/total_num_tokens``, ``perf/time_per_step`` and ``perf/throughput`` (tokens per second per worker).
    (veRL's name, typo included.) The token count is the sum of ``meta_info["global_token_num"]`` (per-sample
    counts, as veRL's trainer records them) when the batch carries it, else the ones of ``attention_mask``."""
    global_token_num = batch.meta_info.get("global_token_num")
    if global_token_num is not None:
        total_tokens = int(sum(int(n) for n in global_token_num))
    else:
        total_tokens = int(batch.batch["attention_mask"].sum())
    step_time = float(timing_raw.get("step", 0.0))
    metrics = {"perf/total_num_tokens": float(total_tokens), "perf/time_per_step": step_time}
    if step_time > 0 and n_gpus > 0:
        metrics["perf/throughput"] = total_tokens / (step_time * n_gpus)
    return metrics


def compute_spec_decode_metrics(
    spec_drafts: Sequence[float] | np.ndarray | None,
    spec_accepts: Sequence[float] | np.ndarray | None,
    spec_verifies: Sequence[float] | np.ndarray | None,
    non_padding_mask: Sequence[bool] | np.ndarray | None = None,
) -> dict[str, float]:
    """Speculative-decoding acceptance, each sample weighing the same whatever its length.

    ``rollout/spec_accept_rate``: the mean of accepted / drafted tokens; ``rollout/spec_accept_length``: the mean
    of 1 + accepted tokens per verification step (tokens gained per target-model forward). A sample that drafted
    nothing (or was never verified) is left out of that mean rather than counted as 0. ``non_padding_mask`` drops
    padded placeholder samples. All three counts None: ``{}`` (no spec decoding); only some: ValueError.

    Shape: each input [batch].
    """
    given = [x is not None for x in (spec_drafts, spec_accepts, spec_verifies)]
    if not any(given):
        return {}
    if not all(given):
        raise ValueError(
            "compute_spec_decode_metrics needs all of spec_drafts / spec_accepts / spec_verifies, got "
            f"{['spec_drafts', 'spec_accepts', 'spec_verifies'][given.index(False)]}=None"
        )
    drafts, accepts, verifies = (
        np.asarray(x, dtype=np.float64).reshape(-1) for x in (spec_drafts, spec_accepts, spec_verifies)
    )
    if not len(drafts) == len(accepts) == len(verifies):
        raise ValueError(f"spec decode counts differ in length: {len(drafts)}, {len(accepts)}, {len(verifies)}")
    if non_padding_mask is not None:
        keep = np.asarray(non_padding_mask, dtype=bool).reshape(-1)
        if len(keep) != len(drafts):
            raise ValueError(f"non_padding_mask has {len(keep)} entries for {len(drafts)} samples")
        drafts, accepts, verifies = drafts[keep], accepts[keep], verifies[keep]
    metrics = {}
    if (drafts > 0).any():
        metrics["rollout/spec_accept_rate"] = float(np.mean(accepts[drafts > 0] / drafts[drafts > 0]))
    if (verifies > 0).any():
        metrics["rollout/spec_accept_length"] = float(np.mean(1.0 + accepts[verifies > 0] / verifies[verifies > 0]))
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# Rollout MoE load balance (veRL's ``rollout/moe/*``): how evenly the rollout's router spread response tokens over
# the experts, from the ``routed_experts`` ids [batch, seq, layers, top_k] the rollout engine returns.
# A layer's violation per expert is ``load_share * num_experts - 1``: 0 for a perfectly even spread, -1 for an
# expert that got nothing, ``num_experts - 1`` for one that got everything.

_NUM_LOCAL_EXPERTS_MODEL_TYPES = frozenset({"mixtral", "gpt_oss"})  # models whose `num_local_experts` is global
MOE_PREFIX = "rollout/moe"


def __getattr__(name: str) -> Any:
    """``AutoConfig`` on first use (transformers is slow to import and only needed to read an HF config)."""
    if name == "AutoConfig":
        from transformers import AutoConfig

        return AutoConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """``obj[name]`` of a mapping / DictConfig, else ``obj.name``; ``default`` when absent."""
    if hasattr(obj, "get"):
        return obj.get(name, default)
    return getattr(obj, name, default)


def get_hf_config_override_kwargs(override_config: Any) -> dict[str, Any]:
    """The HF-config overrides of ``model.override_config``: its ``model_config`` entry when present, else itself
    (a DictConfig becomes plain containers)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(override_config, DictConfig):
        override_config = OmegaConf.to_container(override_config, resolve=True)
    if not override_config:
        return {}
    return dict(override_config.get("model_config", override_config))


def infer_moe_num_experts(model_config: Any) -> int | None:
    """The number of routed experts named in a model config (or its ``hf_config`` / ``text_config`` /
    ``override_config`` [``.model_config``]), from ``num_experts`` / ``n_routed_experts``, or ``num_local_experts``
    for the model types where that count is global (Mixtral, gpt-oss); None when none says."""
    candidates = [model_config]
    hf_config = _field(model_config, "hf_config")
    if hf_config is not None:
        candidates += [hf_config, _field(hf_config, "text_config")]
    candidates.append(_field(model_config, "text_config"))
    override = _field(model_config, "override_config")
    if override is not None:
        candidates += [override, _field(override, "model_config"), _field(override, "text_config")]
    for candidate in candidates:
        if candidate is None:
            continue
        for name in ("num_experts", "n_routed_experts"):
            value = _field(candidate, name)
            if value is not None:
                return int(value)
        if _field(candidate, "model_type") in _NUM_LOCAL_EXPERTS_MODEL_TYPES:
            value = _field(candidate, "num_local_experts")
            if value is not None:
                return int(value)
    return None


def infer_rollout_moe_num_experts(model_config: Any) -> int | None:
    """`infer_moe_num_experts` of the model config, else of its HF config (read from ``local_hf_config_path`` or
    ``path``, with the ``override_config`` overrides applied); None without a path. (veRL also tries the model's
    separate HF-config path, a key this verl does not read anywhere.)"""
    num_experts = infer_moe_num_experts(model_config)
    if num_experts is not None:
        return num_experts
    path = _field(model_config, "local_hf_config_path") or _field(model_config, "path")
    if path is None:
        return None
    from transformers import AutoConfig

    local_path = copy_to_local(path, use_shm=bool(_field(model_config, "use_shm", False)))
    hf_config = AutoConfig.from_pretrained(
        local_path, trust_remote_code=bool(_field(model_config, "trust_remote_code", False))
    )
    overrides = get_hf_config_override_kwargs(_field(model_config, "override_config", {}))
    if overrides:
        update_model_config(hf_config, overrides)
    return infer_moe_num_experts(hf_config)


def _compute_rollout_moe_load_counts(
    routed_experts: torch.Tensor | None, response_mask: torch.Tensor | None, num_experts: int | None
) -> torch.Tensor | None:
    """Assignments per expert over the response tokens, ``[layers, num_experts]``; None when nothing can be counted.

    Each sequence's last valid response token is left out: it was sampled but never fed back through the model,
    so its slot holds whatever the batch assembly put there, not a routing record.

    Shape: routed_experts [batch, seq, layers, top_k] whose last ``response_mask.shape[1]`` positions are the
    response; response_mask [batch, response_len].
    """
    if routed_experts is None or response_mask is None or not num_experts or num_experts <= 0:
        return None
    if routed_experts.dim() != 4 or response_mask.dim() != 2 or response_mask.shape[0] != routed_experts.shape[0]:
        logger.warning(
            "rollout MoE metrics skipped: routed_experts %s must be [batch, seq, layers, top_k] and response_mask %s "
            "[batch, response_len]",
            tuple(routed_experts.shape),
            tuple(response_mask.shape),
        )
        return None
    response_len = response_mask.shape[1]
    if response_len == 0:
        return None
    if routed_experts.shape[1] < response_len:
        logger.warning(
            "rollout MoE metrics skipped: routed_experts has %d positions, fewer than the %d response positions",
            routed_experts.shape[1],
            response_len,
        )
        return None
    response_experts = routed_experts[:, routed_experts.shape[1] - response_len :]
    mask = response_mask.to(device=response_experts.device, dtype=torch.bool)
    positions = torch.arange(response_len, device=mask.device)
    last_valid = torch.where(mask, positions, torch.full_like(positions, -1)).amax(dim=-1)  # -1: no valid token
    mask = mask & (positions.unsqueeze(0) != last_valid.unsqueeze(1))
    selected = response_experts[mask].detach().to(device="cpu", dtype=torch.long)  # [tokens, layers, top_k]
    if selected.numel() == 0:
        return None
    low, high = int(selected.min()), int(selected.max())
    if low < 0 or high >= num_experts:
        logger.warning("rollout MoE metrics skipped: expert ids span [%d, %d], outside [0, %d)", low, high, num_experts)
        return None
    return torch.stack([torch.bincount(layer.flatten(), minlength=num_experts) for layer in selected.unbind(dim=1)])


def _moe_metrics_from_counts(load_counts: torch.Tensor | None, prefix: str = MOE_PREFIX) -> dict[str, float]:
    """``<prefix>/{max,min,avg}_vio/layer_<i>`` per layer, and the max and mean of each over the layers."""
    if load_counts is None or load_counts.numel() == 0:
        return {}
    counts = load_counts.double()
    share = counts / counts.sum(dim=1, keepdim=True).clamp_min(1.0)
    violation = share * counts.shape[1] - 1.0
    per_layer = {
        "max_vio": violation.max(dim=1).values,
        "min_vio": violation.min(dim=1).values,
        "avg_vio": violation.abs().mean(dim=1),
    }
    metrics: dict[str, float] = {}
    for layer in range(counts.shape[0]):
        for name, values in per_layer.items():
            metrics[f"{prefix}/{name}/layer_{layer}"] = float(values[layer])
    for name, values in per_layer.items():
        metrics[f"{prefix}/{name}/max"] = float(values.max())
        metrics[f"{prefix}/{name}/avg"] = float(values.mean())
    return metrics


def compute_rollout_moe_load_balance_metrics(
    routed_experts: torch.Tensor | None,
    response_mask: torch.Tensor | None,
    num_experts: int | None,
    prefix: str = MOE_PREFIX,
) -> dict[str, float]:
    """The load-balance metrics of one batch (``{}`` when it has no countable routing records)."""
    counts = _compute_rollout_moe_load_counts(routed_experts, response_mask, num_experts)
    return _moe_metrics_from_counts(counts, prefix=prefix)


class RolloutMoELoadBalanceMetricsAccumulator:
    """Sums the rollout's expert assignment counts over the steps of one logging interval.

    ``num_experts`` comes from each `update` call or, once, from ``model_config`` (`infer_rollout_moe_num_experts`).
    Each reason to skip is logged once (`warn_skip_once`).
    """

    def __init__(self, model_config: Any | None = None) -> None:
        self.model_config = model_config
        self.load_counts: torch.Tensor | None = None
        self.num_experts: int | None = None
        self.num_experts_initialized = False
        self.routed_experts_retry_after_step = 0
        self.warned_skip_keys: set[str] = set()

    def should_request_routed_experts(self, global_steps: int) -> bool:
        """Whether this step asks the data store for ``routed_experts`` (not while a failed request is deferred)."""
        return global_steps >= self.routed_experts_retry_after_step

    def defer_routed_experts_retry(self, global_steps: int, interval: int) -> None:
        """Ask again for ``routed_experts`` only after one more interval."""
        self.routed_experts_retry_after_step = global_steps + max(interval, 1)

    def warn_skip_once(self, key: str, message: str) -> None:
        """Log ``message`` the first time ``key`` is given."""
        if key not in self.warned_skip_keys:
            self.warned_skip_keys.add(key)
            logger.warning(message)

    def _num_experts(self) -> int | None:
        if not self.num_experts_initialized:
            self.num_experts_initialized = True
            if self.model_config is not None:
                try:
                    self.num_experts = infer_rollout_moe_num_experts(self.model_config)
                except Exception as error:  # an unreadable HF config only disables these metrics
                    self.warn_skip_once("num_experts_exception", f"cannot infer the rollout's MoE num_experts: {error}")
            if self.num_experts is None:
                self.warn_skip_once(
                    "num_experts_missing",
                    "rollout MoE load-balance metrics skipped: num_experts is not in actor_rollout_ref.model or the "
                    "Hugging Face config",
                )
        return self.num_experts

    def update(
        self, routed_experts: torch.Tensor | None, response_mask: torch.Tensor | None, num_experts: int | None = None
    ) -> bool:
        """Add one batch's counts; False when it had none. Counts of another shape (a new model) start over."""
        if num_experts is None:
            num_experts = self._num_experts()
        counts = _compute_rollout_moe_load_counts(routed_experts, response_mask, num_experts)
        if counts is None:
            return False
        if self.load_counts is not None and self.load_counts.shape != counts.shape:
            logger.warning(
                "rollout MoE counts changed shape from %s to %s; starting over",
                tuple(self.load_counts.shape),
                tuple(counts.shape),
            )
            self.load_counts = None
        self.load_counts = counts if self.load_counts is None else self.load_counts + counts
        return True

    def total_assignments(self) -> int:
        """The number of (token, layer, top-k slot) assignments counted so far."""
        return 0 if self.load_counts is None else int(self.load_counts.sum())

    def compute(self, prefix: str = MOE_PREFIX) -> dict[str, float]:
        """The metrics of the counts so far (``{}`` without any)."""
        return _moe_metrics_from_counts(self.load_counts, prefix=prefix)

    def reset(self) -> None:
        """Forget the counts."""
        self.load_counts = None

    def pop_metrics(self, prefix: str = MOE_PREFIX) -> dict[str, float]:
        """`compute`, then `reset`."""
        metrics = self.compute(prefix=prefix)
        self.reset()
        return metrics


def compute_moe_lb_metrics(
    metrics_batch: Any,
    moe_lb_metrics_interval: int,
    global_steps: int,
    accumulator: RolloutMoELoadBalanceMetricsAccumulator,
) -> dict[str, float]:
    """Add the batch's ``routed_experts`` counts; every ``moe_lb_metrics_interval`` steps return the interval's
    metrics with ``rollout/moe/routed_experts_found`` and ``rollout/moe/routed_expert_assignments``."""
    if moe_lb_metrics_interval <= 0:
        return {}
    tensors = metrics_batch.batch
    updated = accumulator.update(tensors.get("routed_experts", None), tensors.get("response_mask", None))
    if global_steps % moe_lb_metrics_interval != 0:
        return {}
    assignments = accumulator.total_assignments()
    metrics: dict[str, Any] = accumulator.pop_metrics()
    metrics[f"{MOE_PREFIX}/routed_experts_found"] = float(assignments > 0)
    metrics[f"{MOE_PREFIX}/routed_expert_assignments"] = assignments
    if not updated and assignments == 0:
        accumulator.warn_skip_once(
            "no_routed_expert_counts", "rollout MoE load-balance metrics skipped: no routed expert ids were returned"
        )
    return metrics


def get_metric_data_with_optional_routed_experts(
    keys: list[str],
    partition_id: str,
    fields: list[str],
    moe_lb_metrics_interval: int,
    global_steps: int,
    accumulator: RolloutMoELoadBalanceMetricsAccumulator,
    kv_batch_get: Callable[..., Any],
) -> Any:
    """``kv_batch_get`` of ``fields`` plus ``routed_experts`` when MoE metrics are due; a store without that field
    (a ValueError naming it) gets the plain request, and the next try waits one interval."""
    if moe_lb_metrics_interval <= 0 or not accumulator.should_request_routed_experts(global_steps):
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
    try:
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=[*fields, "routed_experts"])
    except ValueError as error:
        if "routed_experts" not in str(error):
            raise
        accumulator.defer_routed_experts_retry(global_steps, moe_lb_metrics_interval)
        accumulator.warn_skip_once("missing_routed_experts", f"rollout MoE load-balance metrics skipped: {error}")
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
