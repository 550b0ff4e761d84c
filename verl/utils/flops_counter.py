"""``FlopsCounter``: the model FLOPs of a training pass over a batch, for the ``perf/mfu/*`` metrics.

The count is the usual dense-transformer estimate (Kaplan et al. 2020, arXiv:2001.08361, §2.1; Narayanan et al.
2021, arXiv:2104.04473, App. A): a forward and backward pass costs 6 FLOPs per parameter of every matmul per
token (2 forward, 4 backward), plus the attention scores and their weighted sum, whose cost grows with the square
of each sequence's length: ``QKᵀ`` and ``softmax·V`` each take 2·s²·d FLOPs per layer forward, ×3 with backward,
so 12·s²·(heads·head_dim) per layer.

For a decoder of L layers, hidden size h, vocabulary V, MLP width f, q heads a and kv heads k of size d::

    attention matmuls: h·(a·d + 2·k·d) + (a·d)·h   (q, k, v and output projections)
    MLP matmuls:       3·h·f                        (gate, up, down)
    N = L·(attention + MLP) + 2·V·h                 (embedding and LM head, counted as veRL does)
    FLOPs = 6·N·Σ tokens + 12·L·a·d·Σ s²

Counted for the dense decoders whose ``model_type`` is in :data:`DENSE_DECODER_TYPES` (Llama, Qwen2/2.5/3,
Mistral); for any other type the estimate is 0 and a warning is logged once (as veRL does). Norms, rotary
embeddings and biases are left out (under 0.1% of the total).

Promised FLOP/s: the dense bf16 peak of the accelerator named in ``torch.cuda.get_device_name()`` (table
:data:`PEAK_TFLOPS`), or, on a CPU device, 0.448 TFLOP/s — the figure veRL states for CPUs; it is a nominal
number, not a measurement, so MFU on CPU only compares runs on the same machine. ``VERL_PEAK_TFLOPS`` in the
environment overrides either. Both values are in TFLOP/s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["DENSE_DECODER_TYPES", "PEAK_TFLOPS", "FlopsCounter", "dense_decoder_flops", "get_device_flops"]

logger = logging.getLogger(__name__)

DENSE_DECODER_TYPES = ("llama", "qwen2", "qwen3", "mistral")

# Dense bf16 tensor-core peak, TFLOP/s (vendor data sheets; the longest matching name wins).
PEAK_TFLOPS: dict[str, float] = {
    "H100": 989.0,
    "H800": 989.0,
    "H200": 989.0,
    "H20": 148.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "A40": 149.7,
    "B200": 2250.0,
    "MI300X": 1307.0,
}
CPU_PEAK_TFLOPS = 0.448


def get_device_flops(device_name: str | None = None) -> float:
    """The promised peak of this rank's device (or of ``device_name``), in TFLOP/s; ``inf`` for an unknown
    accelerator (MFU then reads 0)."""
    override = os.environ.get("VERL_PEAK_TFLOPS")
    if override:
        return float(override)
    if device_name is None:
        from verl.utils.device import get_device_name

        if get_device_name() == "cpu":
            return CPU_PEAK_TFLOPS
        import torch

        device_name = torch.cuda.get_device_name() if get_device_name() == "cuda" else get_device_name()
    if device_name.upper() == "CPU":
        return CPU_PEAK_TFLOPS
    matches = [name for name in PEAK_TFLOPS if name in device_name]
    if not matches:
        logger.warning("no peak FLOP/s known for device %r: MFU will read 0 (set VERL_PEAK_TFLOPS)", device_name)
        return float("inf")
    return PEAK_TFLOPS[max(matches, key=len)]


def dense_decoder_flops(config: Any, batch_seqlens: Sequence[int]) -> float:
    """FLOPs of one forward + backward pass of a dense decoder over sequences of the given lengths (see the module
    docstring for the count)."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    layers = config.num_hidden_layers
    attention = hidden * (heads * head_dim + 2 * kv_heads * head_dim) + heads * head_dim * hidden
    mlp = 3 * hidden * config.intermediate_size
    params = layers * (attention + mlp) + 2 * config.vocab_size * hidden
    tokens = sum(batch_seqlens)
    squares = sum(s * s for s in batch_seqlens)
    return 6.0 * params * tokens + 12.0 * layers * heads * head_dim * squares


class FlopsCounter:
    """Achieved and promised TFLOP/s of training passes (veRL's ``FlopsCounter``).

    Args:
        config: the model's Hugging Face config.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.supported = getattr(config, "model_type", None) in DENSE_DECODER_TYPES
        if not self.supported:
            logger.warning(
                "FlopsCounter counts %s only, not model_type=%r: its MFU will read 0",
                list(DENSE_DECODER_TYPES),
                getattr(config, "model_type", None),
            )

    def estimate_flops(self, batch_seqlens: Sequence[int], delta_time: float, **kwargs: Any) -> tuple[float, float]:
        """``(achieved, promised)`` TFLOP/s: the FLOPs of a forward + backward pass over sequences of
        ``batch_seqlens`` valid tokens done in ``delta_time`` seconds, and the device's peak."""
        estimated = 0.0
        if self.supported and delta_time > 0:
            estimated = dense_decoder_flops(self.config, [int(s) for s in batch_seqlens]) / delta_time / 1e12
        return estimated, get_device_flops()
