"""``HFRollout``: the torch rollout engine over a transformers causal LM (runs on CPU and GPU alike).

It serves requests with continuous batching (:mod:`verl.workers.rollout.hf_batch`: requests join and leave the
running batch between decode steps, sharing one KV cache) behind the request API of
:mod:`verl.workers.rollout.serving`. Sampling draws no process-global randomness: each request owns a
``torch.Generator`` seeded from its seed (for ``generate_sequences``: seed, step, prompt index, sample index), and
each step inverts the CDF of the filtered distribution at that request's next uniform. The same prompt, seed and
step therefore give the same response wherever, whenever and beside whatever they run.
"""

from __future__ import annotations

import collections.abc
import gc
import inspect
import logging
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from verl.utils.device import warn_if_bf16_is_emulated
from verl.utils.torch_dtypes import to_torch_dtype
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.base import BaseRollout, register_rollout
from verl.workers.rollout.hf_batch import RunningBatch
from verl.workers.rollout.request import as_id_list, sample_seed
from verl.workers.rollout.serving import RequestState, SamplingSpec

__all__ = ["HFRollout", "sample_seed", "sample_tokens"]

logger = logging.getLogger(__name__)


def sample_tokens(
    logits: torch.Tensor,
    uniforms: torch.Tensor | None,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return it with its log-probability.

    Greedy (argmax, log-probs at temperature 1) when ``uniforms`` is None; otherwise the token where the CDF of the
    temperature-scaled, top-k / top-p filtered distribution first exceeds ``uniforms`` (inverse-CDF sampling, in
    descending-probability order when a filter is on, vocabulary order otherwise). The returned log-probability is
    ``log_softmax(logits / temperature)`` at the token, *without* the truncation: what a trainer recomputes.

    Shape: logits (B, V), uniforms (B,) in [0, 1) → tokens (B,) int64, log-probs (B,) float32.
    """
    logits = logits.float()
    if uniforms is None:
        log_probs = F.log_softmax(logits, dim=-1)
        tokens = log_probs.argmax(dim=-1)
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
    log_probs = F.log_softmax(logits / temperature, dim=-1)
    probs = log_probs.exp()
    vocab = probs.shape[-1]
    k = top_k if 0 < top_k < vocab else 0
    if k or top_p < 1.0:
        if k:  # the k most likely tokens, most likely first
            probs, order = torch.topk(probs, k, dim=-1, sorted=True)
        else:
            probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        if top_p < 1.0:
            mass_before = probs.cumsum(-1) - probs  # probability of the more likely tokens kept so far
            probs = probs.masked_fill(mass_before >= top_p * probs.sum(-1, keepdim=True), 0.0)
    else:
        order = None
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    # u·total < total, so the first index whose CDF exceeds it always exists and has a positive probability.
    target = torch.minimum(uniforms.to(cdf)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    index = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)
    tokens = (order.gather(-1, index) if order is not None else index).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


@register_rollout("hf")
class HFRollout(BaseRollout):
    """The torch engine: a transformers causal LM with our batched, KV-cached, per-sample-seeded decode loop.

    Args:
        config: the rollout config; ``dtype`` sets the weight dtype, ``engine_kwargs["hf"]`` is passed to
            ``AutoModelForCausalLM.from_pretrained`` (e.g. ``{"attn_implementation": "eager"}``).
        model_path: a Hugging Face model folder; its weights are loaded at construction (``update_weights`` then
            overwrites them with the trainer's).
        device: where the model runs.
        lora: the actor's LoRA setup (``LoraSpec``). The engine then carries the same adapters (lean LoRA linears,
            :mod:`verl.workers.rollout.hf_lora`) and its weights go by sync names (``verl.workers.engine.lora``): the
            first push fills base and adapters, later pushes the adapters alone, and ``sleep`` keeps the weights (the
            base is never pushed again).
    """

    supports_sleep: ClassVar[bool] = True
    weights_survive_sleep: ClassVar[bool] = False  # sleep drops them

    def __init__(
        self, config: RolloutConfig, model_path: str, device: str | torch.device = "cpu", **kwargs: Any
    ) -> None:
        super().__init__(config, model_path, device, **kwargs)
        import transformers
        from packaging.version import Version

        hf_kwargs = self.config.engine_kwargs.get("hf", {})
        if not isinstance(hf_kwargs, collections.abc.Mapping):
            raise ValueError(f"rollout.engine_kwargs.hf must be a mapping, got {type(hf_kwargs).__name__}")
        self.dtype = to_torch_dtype(self.config.dtype)
        dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56") else "torch_dtype"
        model = transformers.AutoModelForCausalLM.from_pretrained(
            self.model_path, **{dtype_key: self.dtype, **hf_kwargs}
        )
        forward_params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in forward_params else "past_key_values"
        self.model = model.to(self.device).eval().requires_grad_(False)
        # State-dict names → the tensor objects (tied weights appear under several names, as one object).
        self.lora = kwargs.get("lora")
        if self.lora is None:
            self._named = self.model.state_dict(keep_vars=True)
        else:
            from verl.workers.rollout.hf_lora import attach_lora

            self._named = attach_lora(self.model, self.lora)  # the adapters' values come with the first push
        self._unique: dict[int, tuple[str, torch.Tensor, torch.Size]] = {}
        for name, tensor in self._named.items():
            self._unique.setdefault(id(tensor), (name, tensor, tensor.shape))
        # Memory of their own, as after every wake-up: the loader may leave the weights in the file's mapping, whose
        # alignment changes the CPU kernels' rounding, so generation would depend on whether the engine had slept.
        with torch.no_grad():
            for _, tensor, _ in self._unique.values():
                tensor.data = tensor.data.clone()
        self._awake = {"weights": True, "kv_cache": True}
        self._unfilled: set[str] = set()  # woken weights not yet written by update_weights
        generation = getattr(self.model, "generation_config", None)
        eos = getattr(generation, "eos_token_id", None)
        self._default_eos = as_id_list(eos if eos is not None else getattr(self.model.config, "eos_token_id", None))
        pad = getattr(generation, "pad_token_id", None)
        self._default_pad = pad if pad is not None else getattr(self.model.config, "pad_token_id", None)
        self._vocab_size = self.model.get_input_embeddings().num_embeddings
        self._batch = RunningBatch(self.model, self._cache_kwarg, sample_tokens, self.device)
        cfg = self.config
        self._init_serving(cfg.max_num_seqs, cfg.max_model_len or cfg.prompt_length + cfg.response_length)
        logger.info("HFRollout: %s on %s (%s)", self.model_path, self.device, self.dtype)
        warn_if_bf16_is_emulated(self.dtype, self.device, "the hf rollout engine (rollout.dtype)")

    # ------------------------------------------------------------------ memory and weights
    def memory_bytes(self) -> int:
        """Bytes of the distinct storages behind the model's parameters and buffers, plus the running batch's KV
        cache (which exists only while requests run)."""
        storages: dict[int, int] = {}
        for tensor in [*self.model.parameters(), *self.model.buffers()]:
            storage = tensor.untyped_storage()
            if storage.nbytes():
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values()) + self._batch.nbytes()

    def sleep(self) -> None:
        """Drop the weights (parameters and persistent buffers become empty tensors; the module structure and
        non-persistent buffers such as rotary frequencies stay) and the KV cache; with LoRA the KV cache only.
        Idempotent; refused while requests are in flight."""
        if self.num_requests():
            raise RuntimeError(
                f"HFRollout.sleep: {self.num_requests()} request(s) in flight; abort or finish them first"
            )
        if self.lora is not None and self._awake["weights"]:
            # the pushes after the first carry the adapters alone: the base weights must stay
            logger.debug("HFRollout.sleep with LoRA: the weights stay, the KV cache goes")
            self._awake["kv_cache"] = False
            return
        if self._awake["weights"]:
            for _, tensor, _ in self._unique.values():
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
            self._unfilled.clear()
        self._awake = {"weights": False, "kv_cache": False}
        if self.device.type == "cuda":  # host memory returns as the tensors die; a full gc.collect() costs ~0.25 s
            gc.collect()
            torch.cuda.empty_cache()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Reallocate what ``tags`` names. Woken weights are uninitialized until ``update_weights`` fills them."""
        tags = self._check_tags(tags)
        if "weights" in tags and not self._awake["weights"]:
            for name, tensor, shape in self._unique.values():
                tensor.data = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
                self._unfilled.add(name)
            self._awake["weights"] = True
        if "kv_cache" in tags:
            self._awake["kv_cache"] = True

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy weights in, by Hugging Face state-dict name, cast to the engine's dtype and device."""
        if not self._awake["weights"]:
            raise RuntimeError("HFRollout.update_weights: the weights are asleep; call wake_up(['weights']) first")
        with self.weight_update(), torch.no_grad():
            for name, value in named_tensors:
                target = self._named.get(name)
                if target is None:
                    known = list(self._named)
                    raise ValueError(f"update_weights: unknown weight {name!r}; the engine has {known[:4]} ...")
                if not isinstance(value, torch.Tensor):
                    raise TypeError(f"update_weights: {name!r} must be a tensor, got {type(value).__name__}")
                if hasattr(value, "full_tensor"):  # a DTensor from a sharded trainer
                    value = value.full_tensor()
                if value.shape != target.shape:
                    raise ValueError(
                        f"update_weights: {name!r} has shape {tuple(value.shape)}, the engine expects "
                        f"{tuple(target.shape)}"
                    )
                target.copy_(value.detach())
                self._unfilled.discard(self._unique[id(target)][0])

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The current weights under their state-dict names (tied weights under each of their names)."""
        if not self._awake["weights"]:
            raise RuntimeError("HFRollout.named_weights: the weights are asleep; call wake_up(['weights']) first")
        return ((name, tensor.detach()) for name, tensor in self._named.items())

    # ------------------------------------------------------------------ generation
    def _check_ready(self) -> None:
        asleep = [tag for tag, awake in self._awake.items() if not awake]
        if asleep:
            raise RuntimeError(
                f"HFRollout is asleep ({', '.join(asleep)}); call wake_up() and update_weights() before generating"
            )
        if self._unfilled:
            missing = sorted(self._unfilled)
            raise RuntimeError(
                f"HFRollout: {len(missing)} weight(s) were woken but never loaded (e.g. {missing[:3]}); call "
                f"update_weights() with the trainer's weights before generating"
            )

    def _check_request(self, request_id: str, spec: SamplingSpec) -> None:
        if spec.repetition_penalty != 1.0:
            raise ValueError(
                f"generate({request_id!r}): the hf engine has no repetition_penalty (got {spec.repetition_penalty})"
            )

    def _serve_admit(self, requests: list[RequestState]) -> None:
        self._batch.admit(requests)

    def _serve_step(self) -> list[tuple[RequestState, list[int], list[float], str | None]]:
        return self._batch.step()

    def _serve_release(self, requests: list[RequestState]) -> None:
        self._batch.release(requests)
