"""Schema of ``*.fsdp_config`` (``actor.fsdp_config``, ``ref.fsdp_config``, ``critic.model.fsdp_config``).

veRL's ``FSDPEngineConfig`` field names and defaults. Both ``strategy: fsdp`` and ``strategy: fsdp2`` select verl's one
FSDP engine, built on FSDP2 (``torch.distributed.fsdp.fully_shard``); FSDP1 is not used.

`McoreEngineConfig` is veRL's ``megatron`` schema (field names and defaults), so configs and recipes that build it
parse and validate here; this verl has no Megatron engine to run it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from verl.base_config import BaseConfig
from verl.utils.torch_dtypes import DTYPE_NAMES, canonical_dtype_name

__all__ = [
    "DTYPE_NAMES",
    "FSDP_STRATEGIES",
    "MIXED_PRECISION_KEYS",
    "WRAP_POLICY_KEYS",
    "FSDPEngineConfig",
    "McoreEngineConfig",
    "canonical_dtype_name",
]

logger = logging.getLogger(__name__)

# Strategy names that select the FSDP engine (see verl.workers.engine.get_engine_class).
FSDP_STRATEGIES = ("fsdp", "fsdp2")

# Keys of ``wrap_policy``: FSDP2 shards each transformer block; ``transformer_layer_cls_to_wrap`` overrides the block
# classes (default: the model's ``_no_split_modules``); ``min_num_params`` is accepted for veRL compatibility (FSDP1's
# size-based policy; the engine does not use it); ``disable: true`` shards only the root module; ``layer_class`` is
# another name for ``transformer_layer_cls_to_wrap`` (the two may not disagree).
WRAP_POLICY_KEYS = ("min_num_params", "transformer_layer_cls_to_wrap", "layer_class", "disable")

# Keys of ``mixed_precision`` (each a dtype name, except the boolean ``cast_forward_inputs``).
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype", "cast_forward_inputs")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class FSDPEngineConfig(BaseConfig):
    """How a model is sharded, cast, offloaded and seeded by the FSDP engine.

    Args:
        wrap_policy: which submodules get their own FSDP unit (keys in ``WRAP_POLICY_KEYS``).
        wrap_policy.min_num_params: FSDP1's size-based wrapping threshold; accepted for veRL compatibility, not used
            (FSDP2 shards each decoder layer).
        wrap_policy.layer_class: class name(s) of the blocks to shard; another name for
            ``wrap_policy.transformer_layer_cls_to_wrap``.
        param_offload: keep parameter shards in host memory between uses (accelerators only; on CPU they are there
            already, so it is a no-op).
        optimizer_offload: the same for the optimizer state.
        offload_policy: use FSDP2's ``CPUOffloadPolicy`` (the optimizer steps on the host). Needs an accelerator.
        reshard_after_forward: free the gathered parameters of each block after its forward (ZeRO-3); false keeps
            them until backward (ZeRO-2-like, more memory, less communication).
        fsdp_size: ranks one parameter is sharded over; -1 means all ranks. A divisor of the world size gives hybrid
            sharding: shards within groups of ``fsdp_size`` ranks, replicated across groups.
        forward_prefetch: in forward, start gathering the next block's parameters during the current block.
        model_dtype: dtype the weights are loaded and stored in (and the optimizer steps in).
        dtype: compute dtype of the mixed-precision policy (``param_dtype``); gradients are reduced in float32. Equal
            to ``model_dtype``: no mixed precision.
        mixed_precision: optional override of the policy: ``param_dtype``, ``reduce_dtype``, ``buffer_dtype``
            (ignored by FSDP2), ``cast_forward_inputs``.
        use_orig_params: FSDP1 flag, accepted for veRL compatibility; FSDP2 always keeps the original parameters.
        seed: seeds the randomly initialized parts of a model (a value head loaded from a causal LM).
        full_determinism: make torch use deterministic kernels (slow; for debugging).
        ulysses_sequence_parallel_size: Ulysses sequence-parallel degree of the model (1: off).
        entropy_from_logits_with_chunking: compute the entropy over chunks of the logits, to save memory.
        use_torch_compile: compile the log-prob and entropy helpers with ``torch.compile``.
        entropy_checkpointing: recompute the entropy in backward instead of keeping its activations.
        forward_only: build no optimizer (reference policy, reward model).
        plain_single_rank: with one rank (world size 1), keep the model a plain module instead of wrapping it in
            FSDP2, which would only copy (gather into unsharded parameters, concatenate gradients before a no-op
            reduce-scatter): same results in the model dtype, less time and memory. Mixed precision (``dtype`` ≠
            ``model_dtype``) then runs under ``torch.autocast``. False: FSDP2 on one rank too.
        strategy: "fsdp" or "fsdp2"; both select the FSDP2 engine.
    """

    wrap_policy: dict[str, Any] = field(default_factory=lambda: {"min_num_params": 0})
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False
    reshard_after_forward: bool = True
    fsdp_size: int = -1
    forward_prefetch: bool = False
    model_dtype: str = "fp32"
    dtype: str = "bfloat16"
    mixed_precision: dict[str, Any] | None = None
    use_orig_params: bool = False
    seed: int = 42
    full_determinism: bool = False
    ulysses_sequence_parallel_size: int = 1
    entropy_from_logits_with_chunking: bool = False
    use_torch_compile: bool = True
    entropy_checkpointing: bool = False
    forward_only: bool = False
    plain_single_rank: bool = True
    strategy: str = "fsdp"

    def __post_init__(self) -> None:
        p = "fsdp_config"
        problems = []
        if self.strategy not in FSDP_STRATEGIES:
            problems.append(f"{p}.strategy={self.strategy!r}; use one of {list(FSDP_STRATEGIES)}")
        for name in ("model_dtype", "dtype"):
            if getattr(self, name) not in DTYPE_NAMES:
                problems.append(f"{p}.{name}={getattr(self, name)!r}; use one of {list(DTYPE_NAMES)}")
        for name in (
            "param_offload",
            "optimizer_offload",
            "offload_policy",
            "reshard_after_forward",
            "forward_prefetch",
            "use_orig_params",
            "full_determinism",
            "entropy_from_logits_with_chunking",
            "use_torch_compile",
            "entropy_checkpointing",
            "forward_only",
            "plain_single_rank",
        ):
            if not isinstance(getattr(self, name), bool):
                problems.append(f"{p}.{name}={getattr(self, name)!r} must be true or false")
        if not _is_int(self.fsdp_size) or (self.fsdp_size != -1 and self.fsdp_size < 1):
            problems.append(f"{p}.fsdp_size={self.fsdp_size!r} must be -1 (all ranks) or an integer >= 1")
        if not _is_int(self.seed):
            problems.append(f"{p}.seed={self.seed!r} must be an integer")
        if not _is_int(self.ulysses_sequence_parallel_size) or self.ulysses_sequence_parallel_size < 1:
            problems.append(
                f"{p}.ulysses_sequence_parallel_size={self.ulysses_sequence_parallel_size!r} must be an integer >= 1"
            )
        problems += _wrap_policy_problems(p, self.wrap_policy)
        problems += _mixed_precision_problems(p, self.mixed_precision)
        if problems:
            raise ValueError("invalid FSDP engine config: " + "; ".join(problems))


def _class_names(value: Any) -> set[str]:
    return {value} if isinstance(value, str) else set(value) if isinstance(value, list | tuple) else set()


def _wrap_policy_problems(p: str, policy: Any) -> list[str]:
    if not isinstance(policy, Mapping):
        return [f"{p}.wrap_policy={policy!r} must be a mapping with keys from {list(WRAP_POLICY_KEYS)}"]
    problems = []
    unknown = sorted(str(k) for k in policy if k not in WRAP_POLICY_KEYS)
    if unknown:
        problems.append(f"{p}.wrap_policy has unknown key(s) {unknown}; allowed: {list(WRAP_POLICY_KEYS)}")
    min_params = policy.get("min_num_params", 0)
    if not _is_int(min_params) or min_params < 0:
        problems.append(f"{p}.wrap_policy.min_num_params={min_params!r} must be an integer >= 0")
    for key in ("transformer_layer_cls_to_wrap", "layer_class"):
        classes = policy.get(key)
        if classes is not None and not (
            isinstance(classes, str) or (isinstance(classes, list | tuple) and all(isinstance(c, str) for c in classes))
        ):
            problems.append(f"{p}.wrap_policy.{key}={classes!r} must be a class name or a list of them")
    named = [policy.get(k) for k in ("transformer_layer_cls_to_wrap", "layer_class")]
    if all(v is not None for v in named) and _class_names(named[0]) != _class_names(named[1]):
        problems.append(
            f"{p}.wrap_policy.layer_class={named[1]!r} disagrees with "
            f"{p}.wrap_policy.transformer_layer_cls_to_wrap={named[0]!r}; set one of them"
        )
    if not isinstance(policy.get("disable", False), bool):
        problems.append(f"{p}.wrap_policy.disable={policy['disable']!r} must be true or false")
    return problems


def _mixed_precision_problems(p: str, mp: Any) -> list[str]:
    if mp is None:
        return []
    if not isinstance(mp, Mapping):
        return [f"{p}.mixed_precision={mp!r} must be a mapping with keys from {list(MIXED_PRECISION_KEYS)} or null"]
    problems = []
    unknown = sorted(str(k) for k in mp if k not in MIXED_PRECISION_KEYS)
    if unknown:
        problems.append(f"{p}.mixed_precision has unknown key(s) {unknown}; allowed: {list(MIXED_PRECISION_KEYS)}")
    for key in ("param_dtype", "reduce_dtype", "buffer_dtype"):
        if key in mp and mp[key] not in DTYPE_NAMES:
            problems.append(f"{p}.mixed_precision.{key}={mp[key]!r}; use one of {list(DTYPE_NAMES)}")
    if not isinstance(mp.get("cast_forward_inputs", True), bool):
        problems.append(f"{p}.mixed_precision.cast_forward_inputs={mp['cast_forward_inputs']!r} must be true or false")
    return problems


# Dtypes Megatron trains in (float32: CPU runs and exact tests).
MCORE_DTYPES = ("bfloat16", "float16", "float32")


@dataclass
class McoreEngineConfig(BaseConfig):
    """How a model is split and trained by a Megatron-Core engine (veRL's ``megatron`` config block).

    Args:
        param_offload / grad_offload / optimizer_offload: keep parameters / gradients / optimizer state in host
            memory between uses.
        tensor_model_parallel_size: tensor-parallel degree.
        expert_model_parallel_size: expert-parallel degree (MoE).
        expert_tensor_parallel_size: tensor-parallel degree inside experts (None: as ``tensor_model_parallel_size``).
        pipeline_model_parallel_size: pipeline stages.
        virtual_pipeline_model_parallel_size: model chunks per stage for the interleaved schedule (None: off).
        context_parallel_size: context-parallel degree (long sequences).
        sequence_parallel: sequence parallelism within tensor-parallel groups; turned off when
            ``tensor_model_parallel_size`` is 1 (the one field that is corrected after construction).
        use_distributed_optimizer: shard the optimizer state over data-parallel ranks.
        use_dist_checkpointing / dist_checkpointing_path / dist_checkpointing_prefix: load a Megatron distributed
            checkpoint instead of a HF one.
        seed: the random seed.
        override_ddp_config / override_transformer_config / override_mcore_model_config: keyword overrides of
            Megatron's DDP, transformer and model configs.
        use_mbridge / vanilla_mbridge: convert HF weights with mbridge.
        dtype: training dtype (``bfloat16`` or ``float16``).
        forward_only: build no optimizer (reference policy).
        full_determinism: deterministic kernels (slow; debugging).
        strategy: always ``"megatron"``.
    """

    _mutable_fields: ClassVar[frozenset[str]] = frozenset({"sequence_parallel"})

    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    tensor_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int | None = None
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    sequence_parallel: bool = True
    use_distributed_optimizer: bool = True
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: str | None = None
    dist_checkpointing_prefix: str = ""
    seed: int = 42
    override_ddp_config: dict[str, Any] = field(default_factory=dict)
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    override_mcore_model_config: dict[str, Any] = field(default_factory=dict)
    use_mbridge: bool = True
    vanilla_mbridge: bool = True
    dtype: str = "bfloat16"
    forward_only: bool = False
    full_determinism: bool = False
    strategy: str = "megatron"

    def __post_init__(self) -> None:
        p = "megatron"
        problems = []
        if self.strategy != "megatron":
            problems.append(f"{p}.strategy={self.strategy!r} must be 'megatron'")
        if self.dtype not in MCORE_DTYPES:
            problems.append(f"{p}.dtype={self.dtype!r}; use one of {list(MCORE_DTYPES)}")
        for name in (
            "tensor_model_parallel_size",
            "expert_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                problems.append(f"{p}.{name}={value!r} must be an integer >= 1")
        for name in ("expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                problems.append(f"{p}.{name}={value!r} must be null or an integer >= 1")
        if not _is_int(self.seed):
            problems.append(f"{p}.seed={self.seed!r} must be an integer")
        for name in ("override_ddp_config", "override_transformer_config", "override_mcore_model_config"):
            if not isinstance(getattr(self, name), dict):
                problems.append(f"{p}.{name}={getattr(self, name)!r} must be a mapping")
        if problems:
            raise ValueError("invalid Megatron engine config: " + "; ".join(problems))
        if self.tensor_model_parallel_size == 1 and self.sequence_parallel:
            logger.debug("%s.sequence_parallel set to false: tensor_model_parallel_size is 1", p)
            self.sequence_parallel = False
