"""LoRA adapters in the in-process vLLM engine: one adapter folder per weight version, loaded through vLLM's LoRA
interface (``LLMEngine.add_lora``), every request generated with the newest one.

The base weights are loaded as without LoRA (``reload_weights``, by Hugging Face name); adapter tensors (sync names
of ``verl.workers.engine.lora``) are collected over a weight load's buckets and, once all have come, written as a
peft adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) that vLLM loads under a new LoRA id;
the previous version's adapter is removed from the engine and its folder deleted. vLLM reads adapters from disk only
(no in-memory load in vLLM 0.32), so a push costs one small file write.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import weakref
from typing import Any

import torch

from verl.workers.config.lora import LoraSpec
from verl.workers.engine.lora import ADAPTER_WEIGHTS_FILE, save_adapter_folder

__all__ = ["VLLM_LORA_RANKS", "VllmAdapters", "vllm_lora_kwargs"]

logger = logging.getLogger(__name__)

# the values vLLM 0.32 accepts for max_lora_rank (an adapter of a smaller rank loads under a larger maximum)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_kwargs(spec: LoraSpec) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments for adapters of ``spec.rank``: LoRA on, one adapter at a time."""
    fitting = [rank for rank in VLLM_LORA_RANKS if rank >= spec.rank]
    if not fitting:
        raise ValueError(f"lora_rank={spec.rank}: vLLM serves LoRA ranks up to {VLLM_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1}


class VllmAdapters:
    """The adapter versions of one vLLM ``LLMEngine``.

    Args:
        llm_engine: ``vllm.LLM(...).llm_engine`` built with :func:`vllm_lora_kwargs`.
        spec: the actor's LoRA setup (rank and alpha go into each folder's config).
        model_path: the base model folder (recorded in the adapter config).
    """

    def __init__(self, llm_engine: Any, spec: LoraSpec, model_path: str, hf_config: Any) -> None:
        self.engine = llm_engine
        self.expected = _adapter_names(hf_config, spec)
        self.spec = spec
        self.model_path = model_path
        self.root = tempfile.mkdtemp(prefix="verl-vllm-lora-")
        weakref.finalize(self, shutil.rmtree, self.root, True)
        self.pending: dict[str, torch.Tensor] = {}
        self.request: Any = None  # the LoRARequest every new request carries (None until adapters arrive)
        self.folder: str | None = None
        self._loads = 0

    def collect(self, name: str, tensor: torch.Tensor) -> None:
        """Hold one adapter tensor of the load in progress; the last one makes the set the engine's adapter."""
        if name not in self.expected:
            raise ValueError(f"update_weights: unknown adapter tensor {name!r} (LoRA on {len(self.expected)} tensors)")
        self.pending[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if len(self.pending) == len(self.expected):
            self._commit()

    def check_complete(self) -> None:
        """At the end of a weight load: no adapter may be half pushed."""
        if self.pending:
            missing = sorted(self.expected - set(self.pending))
            self.pending = {}
            raise ValueError(f"a weight load ended with {len(missing)} adapter tensor(s) missing, e.g. {missing[:3]}")

    def _commit(self) -> None:
        """The collected adapters become the engine's adapter (a new LoRA id); the previous one is dropped."""
        from vllm.lora.request import LoRARequest

        self._loads += 1
        folder = os.path.join(self.root, f"v{self._loads}")
        save_adapter_folder(folder, self.spec, self.pending, self.model_path)
        self.pending = {}
        request = LoRARequest(f"verl_lora_{self._loads}", self._loads, folder)
        self.engine.add_lora(request)  # validates the folder (a bad adapter raises here, not in a request)
        previous, self.request, self.folder = self.request, request, folder
        if previous is not None:
            self.engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        logger.debug("vLLM LoRA: adapter %s loaded from %s", request.lora_name, folder)

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter tensors of the current version, as the engine read them (its folder's file)."""
        if self.folder is None:
            return {}
        from safetensors.torch import load_file

        return load_file(os.path.join(self.folder, ADAPTER_WEIGHTS_FILE))


def _adapter_names(hf_config: Any, spec: LoraSpec) -> set[str]:
    """The sync names of the adapter tensors ``spec`` puts on the model of ``hf_config``."""
    from verl.workers.engine.lora import adapted_modules

    return {f"base_model.model.{m}.lora_{part}.weight" for m in adapted_modules(hf_config, spec) for part in "AB"}
