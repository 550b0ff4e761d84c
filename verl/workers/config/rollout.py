"""Schema of ``actor_rollout_ref.rollout.*``: the rollout engine, its sampling parameters and its sub-groups.

Field names and defaults follow veRL's ``RolloutConfig``. Differences: ``name`` defaults to ``"hf"`` (our torch
engine, which runs everywhere) instead of being required; ``mode`` accepts ``"sync"`` as well as ``"async"`` (our
in-process engines serve both); ``prompt_length`` / ``response_length`` are plain ints (a trainer YAML interpolates
them from ``data.max_prompt_length`` / ``data.max_response_length``); and ``seed`` is ours: every sample's random
stream is derived from (seed, step, prompt index, sample index).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig
from verl.utils.torch_dtypes import DTYPE_NAMES
from verl.workers.config.profiler import RoleProfilerConfig

__all__ = [
    "ROLLOUT_DTYPES",
    "ROLLOUT_MODES",
    "ROLLOUT_NAMES",
    "AgentLoopConfig",
    "CheckpointEngineConfig",
    "CustomAsyncServerConfig",
    "MultiTurnConfig",
    "PrometheusConfig",
    "RolloutConfig",
    "SamplingConfig",
    "TraceConfig",
]

# Engines a config may name (see verl.workers.rollout.get_rollout_class for how each is loaded).
ROLLOUT_NAMES = ("hf", "vllm", "sglang")
ROLLOUT_MODES = ("sync", "async")
# Accepted spellings of the engine dtype: the one table of `verl.utils.torch_dtypes`.
ROLLOUT_DTYPES = tuple(DTYPE_NAMES)
_TRUNCATE_SIDES = ("left", "right", "middle")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_int(key: str, value: object, low: int | None = None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not _is_int(value) or (low is not None and value < low):
        bound = "" if low is None else f" >= {low}"
        raise ValueError(f"{key}={value!r} must be an integer{bound}{' or null' if optional else ''}")


def _check_bool(key: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{key}={value!r} must be true or false")


def _check_sampling(prefix: str, temperature: object, top_p: object, top_k: object, n: object) -> None:
    """The checks shared by the rollout's own sampling fields and ``val_kwargs``."""
    if not _is_number(temperature) or temperature < 0:
        raise ValueError(f"{prefix}temperature={temperature!r} must be a number >= 0 (0 means greedy)")
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise ValueError(f"{prefix}top_p={top_p!r} must be in (0, 1] (1 means off)")
    if not _is_int(top_k) or top_k < -1:
        raise ValueError(f"{prefix}top_k={top_k!r} must be -1 or an integer >= 0 (-1 and 0 mean off)")
    _check_int(f"{prefix}n", n, 1)


@dataclass
class SamplingConfig(BaseConfig):
    """``rollout.val_kwargs``: the sampling parameters used for validation (``meta_info["validate"]``).

    Args:
        top_k: keep the k most likely tokens; -1 or 0: off.
        top_p: nucleus sampling mass; 1: off.
        temperature: softmax temperature; 0 means greedy.
        n: responses per prompt.
        do_sample: sample (True) or decode greedily (False); sampling needs ``temperature`` > 0.
    """

    top_k: int = -1
    top_p: float = 1.0
    temperature: float = 0.0
    n: int = 1
    do_sample: bool = False

    def __post_init__(self) -> None:
        prefix = "rollout.val_kwargs."
        _check_sampling(prefix, self.temperature, self.top_p, self.top_k, self.n)
        _check_bool(f"{prefix}do_sample", self.do_sample)
        if self.do_sample and self.temperature <= 0:
            raise ValueError(
                f"{prefix}do_sample=True requires {prefix}temperature > 0 (got {self.temperature}); set a temperature "
                f"or do_sample=False for greedy validation"
            )


