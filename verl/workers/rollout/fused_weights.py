"""Inference engines fuse projections (``qkv_proj``, ``gate_up_proj``); the trainer names them apart."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["unfuse"]


def unfuse(name: str, tensor: torch.Tensor, hf_config: Any) -> list[tuple[str, torch.Tensor]]:
    """An engine's fused parameter (vLLM, SGLang) under Hugging Face names: qkv_proj → q/k/v_proj, gate_up_proj →
    gate/up_proj."""
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
