"""Make megatron-core 0.16.1 train a GPT model on CPU over the gloo backend.

megatron-core assumes a CUDA device in a few dozen places. ``apply_cpu_layer()`` (a no-op when CUDA is available)
redirects exactly those places to the CPU, in two ways:

1. **Namespace redirect** (most call sites). About twenty call sites in the modules of ``_REDIRECTED_MODULES``
   hard-code ``torch.cuda.current_device()``, ``torch.cuda.synchronize()`` or ``device="cuda"``, deep inside long
   functions (autograd backward passes, pipeline p2p, grad-buffer constructors, grad-norm kernels) that would
   otherwise have to be copied whole. Instead, the module-level name ``torch`` of exactly those modules is rebound
   to ``_CpuTorch``, a thin proxy that forwards every attribute to the real ``torch`` except ``torch.cuda``'s
   device/sync/seed functions and the ``device="cuda"`` argument of the tensor factories, which now name the CPU.
   ``torch`` itself and every other module are untouched. Each redirected call raises on a CPU-only host, so
   nothing that ran before changes behaviour (bar ``torch.cuda.manual_seed``, which now seeds the CPU generator:
   on CPU that generator is the "default" RNG stream megatron seeds per data-parallel rank).
2. **Narrow patches**, for what a namespace cannot reach: the RNG states tracker, megatron's private CUDA RNG
   get/set helpers, the torch norm's sequence-parallel refusal, and the CUDA-only tensor *methods* called on
   parameters (``param.type() == "torch.cuda.FloatTensor"`` checks in the optimizers and grad clipping, ``.cuda()``
   of the tied output layer under PP), which a few functions now see pass for CPU tensors.

Callers must also build their ``TransformerConfig`` with ``cpu_transformer_config_overrides()`` (CPU weight init,
every CUDA fusion off) and pass an explicit boolean attention mask: the local (non-TE) attention takes padded
batches only, no packed (THD) sequences. Not covered on CPU: Transformer Engine / apex kernels, flash attention,
CUDA graphs, ``tensor_parallel.broadcast_data`` (``.cuda()``), several distributed-optimizer instances (CUDA
streams), optimizer CPU offload, and ``enable_autocast`` in the pipeline schedules.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = [
    "MEGATRON_CORE_VERSION",
    "apply_cpu_layer",
    "check_megatron_core_version",
    "cpu_transformer_config_overrides",
]

logger = logging.getLogger(__name__)

MEGATRON_CORE_VERSION = "0.16.1"  # the megatron-core release these patches were written against and tested with

_CPU = torch.device("cpu")

# Modules whose hard-coded CUDA calls sit on the training path (the namespace redirect, point 1 above).
_REDIRECTED_MODULES = (
    "megatron.core.utils",  # GlobalMemoryBuffer.get_tensor; local_multi_tensor_l2_norm (grad norm w/o apex)
    "megatron.core.tensor_parallel.layers",  # sequence-parallel all-gather / reduce-scatter buffers in backward
    "megatron.core.tensor_parallel.mappings",  # gather / reduce-scatter output buffers
    "megatron.core.tensor_parallel.utils",  # split / gather across TP ranks
    "megatron.core.tensor_parallel.random",  # model_parallel_cuda_manual_seed seeds the "default" RNG stream
    "megatron.core.pipeline_parallel.p2p_communication",  # shape/activation receive buffers, synchronize()
    "megatron.core.pipeline_parallel.schedules",  # total_num_tokens counters
    "megatron.core.distributed.param_and_grad_buffer",  # param / grad buffers of DDP and the distributed optimizer
    "megatron.core.distributed.distributed_data_parallel",  # synchronize() / empty_cache() when freeing buffers
    "megatron.core.optimizer.optimizer",  # found_inf / scale tensors, fp32 optimizer's scale
    "megatron.core.optimizer.distrib_optimizer",  # gather buffers of the sharded optimizer state
    "megatron.core.optimizer.clip_grads",  # grad-norm and clipping scratch tensors
    "megatron.core.optimizer.grad_scaler",  # loss-scale tensors (fp16)
    "megatron.core.models.common.embeddings.rotary_pos_embedding",  # RotaryEmbedding moves inv_freq to the GPU
)

# Tensor factories whose ``device="cuda"`` (or CUDA index) argument the proxy maps to the CPU.
_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange")

_applied = False


def check_megatron_core_version() -> None:
    """Raise ``RuntimeError`` unless the installed megatron-core is ``MEGATRON_CORE_VERSION`` (the patches below
    reach into its private functions); ``ImportError`` when megatron-core is not installed."""
    try:
        from megatron.core.package_info import __version__ as installed
    except ImportError as e:
        raise ImportError(f"megatron-core is not installed (the CPU layer wants {MEGATRON_CORE_VERSION})") from e
    if installed != MEGATRON_CORE_VERSION:
        raise RuntimeError(
            f"megatron-core {installed} is installed, but verl's CPU layer (verl/utils/megatron/cpu_layer.py) is "
            f"tested with megatron-core {MEGATRON_CORE_VERSION} only; install megatron-core=={MEGATRON_CORE_VERSION}"
        )


def cpu_transformer_config_overrides() -> dict[str, bool]:
    """``TransformerConfig`` kwargs a CPU run needs: initialise weights on the CPU and turn off every fusion (each
    one is a CUDA kernel from apex / Transformer Engine / a fused extension)."""
    return {
        "use_cpu_initialization": True,
        "gradient_accumulation_fusion": False,
        "masked_softmax_fusion": False,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "persist_layer_norm": False,
        "apply_rope_fusion": False,
    }


def _on_cpu(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wrap a tensor factory so that a CUDA ``device=`` (``"cuda"``, ``"cuda:1"``, a CUDA ``torch.device`` or a
    device index) allocates on the CPU instead."""

    @functools.wraps(factory)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if device is not None and (isinstance(device, int) or torch.device(device).type == "cuda"):
            kwargs["device"] = _CPU
        return factory(*args, **kwargs)

    return wrapper