@dataclass
class MultiTurnConfig(BaseConfig):
    """``rollout.multi_turn``: limits of multi-turn (tool-calling) agent loops.

    Args:
        enable: run multi-turn rollouts: rows without an ``agent_name`` run ``tool_agent`` (unless
            ``agent.default_agent_loop`` names another loop than ``single_turn_agent``).
        max_assistant_turns: stop after this many assistant turns (None: no limit).
        tool_config_path: veRL's tool YAML (``verl.tools.utils.tool_registry``), loaded at start-up.
        function_tool_path: a Python file whose ``@function_tool`` functions are tools too (veRL 0.10).
        max_user_turns: stop after this many user turns (None: no limit).
        max_parallel_calls: tool calls executed per assistant turn (later calls of the turn are dropped, counted).
        max_tool_response_length: tool responses longer than this many characters are cut (veRL's rule).
        tool_response_truncate_side: where a long tool response is cut: "left", "right" or "middle".
        interaction_config_path: veRL's interaction YAML (simulated users), loaded at start-up.
        use_inference_chat_template: apply the model's inference chat template instead of the training one.
        tokenization_sanity_check_mode: how to check that incremental tokenization matches a full one.
        format: tool-call format of the parser ("hermes").
        num_repeat_rollouts: repeat each multi-turn rollout this many times (None: once).
    """

    enable: bool = False
    max_assistant_turns: int | None = None
    tool_config_path: str | None = None
    function_tool_path: str | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    interaction_config_path: str | None = None
    use_inference_chat_template: bool = False
    tokenization_sanity_check_mode: str = "strict"
    format: str = "hermes"
    num_repeat_rollouts: int | None = None

    def __post_init__(self) -> None:
        prefix = "rollout.multi_turn."
        _check_bool(f"{prefix}enable", self.enable)
        _check_int(f"{prefix}max_assistant_turns", self.max_assistant_turns, 1, optional=True)
        _check_int(f"{prefix}max_user_turns", self.max_user_turns, 1, optional=True)
        _check_int(f"{prefix}max_parallel_calls", self.max_parallel_calls, 1)
        _check_int(f"{prefix}max_tool_response_length", self.max_tool_response_length, 1)
        _check_int(f"{prefix}num_repeat_rollouts", self.num_repeat_rollouts, 1, optional=True)
        if self.tool_response_truncate_side not in _TRUNCATE_SIDES:
            raise ValueError(
                f"{prefix}tool_response_truncate_side={self.tool_response_truncate_side!r}; use one of "
                f"{list(_TRUNCATE_SIDES)}"
            )


@dataclass
class CustomAsyncServerConfig(BaseConfig):
    """``rollout.agent.custom_async_server``: a user-provided server class.

    Args:
        path: file defining the server class.
        name: name of the class in that file.
    """

    path: str | None = None
    name: str | None = None


@dataclass
class AgentLoopConfig(BaseConfig):
    """``rollout.agent``: the agent-loop workers that drive the rollout servers.

    Args:
        num_workers: agent-loop workers (Ray actors) the batch is split over; 0: the agent loops run in the
            trainer's process (None: veRL's 8 on a cluster with GPUs, one per node hosting rollout replicas on a
            multi-node cluster without, 0 on a one-node cluster without GPUs).
        default_agent_loop: agent loop of rows that name none (registered name).
        agent_loop_config_path: YAML of extra agent loops (``name`` + ``_target_``).
        custom_async_server: a user-provided server class.
        agent_loop_manager_class: dotted path of a custom agent-loop manager (None: ours).
    """

    num_workers: int | None = None
    default_agent_loop: str = "single_turn_agent"
    agent_loop_config_path: str | None = None
    custom_async_server: CustomAsyncServerConfig = field(default_factory=CustomAsyncServerConfig)
    agent_loop_manager_class: str | None = None

    def __post_init__(self) -> None:
        _check_int("rollout.agent.num_workers", self.num_workers, 0, optional=True)
        if not isinstance(self.default_agent_loop, str) or not self.default_agent_loop:
            raise ValueError(f"rollout.agent.default_agent_loop={self.default_agent_loop!r} must name an agent loop")


@dataclass
class CheckpointEngineConfig(BaseConfig):
    """``rollout.checkpoint_engine``: how weights travel from the trainer to the rollout engine.

    Args:
        backend: registered checkpoint-engine name ("naive": colocated, in-process; "shm": into an engine of another
            process of the node through shared memory — ``trainer.mode=colocate_async`` takes "naive" as "shm";
            "gloo" / "nccl": broadcast to rollout replicas in other processes or nodes over a process group of the
            push's own, the push of ``trainer.mode=separate_async``, which takes "naive" as "gloo").
        update_weights_bucket_megabytes: weights are sent in buckets of this size.
        engine_kwargs: backend-specific options.
    """

    backend: str = "naive"
    update_weights_bucket_megabytes: int = 2048
    engine_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        prefix = "rollout.checkpoint_engine."
        if not isinstance(self.backend, str) or not self.backend:
            raise ValueError(f"{prefix}backend={self.backend!r} must name a checkpoint engine (e.g. 'naive')")
        _check_int(f"{prefix}update_weights_bucket_megabytes", self.update_weights_bucket_megabytes, 1)
        if not isinstance(self.engine_kwargs, dict):
            raise ValueError(f"{prefix}engine_kwargs must be a mapping, got {type(self.engine_kwargs).__name__}")


