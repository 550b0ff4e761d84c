"""Keys the trainer accepts (so veRL command lines keep working) but does not act on, and what happens when one is set.

Every entry of `UNREAD` is a key or a mapping of keys (then: each leaf under it) of the composed ``ppo_trainer``. A
value away from the YAML's default is reported at start-up by `report_unread`: ``"warn"`` logs a warning naming the key,
the value and why it has no effect (running without it is harmless: a speed, memory or infrastructure knob);
``"error"`` adds a problem to the validation's list (ignoring it would give another result than the one asked for).
A key inside a mapping entry is judged by the most specific entry that covers it.

"Away from the default" compares the value as written first (a key still following its default's interpolation,
such as ``reward_model.model.use_fused_kernels: ${actor_rollout_ref.model.use_fused_kernels}``, is at its default),
then the resolved values; for a mapping that defaults to ``{}`` any non-empty value is away.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

from omegaconf import DictConfig, ListConfig, OmegaConf

__all__ = [
    "NAME_USED_ELSEWHERE",
    "UNREAD",
    "Unread",
    "covering",
    "is_away",
    "leaves_of",
    "report_unread",
    "set_away",
]

logger = logging.getLogger(__name__)


class Unread(NamedTuple):
    """One key (or mapping of keys) that nothing acts on.

    Args:
        key: the dotted key or mapping prefix.
        consequence: ``"warn"`` (harmless: logged) or ``"error"`` (a validation problem).
        why: what happens instead, shown in the message and in docs/config_reference.md.
        harmless: values treated like the default (e.g. ``None`` where null asks for what verl does anyway).
        engine: only reported when ``actor_rollout_ref.rollout.name`` is this engine (a key another engine reads).
    """

    key: str
    consequence: str
    why: str
    harmless: tuple[Any, ...] = ()
    engine: str | None = None


_SP = "sequence parallelism is not implemented"
_COMPILE = "torch.compile is not used"
_MULTIMODAL = "multimodal inputs are not supported: prompts are read as text only"
_LOAD = "resuming always loads the model, optimizer and extra state"
_HF_ONLY = "the hf engine does not use it (only the vllm engine reads it)"
_ROLLOUT = "actor_rollout_ref.rollout"


def _fsdp(prefix: str) -> tuple[Unread, ...]:
    """The FSDP1-era keys of one ``fsdp_config`` that the FSDP2 engine does not read."""
    return (
        Unread(f"{prefix}.wrap_policy.min_num_params", "warn", "FSDP2 shards each transformer block"),
        Unread(f"{prefix}.use_orig_params", "warn", "FSDP2 always keeps the original parameters"),
        Unread(f"{prefix}.ulysses_sequence_parallel_size", "error", _SP),
        Unread(f"{prefix}.use_torch_compile", "warn", _COMPILE),
        Unread(f"{prefix}.entropy_checkpointing", "warn", "the entropy is not recomputed in the backward"),
        Unread(f"{prefix}.entropy_from_logits_with_chunking", "warn", "the entropy is computed in one pass"),
    )


_MBRIDGE = "HF weights are converted by verl.models.mcore (the Qwen2 / Llama families), never by mbridge"


def _megatron(prefix: str) -> tuple[Unread, ...]:
    """The keys of one Megatron engine block (``model_engine=megatron``) that the Megatron engine does not read."""
    return (
        Unread(f"{prefix}.use_mbridge", "warn", _MBRIDGE),
        Unread(f"{prefix}.vanilla_mbridge", "warn", _MBRIDGE),
        Unread(f"{prefix}.dist_checkpointing_path", "warn", "models load from their HF folder"),
        Unread(f"{prefix}.dist_checkpointing_prefix", "warn", "models load from their HF folder"),
    )


# roles whose workers profile with their own ``profiler`` (enable / all_ranks / ranks / save_path are acted on)
_ROLE_PROFILERS = ("actor_rollout_ref.actor", "critic", "reward_model")

UNREAD: tuple[Unread, ...] = (
    # data
    Unread(
        "data.tokenizer", "warn", "the policy's tokenizer (actor_rollout_ref.model.tokenizer_path or .path) is used"
    ),
    Unread("data.use_shm", "warn", "the data files are read in place (no shared-memory copy)"),
    Unread("data.return_raw_input_ids", "warn", "items carry no raw_input_ids"),
    Unread("data.image_patch_size", "warn", _MULTIMODAL),
    Unread("data.validation_shuffle", "warn", "the validation set is read in order"),
    Unread("data.filter_overlong_prompts_workers", "warn", "overlong prompts are filtered in one process"),
    Unread("data.image_key", "warn", _MULTIMODAL),
    Unread("data.video_key", "warn", _MULTIMODAL),
    Unread("data.trust_remote_code", "warn", "no data processor is loaded (text-only data)"),
    Unread("data.return_multi_modal_inputs", "warn", _MULTIMODAL),
    # actor_rollout_ref
    Unread("actor_rollout_ref.nccl_timeout", "warn", "the collectives use torch's default timeout"),
    Unread("actor_rollout_ref.model.hf_config_path", "error", "the model's config is read from model.path"),
    Unread("actor_rollout_ref.model.enable_activation_offload", "warn", "activation offload is not implemented"),
    Unread("actor_rollout_ref.model.use_liger", "warn", "Liger kernels are not used"),
    Unread("actor_rollout_ref.model.use_fused_kernels", "warn", "fused kernels are not used"),
    Unread("actor_rollout_ref.model.fused_kernel_options", "warn", "fused kernels are not used"),
    Unread("actor_rollout_ref.model.tiled_mlp", "warn", "tiled MLP (a memory saving) is not implemented"),
    Unread("actor_rollout_ref.model.mtp", "error", "multi-token prediction (MTP) is not implemented"),
    Unread("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "error", _SP),
    Unread("actor_rollout_ref.actor.use_torch_compile", "warn", _COMPILE),
    Unread("actor_rollout_ref.actor.use_fused_kernels", "warn", "fused kernels are not used"),
    Unread("actor_rollout_ref.actor.use_prefix_grouper", "warn", "shared prompt prefixes are not grouped"),
    Unread(
        "actor_rollout_ref.actor.freeze_vision_tower", "error", "vision towers are not frozen (no multimodal models)"
    ),
    Unread("actor_rollout_ref.actor.checkpoint.load_contents", "error", _LOAD),
    Unread("actor_rollout_ref.actor.checkpoint.async_save", "warn", "checkpoints are saved synchronously"),
    Unread("actor_rollout_ref.actor.optim.clip_grad", "warn", "the actor clips with actor_rollout_ref.actor.grad_clip"),
    *_fsdp("actor_rollout_ref.actor.fsdp_config"),
    Unread("actor_rollout_ref.actor.router_replay", "error", "MoE router replay is not implemented"),
    Unread("actor_rollout_ref.actor.entropy_from_logits_with_chunking", "warn", "the entropy is computed in one pass"),
    Unread("actor_rollout_ref.actor.entropy_checkpointing", "warn", "the entropy is not recomputed in the backward"),
    Unread("actor_rollout_ref.ref.entropy_from_logits_with_chunking", "warn", "the entropy is computed in one pass"),
    Unread("actor_rollout_ref.ref.entropy_checkpointing", "warn", "the entropy is not recomputed in the backward"),
    Unread(
        "actor_rollout_ref.ref.model",
        "error",
        "the reference policy is always the policy's initial model (actor_rollout_ref.model)",
    ),
    Unread("actor_rollout_ref.ref.ulysses_sequence_parallel_size", "error", _SP),
    Unread("actor_rollout_ref.ref.use_torch_compile", "warn", _COMPILE),
    *_fsdp("actor_rollout_ref.ref.fsdp_config"),
    *(
        block
        for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
        for block in _megatron(f"{role}.megatron")
    ),
    # actor_rollout_ref.rollout
    *(
        Unread(f"{_ROLLOUT}.{name}", "warn", _HF_ONLY, engine="hf")
        for name in (
            "gpu_memory_utilization",
            "enforce_eager",
            "max_num_batched_tokens",
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "load_format",
            "skip_tokenizer_init",
        )
    ),
    Unread(f"{_ROLLOUT}.cudagraph_capture_sizes", "warn", "the engines use their default CUDA-graph sizes"),
    Unread(f"{_ROLLOUT}.expert_parallel_size", "warn", "the rollout engines run without expert parallelism"),
    Unread(f"{_ROLLOUT}.pipeline_model_parallel_size", "warn", "the rollout engines run without pipeline parallelism"),
    Unread(f"{_ROLLOUT}.scheduling_policy", "warn", "requests are scheduled first come, first served"),
    Unread(f"{_ROLLOUT}.calculate_log_probs", "warn", "both engines always return rollout_log_probs"),
    Unread(
        f"{_ROLLOUT}.log_prob_micro_batch_size",
        "warn",
        "the deprecated global size is not used; set actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    ),
    Unread(f"{_ROLLOUT}.disable_log_stats", "warn", "the engines' statistics are not logged"),
    Unread(f"{_ROLLOUT}.multi_stage_wake_up", "warn", "the rollout wakes up in one stage"),
    Unread(
        f"{_ROLLOUT}.logprobs_mode",
        "warn",
        "SGLang returns the log-probs of the temperature-scaled distribution (processed_logprobs)",
        engine="sglang",
    ),
    Unread(
        f"{_ROLLOUT}.over_sample_rate",
        "error",
        "over-sampling (aborting the slowest requests) is not implemented: every response is generated in full",
    ),
    Unread(f"{_ROLLOUT}.enable_rollout_routing_replay", "error", "MoE routing replay is not implemented"),
    Unread(f"{_ROLLOUT}.quantization", "warn", "the rollout runs unquantized, in rollout.dtype"),
    Unread(f"{_ROLLOUT}.quantization_config_file", "warn", "the rollout runs unquantized, in rollout.dtype"),
    Unread(
        f"{_ROLLOUT}.layered_summon",
        "warn",
        "the weights are always gathered bucket by bucket (checkpoint_engine.update_weights_bucket_megabytes), never "
        "the whole model at once; with LoRA only the first push sends the base weights",
    ),
    Unread(
        f"{_ROLLOUT}.multi_turn.use_inference_chat_template",
        "warn",
        "the tokenizer's chat template renders every turn (no separate inference template)",
    ),
    Unread(
        f"{_ROLLOUT}.multi_turn.tokenization_sanity_check_mode",
        "warn",
        "the agent loops keep the generated token ids as they are; nothing is re-tokenized, so there is nothing "
        "to check",
    ),
    Unread(
        f"{_ROLLOUT}.multi_turn.num_repeat_rollouts",
        "error",
        "multi-turn rollouts are repeated by actor_rollout_ref.rollout.n, like every rollout",
    ),
    Unread(f"{_ROLLOUT}.agent.custom_async_server", "error", "custom rollout server classes are not supported"),
    Unread(f"{_ROLLOUT}.prometheus", "warn", "no Prometheus metrics are exported"),
    Unread(f"{_ROLLOUT}.mtp", "warn", "speculative decoding with MTP is not implemented"),
    # critic
    Unread("critic.optim.clip_grad", "warn", "the critic clips with critic.grad_clip"),
    Unread("critic.model.enable_activation_offload", "warn", "activation offload is not implemented"),
    *_fsdp("critic.model.fsdp_config"),
    *_fsdp("critic.fsdp"),
    Unread("critic.ulysses_sequence_parallel_size", "error", _SP),
    Unread("critic.checkpoint.load_contents", "error", _LOAD),
    Unread("critic.checkpoint.async_save", "warn", "checkpoints are saved synchronously"),
    # reward_model
    Unread("reward_model.strategy", "warn", "the reward model runs on the FSDP2 engine"),
    Unread(
        "reward_model.model.input_tokenizer",
        "error",
        "the reward model scores the policy's token ids as they are (no switch to its own chat template), so it "
        "must share the policy's tokenizer; null is accepted",
        harmless=(None,),
    ),
    Unread("reward_model.model.override_config", "error", "the reward model is built from its own HF config"),
    Unread("reward_model.model.use_remove_padding", "warn", "the reward model forwards padded batches"),
    Unread("reward_model.model.use_fused_kernels", "warn", "fused kernels are not used"),
    Unread(
        "reward_model.micro_batch_size",
        "warn",
        "the deprecated global size is not used; set reward_model.micro_batch_size_per_gpu",
    ),
    Unread("reward_model.max_length", "warn", "the reward model's inputs are not truncated"),
    Unread("reward_model.use_dynamic_bsz", "warn", "reward-model micro-batches follow micro_batch_size_per_gpu"),
    Unread(
        "reward_model.forward_max_token_len_per_gpu",
        "warn",
        "reward-model micro-batches follow micro_batch_size_per_gpu",
    ),
    Unread("reward_model.use_reward_loop", "warn", "rewards are computed by the reward manager (reward.*)"),
    Unread("reward_model.ulysses_sequence_parallel_size", "error", _SP),
    Unread("reward_model.launch_reward_fn_async", "warn", "rewards are computed in the driver's worker pool"),
    Unread("reward.sandbox_fusion", "warn", "no built-in scorer runs code (no SandboxFusion client)"),
    # trainer and the rest
    Unread("trainer.profile_steps", "warn", "use global_profiler.steps with global_profiler.tool=torch"),
    Unread("trainer.esi_redundant_time", "warn", "ESI expiry handling is not implemented"),
    Unread("trainer.del_local_ckpt_after_load", "warn", "checkpoints are kept after loading (no remote copy)"),
    Unread("trainer.ray_wait_register_center_timeout", "warn", "the workers start without a register center"),
    Unread("trainer.use_legacy_worker_impl", "warn", "there is one worker implementation"),
    *(
        Unread(f"{role}.profiler.{key}", "warn", why)
        for role in _ROLE_PROFILERS
        for key, why in (
            ("tool", "a role records with global_profiler.tool (only torch is available)"),
            ("tool_config.nsys", "only the torch profiler is available (global_profiler.tool=torch)"),
            ("tool_config.npu", "only the torch profiler is available (global_profiler.tool=torch)"),
            ("tool_config.torch_memory", "only the torch profiler is available (global_profiler.tool=torch)"),
            ("tool_config.torch", "the torch profiler records each profiled step whole"),
        )
    ),
    *(
        Unread(
            f"actor_rollout_ref.{role}.profiler",
            "warn",
            f"the {role} runs in the actor's workers, which are profiled with actor_rollout_ref.actor.profiler",
        )
        for role in ("ref", "rollout")
    ),
    Unread(
        "global_profiler.global_tool_config",
        "warn",
        "only the torch profiler is available (global_profiler.tool=torch); the nsys and torch_memory options are "
        "not used",
    ),
    Unread(
        "transfer_queue",
        "warn",
        "there is no transfer queue here: batches move between the trainer and the worker groups as DataProto",
    ),
    # veRL 0.10's V1 trainer settings that do nothing here (the mode, the prefetch depth, the staleness bound,
    # parameter_sync_step and the hybrid switch are read: verl.trainer.config.validate_v1)
    Unread("trainer.v1.sync", "warn", "trainer.v1.trainer_mode=sync takes no settings"),
    Unread(
        "skip",
        "error",
        "veRL 0.10's rollout caching is not built (actor_rollout_ref.rollout.skip_rollout reuses one saved generation)",
    ),
    Unread("ray_kwargs.timeline_json_file", "warn", "no Ray timeline is written"),
)

# Entries whose last name is used in verl/ for other things (or read by another engine), so a test cannot check by
# name that nothing reads them; the test checks instead that each of these names is indeed used elsewhere.
NAME_USED_ELSEWHERE: frozenset[str] = frozenset(
    {
        # the role profilers' names (profiler, tool, nsys, npu, torch, torch_memory) are the profiler module's own
        *(
            f"{role}.profiler.{key}"
            for role in _ROLE_PROFILERS
            for key in ("tool", "tool_config.nsys", "tool_config.npu", "tool_config.torch_memory", "tool_config.torch")
        ),
        "actor_rollout_ref.ref.profiler",
        "actor_rollout_ref.rollout.profiler",
        "data.tokenizer",
        "data.trust_remote_code",
        "data.use_shm",  # use_shm is the model sections' key (a shared-memory copy of the model folder)
        # load_contents is read only by FSDPCheckpointManager for a recipe's own model (per-rank files); the
        # trainer's engine-built workers still load model, optimizer and extra state together
        "actor_rollout_ref.actor.checkpoint.load_contents",
        "critic.checkpoint.load_contents",
        "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking",
        "actor_rollout_ref.ref.entropy_from_logits_with_chunking",
        "actor_rollout_ref.ref.model",
        "actor_rollout_ref.ref.fsdp_config.entropy_from_logits_with_chunking",
        "critic.model.fsdp_config.entropy_from_logits_with_chunking",
        "critic.fsdp.entropy_from_logits_with_chunking",
        "critic.fsdp.wrap_policy.min_num_params",
        "critic.fsdp.ulysses_sequence_parallel_size",
        "actor_rollout_ref.actor.optim.clip_grad",  # the engine's default max_norm; the workers pass grad_clip
        "critic.optim.clip_grad",
        f"{_ROLLOUT}.calculate_log_probs",
        # the Megatron engine's own megatron.pipeline_model_parallel_size; the rollout's pipeline size stays unread
        f"{_ROLLOUT}.pipeline_model_parallel_size",
        "reward_model.strategy",
        "reward_model.micro_batch_size",
        "reward_model.use_dynamic_bsz",
        "reward_model.forward_max_token_len_per_gpu",
        "reward_model.model.override_config",
        "reward_model.model.use_remove_padding",
        "reward_model.max_length",  # the SFT datasets read their own data.max_length
        # veRL's legacy worker API (verl.workers.fsdp_legacy, verl.utils.ulysses, fsdp_utils, sandbox tools) takes
        # these names as arguments from recipes' own code and refuses or honours them there; the config keys stay
        # unread by the trainer's workers
        "actor_rollout_ref.model.enable_activation_offload",
        "actor_rollout_ref.model.use_liger",
        "actor_rollout_ref.model.use_fused_kernels",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        "actor_rollout_ref.actor.use_fused_kernels",
        "actor_rollout_ref.actor.use_prefix_grouper",
        "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params",
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
        "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params",
        "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size",
        "critic.model.enable_activation_offload",
        "critic.model.fsdp_config.wrap_policy.min_num_params",
        "critic.model.fsdp_config.ulysses_sequence_parallel_size",
        "critic.ulysses_sequence_parallel_size",
        "reward_model.model.use_fused_kernels",
        "reward_model.ulysses_sequence_parallel_size",
        "reward.sandbox_fusion",
        # veRL 0.10's names that are this project's words for other things (the modes, the sampler of data.*)
        "trainer.v1.sync",
        "skip",
    }
)

_BY_KEY: dict[str, Unread] = {entry.key: entry for entry in UNREAD}


def leaves_of(entry: Unread, base: DictConfig) -> list[str]:
    """The leaf keys of ``base`` (the YAML) that ``entry`` judges: its key, or the leaves under its mapping that no
    more specific entry covers."""
    return [leaf for leaf in _leaves(_node(base, entry.key), entry.key) if covering(leaf) is entry]


def covering(key: str) -> Unread | None:
    """The most specific entry of `UNREAD` that is ``key`` or a mapping above it, if any."""
    parts = key.split(".")
    for i in range(len(parts), 0, -1):
        entry = _BY_KEY.get(".".join(parts[:i]))
        if entry is not None:
            return entry
    return None


def _leaves(node: Any, prefix: str) -> Iterator[str]:
    """The dotted leaf keys of a schema node (a non-empty mapping is walked; anything else is a leaf)."""
    if isinstance(node, DictConfig) and not node._is_none() and len(node) > 0:
        for key in node:
            if key != "_target_":  # a dataclass pointer, not a setting
                yield from _leaves(node._get_node(key), f"{prefix}.{key}")
    else:
        yield prefix


_MISSING = object()


def _node(config: DictConfig, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, DictConfig) or node._is_none() or part not in node:
            return None
        node = node._get_node(part)
    return node


def _raw(node: Any) -> Any:
    """A node's value as written (interpolations unresolved); `_MISSING` for an absent node."""
    if node is None:
        return _MISSING
    if isinstance(node, DictConfig | ListConfig):
        if node._is_none():
            return None
        if node._is_interpolation():
            return node._value()
        return OmegaConf.to_container(node, resolve=False)
    return node._value()


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig | ListConfig) else value


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def is_away(config: DictConfig, base: DictConfig, key: str) -> bool:
    """Whether ``config`` (composed, unresolved) sets ``key`` away from its default in ``base``: the value as written
    differs and (for a default written as an interpolation) so does the value it resolves to; an absent key is at
    its default, and so is an absent default's null."""
    raw_value, raw_default = _raw(_node(config, key)), _raw(_node(base, key))
    if raw_value is _MISSING or raw_value == raw_default:
        return False
    value = _plain(OmegaConf.select(config, key, default=None))
    if raw_default is _MISSING:
        return value is not None
    if _is_interpolation(raw_default):
        follow = copy.deepcopy(config)
        OmegaConf.update(follow, key, raw_default, merge=False)
        return value != _plain(OmegaConf.select(follow, key, default=None))
    return value != raw_default


