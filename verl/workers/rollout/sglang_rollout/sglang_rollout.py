"""``SGLangRollout``: SGLang as a rollout engine, an in-process ``sglang.Engine`` (CUDA, or the CPU setup of
docs/sglang.md).

Layout. The engine object lives in the worker's process; SGLang starts its scheduler (the model, the KV pool, the
radix prefix cache, continuous batching) in a child process. Every call into SGLang's tokenizer manager runs on one
event loop on a thread of its own (:class:`~.sglang_requests.EngineLoop`), so the engine serves callers on any
thread. Requests go through the request API of :mod:`verl.workers.rollout.serving` (``generate`` / ``submit`` /
``abort`` / resume; ``generate_sequences`` is the thin batch layer over it), each as one streaming SGLang request
(:mod:`.sglang_requests`).

Weights. ``update_weights`` hands the trainer's tensors to the scheduler with ``update_weights_from_tensor`` (between
``begin_weight_update`` / ``end_weight_update``: torch's shared-memory tensors on CPU, CUDA IPC handles on GPU), after
aborting SGLang's running requests, which the request layer then re-admits under the new weights; the radix cache is
flushed when the load ends. Tensors from a trainer in another process (``separate_async``) reach this process through
the checkpoint engine (gloo, nccl or shm) and then take the same path. ``named_weights`` reads the weights back exactly
(the scheduler saves its state dict, fused projections split back), for digest verification of a sync.

Sampling follows the rollout contract: per-token log-probs of the sampled tokens (SGLang's default: temperature
scaled), stopping exactly at the request's ``stop_token_ids``. Seeds are honoured only with
``engine_kwargs.sglang.enable_deterministic_inference`` (CUDA; on CPU it needs a kernel the CPU setup lacks and is
refused; see :mod:`.sglang_requests`).

Sleep. On CUDA with ``free_cache_engine``, ``sleep`` releases the weights and KV cache (SGLang's memory saver,
``release_memory_occupation``) and ``wake_up`` restores them. SGLang cannot release memory on CPU: there ``sleep`` and
``wake_up`` are no-ops and memory is bounded by the KV pool (``max_total_tokens``).

LoRA is not served by this engine yet: ``lora_rank > 0`` with ``rollout.name=sglang`` is refused.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from verl.utils.rng import preserve_process_state
from verl.utils.torch_dtypes import canonical_dtype_name
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.base import BaseRollout, register_rollout
from verl.workers.rollout.fused_weights import unfuse
from verl.workers.rollout.request import as_id_list
from verl.workers.rollout.serving import RequestState
from verl.workers.rollout.sglang_rollout.sglang_requests import EngineLoop, SGLangRequests

__all__ = ["SGLangRollout", "sglang_engine_kwargs"]

logger = logging.getLogger(__name__)

#: KV-pool size on CPU (tokens) unless ``engine_kwargs.sglang.max_total_tokens`` says otherwise.
DEFAULT_CPU_MAX_TOTAL_TOKENS = 8192
_CALL_TIMEOUT_S = 600.0
#: SGLang admits at most ``context_length - 2`` tokens per request: it is given this much more than ``max_model_len``.
CONTEXT_MARGIN = 2
# engine arguments whose code paths call kernels of sgl_kernel's CPU build, which PyPI does not have
_NEEDS_KERNELS = {
    "enable_deterministic_inference": "seeded sampling hashes with sgl_kernel's murmur_hash32_cpu",
    "enable_lora": "SGLang's LoRA backends run Triton or CUDA kernels",
    "speculative_algorithm": "speculative decoding runs Triton or CUDA kernels",
}
_FLUSH_TIMEOUT_S = 60.0


def sglang_engine_kwargs(config: RolloutConfig, model_path: str, device: torch.device) -> dict[str, Any]:
    """``sglang.Engine`` arguments from veRL's ``rollout.*`` keys; ``engine_kwargs.sglang`` wins over them."""
    on_cuda = device.type == "cuda"
    max_model_len = config.max_model_len or config.prompt_length + config.response_length
    kwargs: dict[str, Any] = {
        "model_path": model_path,
        "dtype": canonical_dtype_name(config.dtype),
        # SGLang serves at most context_length - 2 tokens (prompt and response) per request
        "context_length": max_model_len + CONTEXT_MARGIN,
        "tp_size": config.tensor_model_parallel_size,
        "random_seed": config.seed,
        "load_format": config.load_format,
        "max_running_requests": config.max_num_seqs,
        "chunked_prefill_size": config.max_num_batched_tokens if config.enable_chunked_prefill else -1,
        "disable_radix_cache": not config.enable_prefix_caching,
        "skip_tokenizer_init": config.skip_tokenizer_init,
        "log_level": "error",
        "device": "cuda" if on_cuda else "cpu",
    }
    if on_cuda:
        kwargs.update(
            mem_fraction_static=config.gpu_memory_utilization,
            enable_memory_saver=config.free_cache_engine,
            disable_cuda_graph=config.enforce_eager,
            base_gpu_id=device.index or 0,
        )
    else:  # SGLang's kernel-free settings (docs/sglang.md)
        kwargs.update(
            attention_backend="torch_native",
            sampling_backend="pytorch",
            disable_cuda_graph=True,
            disable_overlap_schedule=True,
            max_total_tokens=max(DEFAULT_CPU_MAX_TOTAL_TOKENS, 2 * max_model_len),
            mem_fraction_static=0.05,
        )
    kwargs.update(config.engine_kwargs.get("sglang", {}) or {})
    return kwargs