class _CpuCuda:
    """What ``torch.cuda`` reads as inside the redirected modules: device, sync and seed calls act on the CPU,
    anything else is the real ``torch.cuda``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> torch.device:
        """``device=torch.cuda.current_device()`` allocates buffers: on the CPU now."""
        return _CPU

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """CPU ops (and gloo collectives, which block) are synchronous: nothing to wait for."""

    @staticmethod
    def empty_cache() -> None:
        """No CUDA caching allocator to release."""

    @staticmethod
    def manual_seed(seed: int) -> None:
        """The CPU generator is the "default" (data-parallel) RNG stream on a CPU run."""
        torch.manual_seed(seed)


class _CpuTorch:
    """Stand-in for the module-level name ``torch`` of the redirected modules: the real ``torch`` except for
    ``torch.cuda`` (``_CpuCuda``) and the factories of ``_FACTORIES`` (``device="cuda"`` -> CPU)."""

    cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def __repr__(self) -> str:
        return "<torch, CUDA device calls redirected to the CPU by verl.utils.megatron.cpu_layer>"


for _name in _FACTORIES:
    setattr(_CpuTorch, _name, staticmethod(_on_cpu(getattr(torch, _name))))

_CPU_TORCH = _CpuTorch()


def _redirect_module_namespaces() -> None:
    """Point 1 of the module docstring: rebind ``torch`` in each module of ``_REDIRECTED_MODULES``."""
    for module_name in _REDIRECTED_MODULES:
        module = importlib.import_module(module_name)
        if module.__dict__.get("torch") not in (torch, _CPU_TORCH):
            raise RuntimeError(f"{module_name} has no module-level `torch`; the CPU layer does not fit it")
        module.torch = _CPU_TORCH


def _patch_rng() -> None:
    """Replace ``CudaRNGStatesTracker`` (CUDA generator states) with a tracker of CPU generator states."""
    from megatron.core.tensor_parallel import random as mp_random

    class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
        """Named CPU generator states (tensor-parallel, data-parallel, expert streams); ``fork(name)`` swaps the
        CPU generator to that stream and back. Replaces megatron's tracker, which reads ``torch.cuda`` generators
        and warns whenever the CPU state changes inside a fork (always, on CPU)."""

        def add(self, name: str, seed: int) -> None:
            """Track a new stream ``name`` seeded with ``seed``."""
            self._is_initialized = True
            if seed in self.seeds_:
                raise RuntimeError(f"seed {seed} already exists")
            if name in self.states_:
                raise RuntimeError(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name: str = mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            """Run the body on stream ``name``; the outer stream resumes afterwards (nesting allowed)."""
            if name not in self.states_:
                raise RuntimeError(f"rng state {name} is not added")
            outer_state, outer_name = torch.get_rng_state(), self._current_state_name
            torch.set_rng_state(self.states_[name])
            self._current_state_name = name
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer_state)
                self._current_state_name = outer_name

    # initialize_rng_tracker() instantiates the module global `CudaRNGStatesTracker` when it first runs (from
    # model_parallel_cuda_manual_seed or get_cuda_rng_tracker): rebinding it swaps the tracker everywhere.
    mp_random.CudaRNGStatesTracker = CpuRNGStatesTracker
    if mp_random._CUDA_RNG_STATE_TRACKER is not None:  # a CUDA tracker made before the patch: rebuild lazily
        mp_random._CUDA_RNG_STATE_TRACKER = None
        mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = False

    # megatron's private helpers index torch.cuda.default_generators; activation checkpointing (CheckpointFunction)
    # and the tracker's graph-safe paths go through them. On CPU the one generator is the CPU default generator.
    def get_rng_state(device: Any = None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    mp_random._get_cuda_rng_state = get_rng_state
    mp_random._set_cuda_rng_state = set_rng_state


def _patch_torch_norm() -> None:
    """Let ``WrappedTorchNorm`` (the torch LayerNorm/RMSNorm of the local spec) run with sequence parallelism."""
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    original_new = WrappedTorchNorm.__new__

    # WrappedTorchNorm asserts `not config.sequence_parallel` because it has no TE/apex kernel that tags the
    # weights. A torch norm is per token, so it normalises a sequence shard exactly as the full sequence; only
    # its weight gradients must be summed over the TP group, which finalize_model_grads does for parameters
    # tagged `sequence_parallel = True`. So: build the norm from a copy of the config without the flag, and tag.
    def new(cls: type, config: Any, hidden_size: int, eps: float = 1e-5, *args: Any, **kwargs: Any) -> Any:
        if not config.sequence_parallel:
            return original_new(cls, config, hidden_size, eps, *args, **kwargs)
        config_without_sp = copy.copy(config)
        config_without_sp.sequence_parallel = False
        norm = original_new(cls, config_without_sp, hidden_size, eps, *args, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True
        return norm

    WrappedTorchNorm.__new__ = staticmethod(new)


@contextlib.contextmanager
def _cpu_tensors_pass_as_cuda() -> Iterator[None]:
    """While active, a CPU tensor's ``t.type()`` reads ``"torch.cuda.FloatTensor"`` (etc.) instead of
    ``"torch.FloatTensor"`` and ``t.cuda()`` returns ``t``: the tensor *methods* megatron calls on its own
    parameters, which no namespace redirect reaches. Process-wide, but only for the duration of the wrapped calls."""
    if getattr(torch.Tensor.__dict__.get("type"), "_verl_cpu_layer", False):  # already active (nested call)
        yield
        return
    saved = {name: torch.Tensor.__dict__.get(name) for name in ("type", "cuda")}
    original_type, original_cuda = torch.Tensor.type, torch.Tensor.cuda

    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original_type(self, *args, **kwargs)
        if not args and not kwargs and self.device.type == "cpu":
            return result.replace("torch.", "torch.cuda.", 1)
        return result

    def cuda(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self if self.device.type == "cpu" else original_cuda(self, *args, **kwargs)

    type_._verl_cpu_layer = True  # type: ignore[attr-defined]
    torch.Tensor.type, torch.Tensor.cuda = type_, cuda  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(torch.Tensor, name)  # back to the inherited torch._C.TensorBase method
            else:
                setattr(torch.Tensor, name, value)


def _passing_cpu_as_cuda(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``fn`` to run inside ``_cpu_tensors_pass_as_cuda()``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _cpu_tensors_pass_as_cuda():
            return fn(*args, **kwargs)

    return wrapper


def _patch_tensor_method_calls() -> None:
    """Wrap the functions that call CUDA-only tensor methods on megatron's (here CPU) parameters."""
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as mp_optimizer

    # The fp16/bf16 and distributed optimizers sort parameters by `param.type()` ("torch.cuda.FloatTensor", ...)
    # and raise TypeError on any other name.
    for cls in (mp_optimizer.Float16OptimizerWithFloat16Params, distrib_optimizer.DistributedOptimizer):
        cls.__init__ = _passing_cpu_as_cuda(cls.__init__)
    # Grad clipping asserts `param.grad.type() == "torch.cuda.FloatTensor"`.
    clip = _passing_cpu_as_cuda(clip_grads.clip_grad_by_total_norm_fp32)
    clip_grads.clip_grad_by_total_norm_fp32 = clip
    mp_optimizer.clip_grad_by_total_norm_fp32 = clip  # optimizer.py imported it by name
    # Tied embeddings under PP: the last stage's output-layer copy is moved with `.cuda()` before the all-reduce
    # that copies the first stage's embedding into it.
    LanguageModule.setup_embeddings_and_output_layer = _passing_cpu_as_cuda(
        LanguageModule.setup_embeddings_and_output_layer
    )


def apply_cpu_layer() -> None:
    """Patch megatron-core so that it trains on CPU over gloo (see the module docstring). Idempotent; does nothing
    when CUDA is available. Raises ``RuntimeError`` when the installed megatron-core is not
    ``MEGATRON_CORE_VERSION``. Call it before building the model (before ``model_parallel_cuda_manual_seed``)."""
    global _applied
    if _applied or torch.cuda.is_available():
        return
    check_megatron_core_version()
    _redirect_module_namespaces()
    _patch_rng()
    _patch_torch_norm()
    _patch_tensor_method_calls()
    _applied = True
    logger.info("megatron-core %s patched to run on CPU (verl.utils.megatron.cpu_layer)", MEGATRON_CORE_VERSION)