def set_away(config: DictConfig, base: DictConfig) -> Iterator[tuple[Unread, str, Any, Any]]:
    """``(entry, leaf key, value, default as written)`` for every leaf of an `UNREAD` entry that ``config`` (a
    composed, unresolved trainer config) sets away from the default in ``base`` (the YAML)."""
    engine = OmegaConf.select(config, f"{_ROLLOUT}.name", default=None)
    for entry in UNREAD:
        if entry.engine is not None and entry.engine != engine:
            continue
        for leaf in leaves_of(entry, base):
            raw_value, raw_default = _raw(_node(config, leaf)), _raw(_node(base, leaf))
            if raw_value is _MISSING or raw_value == raw_default:
                continue
            value = _plain(OmegaConf.select(config, leaf, default=None))
            default = raw_default
            if _is_interpolation(raw_default):  # what the default would resolve to in this config
                follow = copy.deepcopy(config)
                OmegaConf.update(follow, leaf, raw_default, merge=False)
                default = _plain(OmegaConf.select(follow, leaf, default=None))
            elif raw_default is _MISSING:
                raw_default = default = None
            if value == default or any(value == h and type(value) is type(h) for h in entry.harmless):
                continue
            yield entry, leaf, value, raw_default


def _render(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value) if isinstance(value, str) else repr(value)


def report_unread(config: DictConfig, problems: list[str], base: DictConfig) -> None:
    """Log a warning for every ``"warn"`` entry that ``config`` sets away from ``base``'s default, and append a
    problem (naming the key, the value, why and the fix) for every ``"error"`` one."""
    for entry, key, value, default in set_away(config, base):
        if entry.consequence == "error":
            problems.append(f"{key}={value!r}: {entry.why}; leave it at {_render(default)}")
        else:
            logger.warning("%s=%r has no effect here: %s", key, value, entry.why)
