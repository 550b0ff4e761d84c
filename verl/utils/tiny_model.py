"""Tiny transformers models built offline from a config, with a deterministic initialization.

Used by tests and benchmarks (and the out-of-the-box demo): no hub download is ever needed. The default shape
(hidden 128, 4 heads → head_dim 32) is the smallest that vLLM's CPU attention backend also accepts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch

__all__ = ["build_tiny_qwen2", "save_tiny_qwen2", "tiny_qwen2_config"]


def tiny_qwen2_config(**overrides: Any):
    """A small ``Qwen2Config`` (vocab 256, hidden 128, 2 layers, 4 heads, 2 kv heads); keywords override fields."""
    from transformers import Qwen2Config

    fields: dict[str, Any] = {
        "vocab_size": 256,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }
    fields.update(overrides)
    return Qwen2Config(**fields)


def build_tiny_qwen2(seed: int = 0, value_head: bool = False, **overrides: Any) -> torch.nn.Module:
    """A randomly initialized tiny Qwen2 (float32), identical for the same ``seed`` and config, without touching
    the process-global RNG. ``value_head=True`` builds a token-classification model with one label (a critic)."""
    from transformers import Qwen2ForCausalLM, Qwen2ForTokenClassification

    config = tiny_qwen2_config(**overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if value_head:
            config.num_labels = 1
            config.classifier_dropout = 0.0  # a value head must be deterministic in train mode
            return Qwen2ForTokenClassification(config)
        return Qwen2ForCausalLM(config)


def save_tiny_qwen2(path: str | os.PathLike, seed: int = 0, **overrides: Any) -> str:
    """Write a tiny Qwen2 as a HF folder at ``path`` (atomically: a temp dir renamed into place). Returns the path.

    If ``path`` already holds a model it is left as it is, so concurrent callers are safe.
    """
    path = os.fspath(path)
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tiny_qwen2-", dir=parent)
    try:
        build_tiny_qwen2(seed=seed, **overrides).save_pretrained(tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another process won the race: its model is identical
            if not os.path.exists(os.path.join(path, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