def _check_kernel_package(device: torch.device) -> None:
    """Refuse the CPU stand-in for SGLang's kernel package where a GPU would use the real one."""
    import importlib

    try:
        kernel = importlib.import_module("sgl_kernel")
    except ImportError as error:
        raise ImportError(
            "rollout.name=sglang: SGLang's kernel package sgl_kernel does not import here; on a GPU install "
            "sglang-kernel, on a CPU machine follow docs/sglang.md"
        ) from error
    if getattr(kernel, "__verl_cpu_stand_in__", False) and device.type == "cuda":
        raise RuntimeError(f"rollout.name=sglang on {device}: sgl_kernel is the CPU stand-in; install sglang-kernel")


def _check_cpu_kwargs(engine_kwargs: dict[str, Any]) -> None:
    """Refuse SGLang settings that need a kernel the CPU setup lacks (they would fail in the scheduler process)."""
    for key, why in _NEEDS_KERNELS.items():
        if engine_kwargs.get(key):
            raise ValueError(f"actor_rollout_ref.rollout.engine_kwargs.sglang.{key}: not available on CPU ({why})")


@register_rollout("sglang")
class SGLangRollout(BaseRollout):
    """SGLang in the worker process (its scheduler in a child process), serving the request API. See the module
    docstring for the layout, weight sync and the CPU caveats.

    Args:
        config: the rollout config. ``engine_kwargs["sglang"]`` is passed to ``sglang.Engine`` and wins over the
            values derived from the config.
        model_path: the Hugging Face model folder (config; weights too unless ``load_format`` is ``dummy``).
        device: ``"cpu"`` or a CUDA device.
    """

    supports_sleep: ClassVar[bool] = False  # set per instance: True on CUDA with the memory saver

    def __init__(
        self, config: RolloutConfig, model_path: str, device: str | torch.device = "cpu", **kwargs: Any
    ) -> None:
        super().__init__(config, model_path, device, **kwargs)
        cfg = self.config
        if kwargs.get("lora") is not None:
            raise NotImplementedError(
                "rollout.name=sglang does not serve LoRA adapters yet; use rollout.name=vllm or hf with lora_rank > 0"
            )
        if cfg.tensor_model_parallel_size != 1 and self.device.type != "cuda":
            raise ValueError(
                f"rollout.tensor_model_parallel_size={cfg.tensor_model_parallel_size}: SGLang on CPU runs one engine "
                "per rank (tensor parallel size 1); set actor_rollout_ref.rollout.tensor_model_parallel_size=1"
            )
        from transformers import AutoConfig, AutoModelForCausalLM

        self.hf_config = AutoConfig.from_pretrained(
            self.model_path, trust_remote_code=bool(kwargs.get("trust_remote_code", False))
        )
        self.dtype = getattr(torch, canonical_dtype_name(cfg.dtype))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(self.hf_config)
        self._weight_bytes = sum(p.numel() for p in model.parameters()) * self.dtype.itemsize
        _check_kernel_package(self.device)
        if self.device.type == "cpu":
            os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # without it a CPU scheduler fails at start-up
        engine_kwargs = sglang_engine_kwargs(cfg, self.model_path, self.device)
        if self.device.type == "cpu":
            _check_cpu_kwargs(engine_kwargs)
        self.deterministic = bool(engine_kwargs.get("enable_deterministic_inference", False))
        self.supports_sleep = self.device.type == "cuda" and bool(engine_kwargs.get("enable_memory_saver"))
        import sglang

        self._loop = EngineLoop()
        started = time.perf_counter()
        with preserve_process_state():
            self.engine = sglang.Engine(**engine_kwargs)
        self.startup_seconds = time.perf_counter() - started
        self._default_eos = as_id_list(getattr(self.hf_config, "eos_token_id", None))
        self._default_pad = getattr(self.hf_config, "pad_token_id", None)
        self._vocab_size = self.hf_config.vocab_size
        self._asleep = False
        self._requests = SGLangRequests(self.engine, self._loop, self.deterministic)
        self._init_serving(cfg.max_num_seqs, engine_kwargs["context_length"] - CONTEXT_MARGIN)
        logger.info(
            "SGLangRollout: %s on %s (%s), started in %.1fs", model_path, self.device, cfg.dtype, self.startup_seconds
        )

    # ------------------------------------------------------------------ calls into SGLang
    def _call(self, method: str, obj: Any) -> Any:
        """``tokenizer_manager.<method>(obj)`` on the engine loop; a ``(success, message)`` failure raises."""
        result = self._loop.run(getattr(self.engine.tokenizer_manager, method)(obj, None), timeout=_CALL_TIMEOUT_S)
        if isinstance(result, tuple) and len(result) == 2 and result[0] is False:
            raise RuntimeError(f"SGLang {method} failed: {result[1]}")
        return result

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors into the scheduler's model (SGLang fuses and casts them itself).

        Runs inside :meth:`weight_update`: SGLang's running requests are aborted first (the request layer re-admits
        them under the new weights) and the radix cache is flushed when the load ends.
        """
        from sglang.srt.managers.io_struct import (
            BeginWeightUpdateReqInput,
            EndWeightUpdateReqInput,
            UpdateWeightsFromTensorReqInput,
        )
        from sglang.srt.utils import MultiprocessingSerializer

        with self.weight_update():
            tensors = []
            for name, tensor in named_tensors:
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                tensors.append((name, tensor.detach().to(self.dtype).contiguous()))
            if not tensors:
                return
            self._requests.release_all()  # nothing more is generated with the old weights
            payload = [MultiprocessingSerializer.serialize(tensors) for _ in range(self.engine.server_args.tp_size)]
            self._call("begin_weight_update", BeginWeightUpdateReqInput())
            try:
                self._call(
                    "update_weights_from_tensor",
                    UpdateWeightsFromTensorReqInput(serialized_named_tensors=payload, flush_cache=False),
                )
            finally:
                self._call("end_weight_update", EndWeightUpdateReqInput())

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The scheduler's weights under Hugging Face names, exactly (it saves its state dict to a temporary folder;
        fused projections are split back). For verification: it costs a write and a read of every weight."""
        from safetensors.torch import load_file

        with tempfile.TemporaryDirectory(prefix="verl-sglang-weights-") as folder:
            self.engine.save_sharded_model(path=folder, pattern=None, max_size=None)
            state: dict[str, torch.Tensor] = {}
            for file in sorted(Path(folder).glob("*.safetensors")):
                state.update(load_file(str(file)))
        for name, tensor in state.items():
            yield from unfuse(name, tensor, self.hf_config)
        if "lm_head.weight" not in state and getattr(self.hf_config, "tie_word_embeddings", False):
            yield "lm_head.weight", state["model.embed_tokens.weight"]

    def memory_bytes(self) -> int:
        """Bytes of the weights plus SGLang's KV pool (its token capacity × the KV bytes of a token); 0 asleep."""
        if self._asleep:
            return 0
        states = self._loop.run(self.engine.tokenizer_manager.get_internal_state(), timeout=_CALL_TIMEOUT_S)
        tokens = int(states[0]["memory_usage"]["token_capacity"])
        config = self.hf_config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        per_token = 2 * config.num_hidden_layers * kv_heads * head_dim * self.dtype.itemsize
        return self._weight_bytes + tokens * per_token

    def sleep(self) -> None:
        """Release weights and KV cache (CUDA, with the memory saver); a documented no-op on CPU. Refused while
        requests are in flight."""
        if self.num_requests():
            raise RuntimeError(f"SGLangRollout.sleep: {self.num_requests()} request(s) in flight; abort them first")
        with self._engine_turn():
            if self.supports_sleep and not self._asleep:
                from sglang.srt.managers.io_struct import ReleaseMemoryOccupationReqInput

                self._call("release_memory_occupation", ReleaseMemoryOccupationReqInput())
                self._asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = self._check_tags(tags)
        with self._engine_turn():
            if self.supports_sleep and self._asleep:
                from sglang.srt.managers.io_struct import ResumeMemoryOccupationReqInput

                self._call("resume_memory_occupation", ResumeMemoryOccupationReqInput(tags=list(tags)))
                self._asleep = "kv_cache" not in tags

    def close(self) -> None:
        """Abort what is in flight, stop the engine thread, shut SGLang's processes down."""
        super().close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
            self.engine = None
        self._loop.close()

    # ------------------------------------------------------------------ the request hooks
    def _check_ready(self) -> None:
        if self._asleep:
            raise RuntimeError("SGLangRollout is asleep; call wake_up() before generating")

    def _serve_admit(self, requests: list[RequestState]) -> None:
        self._requests.add(requests)

    def _serve_step(self) -> list[tuple[RequestState, list[int], list[float], str | None]]:
        return self._requests.step()

    def _serve_release(self, requests: list[RequestState]) -> None:
        self._requests.release(requests)

    def _serve_invalidate(self) -> None:
        """Flush the radix cache after a weight load; SGLang refuses while aborted requests are still leaving its
        scheduler, so the flush is retried until it is idle."""
        deadline = time.monotonic() + _FLUSH_TIMEOUT_S
        while True:
            result = self._loop.run(self.engine.tokenizer_manager.flush_cache(), timeout=_CALL_TIMEOUT_S)
            if getattr(result, "success", bool(result)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("SGLangRollout: SGLang did not flush its cache after a weight load")
            time.sleep(0.01)
