"""A Hugging Face decoder config → Megatron-Core ``TransformerConfig`` keyword arguments (veRL's
``hf_to_mcore_config``), for the families whose layers Megatron's local GPT layer spec expresses exactly.

Qwen2 and Llama (and Mistral, Qwen3 without its q/k norms is not one of them) are pre-norm decoders with RMSNorm,
SwiGLU, grouped-query attention and RoPE; Qwen2 adds a bias to q, k and v. The result holds every field that
changes the maths; the engine adds the parallel layout and the dtypes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SUPPORTED_MODEL_TYPES", "hf_to_mcore_config", "rope_theta"]

# model_type → whether q, k and v carry a bias
SUPPORTED_MODEL_TYPES = {"qwen2": True, "llama": False, "mistral": False}


def rope_theta(hf_config: Any) -> float:
    """RoPE's base: ``rope_theta``, or ``rope_parameters["rope_theta"]`` (transformers ≥ 5 moved it there)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    theta = theta if theta is not None else getattr(hf_config, "rope_theta", None)
    if theta is None:
        raise ValueError(f"{hf_config.model_type} config has no rope_theta (nor rope_parameters.rope_theta)")
    rope_type = params.get("rope_type", "default") if isinstance(params, dict) else "default"
    if rope_type not in ("default", None):
        raise ValueError(
            f"rope_parameters.rope_type={rope_type!r}: the Megatron engine builds plain RoPE only (no scaling)"
        )
    return float(theta)


def hf_to_mcore_config(hf_config: Any, **overrides: Any) -> dict[str, Any]:
    """``TransformerConfig`` keyword arguments of ``hf_config`` (a transformers ``PretrainedConfig``), updated with
    ``overrides`` (``megatron.override_transformer_config``). Other families are refused by name."""
    model_type = hf_config.model_type
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} has no Megatron converter here; supported: {sorted(SUPPORTED_MODEL_TYPES)}"
        )
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf_config.hidden_act!r}: the Megatron engine builds SwiGLU (silu) MLPs only")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("mlp_bias=true: the Megatron engine builds bias-free MLPs only")
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("use_sliding_window=true: the Megatron engine builds full attention only")
    heads = hf_config.num_attention_heads
    qkv_bias = SUPPORTED_MODEL_TYPES[model_type] or bool(getattr(hf_config, "attention_bias", False))
    kwargs: dict[str, Any] = {
        "num_layers": hf_config.num_hidden_layers,
        "hidden_size": hf_config.hidden_size,
        "ffn_hidden_size": hf_config.intermediate_size,
        "num_attention_heads": heads,
        "num_query_groups": getattr(hf_config, "num_key_value_heads", None) or heads,
        "kv_channels": getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "gated_linear_unit": True,
        "add_bias_linear": False,
        "add_qkv_bias": qkv_bias,
        "attention_dropout": float(getattr(hf_config, "attention_dropout", 0.0) or 0.0),
        "hidden_dropout": 0.0,
        "init_method_std": float(getattr(hf_config, "initializer_range", 0.02)),
    }
    kwargs.update(overrides)
    return kwargs