@dataclass
class TraceConfig(BaseConfig):
    """``rollout.trace``: rollout tracing (`verl.utils.rollout_trace`): each sample's agent loop, its generate calls
    and tool calls as one trace.

    Args:
        backend: "mlflow", "weave", "trackio" or "dummy" (attributes only); None: off.
        token2text: add the decoded prompt and response to the traced outputs.
        max_samples_per_step_per_worker: prompts traced per step and agent-loop worker, each with all its rollouts
            (None: all).
        project_name: project in the tracing backend (default: trainer.project_name).
        experiment_name: experiment in the tracing backend (default: trainer.experiment_name).
    """

    backend: str | None = None
    token2text: bool = False
    max_samples_per_step_per_worker: int | None = None
    project_name: str | None = None
    experiment_name: str | None = None


@dataclass
class PrometheusConfig(BaseConfig):
    """``rollout.prometheus``: export the rollout servers' metrics to Prometheus (off by default).

    Args:
        enable: export the metrics.
        port: port of the Prometheus server.
        file: Prometheus config file the servers are added to.
        served_model_name: model name in the exported metrics (None: the model path).
    """

    enable: bool = False
    port: int = 9090
    file: str = "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml"
    served_model_name: str | None = None


@dataclass
class RolloutConfig(BaseConfig):
    """``actor_rollout_ref.rollout``: which engine generates, how it samples, and how much memory it may use.

    Args:
        name: engine: "hf" (our torch engine), "vllm" or "sglang".
        mode: "async" (veRL's default) or "sync"; our in-process engines serve both.
        n: responses per prompt (>1 for GRPO-style group baselines).
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus sampling mass; 1: off.
        top_k: keep the k most likely tokens; -1 or 0: off.
        do_sample: sample (True) or decode greedily (False).
        ignore_eos: keep generating after EOS up to ``response_length``.
        prompt_length: maximal prompt length in tokens (``data.max_prompt_length``).
        response_length: responses are generated up to and right-padded to this length (``data.max_response_length``).
        dtype: engine weight dtype: "bfloat16" (veRL's default), "float16" or "float32".
        seed: ours: base seed of the per-sample random streams (with the step, prompt index and sample index).
        gpu_memory_utilization: fraction of device memory vLLM / SGLang may take.
        free_cache_engine: let the trainer put the engine to sleep between rollouts.
        enforce_eager: disable CUDA graphs (vLLM).
        cudagraph_capture_sizes: batch sizes vLLM captures CUDA graphs for.
        tensor_model_parallel_size: engine tensor-parallel size.
        data_parallel_size: engine data-parallel size.
        expert_parallel_size: engine expert-parallel size.
        pipeline_model_parallel_size: engine pipeline-parallel size.
        max_num_batched_tokens: tokens per engine step (vLLM / SGLang).
        max_model_len: engine context length (None: prompt_length + response_length).
        max_num_seqs: requests running at once in an engine (continuous batching; the rest wait for a slot).
        enable_chunked_prefill: vLLM chunked prefill (CUDA; always off on CPU, where vLLM cannot rewind a seeded
            request's generator after a partial prefill).
        enable_prefix_caching: vLLM / SGLang prefix caching (reset at every weight load).
        load_format: how the engine initializes its weights before the first sync ("dummy": random).
        logprobs_mode: which log-probs vLLM returns ("processed_logprobs": after temperature).
        scheduling_policy: vLLM request scheduling ("fcfs" or "priority").
        calculate_log_probs: ask the server engines for ``rollout_log_probs`` (the hf engine always returns them).
        log_prob_micro_batch_size: deprecated global micro-batch size of ``compute_log_prob``.
        log_prob_micro_batch_size_per_gpu: micro-batch size of ``compute_log_prob`` per device.
        log_prob_use_dynamic_bsz: pack ``compute_log_prob`` micro-batches by token count.
        log_prob_max_token_len_per_gpu: token budget per micro-batch with dynamic batch sizes.
        disable_log_stats: silence vLLM's periodic statistics.
        multi_stage_wake_up: SGLang: wake weights and KV cache in separate stages.
        over_sample_rate: fraction of extra requests the agent loop may abort once enough are done.
        nnodes: nodes of standalone rollout servers (veRL 0.10's ``trainer.v1.trainer_mode=separate_async`` pool;
            0: not given, the older top-level ``rollout.nnodes`` applies).
        n_gpus_per_node: devices per node of that pool.
        skip_rollout: reuse rollouts dumped in ``skip_dump_dir`` instead of generating (debugging).
        skip_dump_dir: where skipped rollouts are dumped / read.
        skip_tokenizer_init: do not build a tokenizer in the engine (token ids in and out).
        enable_rollout_routing_replay: record MoE routing for replay in training.
        quantization: engine weight quantization (None: off).
        quantization_config_file: its config file.
        layered_summon: gather FSDP weights layer by layer during the sync.
        engine_kwargs: engine-specific options, keyed by engine name (``vllm``, ``sglang``, ``hf``, ...).
        val_kwargs: sampling used for validation.
        multi_turn: multi-turn / tool-calling limits.
        agent: agent-loop workers.
        checkpoint_engine: weight sync from the trainer.
        trace: rollout tracing.
        prometheus: metrics export.
        profiler: per-role profiler options (None: off).
        mtp: multi-token-prediction options (None: off).
    """

    name: str = "hf"
    mode: str = "async"
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    ignore_eos: bool = False
    prompt_length: int = 512
    response_length: int = 512
    dtype: str = "bfloat16"
    seed: int = 0
    gpu_memory_utilization: float = 0.5
    free_cache_engine: bool = True
    enforce_eager: bool = False
    cudagraph_capture_sizes: list[int] | None = None
    tensor_model_parallel_size: int = 2
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    load_format: str = "dummy"
    logprobs_mode: str | None = "processed_logprobs"
    scheduling_policy: str | None = "fcfs"
    calculate_log_probs: bool = True
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool = False
    log_prob_max_token_len_per_gpu: int = 16384
    disable_log_stats: bool = True
    multi_stage_wake_up: bool = False
    over_sample_rate: float = 0.0
    nnodes: int = 0
    n_gpus_per_node: int = 8
    skip_rollout: bool = False
    skip_dump_dir: str = "/tmp/rollout_dump"
    skip_tokenizer_init: bool = True
    enable_rollout_routing_replay: bool = False
    quantization: str | None = None
    quantization_config_file: str | None = None
    layered_summon: bool = False
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    prometheus: PrometheusConfig = field(default_factory=PrometheusConfig)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    mtp: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        prefix = "rollout."
        if self.name not in ROLLOUT_NAMES:
            raise ValueError(f"{prefix}name={self.name!r} is not a rollout engine; use one of {list(ROLLOUT_NAMES)}")
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"{prefix}mode={self.mode!r}; use one of {list(ROLLOUT_MODES)}")
        _check_sampling(prefix, self.temperature, self.top_p, self.top_k, self.n)
        for name in (
            "do_sample",
            "ignore_eos",
            "free_cache_engine",
            "enforce_eager",
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "calculate_log_probs",
            "log_prob_use_dynamic_bsz",
            "disable_log_stats",
            "multi_stage_wake_up",
            "skip_rollout",
            "skip_tokenizer_init",
            "enable_rollout_routing_replay",
            "layered_summon",
        ):
            _check_bool(f"{prefix}{name}", getattr(self, name))
        _check_int(f"{prefix}prompt_length", self.prompt_length, 1)
        _check_int(f"{prefix}response_length", self.response_length, 1)
        if self.dtype not in ROLLOUT_DTYPES:
            raise ValueError(f"{prefix}dtype={self.dtype!r}; use one of {list(ROLLOUT_DTYPES)}")
        _check_int(f"{prefix}seed", self.seed)
        _check_int(f"{prefix}nnodes", self.nnodes, 0)
        _check_int(f"{prefix}n_gpus_per_node", self.n_gpus_per_node, 1)
        if not _is_number(self.gpu_memory_utilization) or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"{prefix}gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]")
        for name in (
            "tensor_model_parallel_size",
            "data_parallel_size",
            "expert_parallel_size",
            "pipeline_model_parallel_size",
            "max_num_batched_tokens",
            "max_num_seqs",
            "log_prob_max_token_len_per_gpu",
        ):
            _check_int(f"{prefix}{name}", getattr(self, name), 1)
        for name in ("max_model_len", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"):
            _check_int(f"{prefix}{name}", getattr(self, name), 1, optional=True)
        if self.max_model_len is not None and self.max_model_len < self.prompt_length + self.response_length:
            raise ValueError(
                f"{prefix}max_model_len={self.max_model_len} is below prompt_length + response_length = "
                f"{self.prompt_length + self.response_length}; raise it or leave it null"
            )
        if not _is_number(self.over_sample_rate) or not 0 <= self.over_sample_rate < 1:
            raise ValueError(f"{prefix}over_sample_rate={self.over_sample_rate!r} must be in [0, 1)")
        if not isinstance(self.engine_kwargs, dict):
            raise ValueError(f"{prefix}engine_kwargs must be a mapping, got {type(self.engine_kwargs).__name__}")
        nested = {
            "val_kwargs": SamplingConfig,
            "multi_turn": MultiTurnConfig,
            "agent": AgentLoopConfig,
            "checkpoint_engine": CheckpointEngineConfig,
            "trace": TraceConfig,
            "prometheus": PrometheusConfig,
        }
        for name, cls in nested.items():
            if not isinstance(getattr(self, name), cls):
                raise ValueError(
                    f"{prefix}{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}; build "
                    f"nested configs with verl.base_config.omega_conf_to_dataclass"
                )

    @property
    def greedy(self) -> bool:
        """True when the training-time sampling decodes greedily (``do_sample`` off or temperature 0)."""
        return not self.do_sample or self.temperature == 0
