"""Hugging Face ↔ Megatron-Core weights of the Qwen2 / Llama families, for any tensor × pipeline layout.

Megatron's ``GPTModel`` with the local layer spec names its parameters::

    embedding.word_embeddings.weight                     (V/tp, H)     vocabulary split over tp ranks
    decoder.layers.{i}.input_layernorm.weight            (H,)
    decoder.layers.{i}.self_attention.linear_qkv.weight  (G/tp·(q+2)·d, H)  per query group g: its q heads, k, v
    decoder.layers.{i}.self_attention.linear_qkv.bias    (G/tp·(q+2)·d,)    (Qwen2)
    decoder.layers.{i}.self_attention.linear_proj.weight (H, N·d/tp)   row-parallel: split on the input dim
    decoder.layers.{i}.pre_mlp_layernorm.weight          (H,)
    decoder.layers.{i}.mlp.linear_fc1.weight             (2·F/tp, H)   this rank's gate rows, then its up rows
    decoder.layers.{i}.mlp.linear_fc2.weight             (H, F/tp)     row-parallel
    decoder.final_layernorm.weight                       (H,)          last pipeline stage
    output_layer.weight                                  (V/tp, H)     last stage, unless tied to the embedding

with G query groups (HF ``num_key_value_heads``), q = N/G query heads per group, d the head size, F the MLP width;
``i`` counts the layers of this pipeline stage (stage s holds layers s·L/pp … (s+1)·L/pp − 1). A value model's
``output_layer`` is its value head, weight (1, H) and bias (1,), HF ``score.*``, not split. With tied embeddings and
several stages the last stage's ``output_layer.weight`` is a copy of the embedding, which :func:`mcore_to_hf` does
not yield twice.

:func:`hf_to_mcore` cuts a rank's shard out of the HF tensors; :func:`mcore_to_hf` puts the full HF tensors back
together from every tensor-parallel rank's shard of one stage. Both are exact (no arithmetic, only slicing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["McoreLayout", "hf_to_mcore", "layout_of", "mcore_to_hf", "stage_layers"]


@dataclass(frozen=True)
class McoreLayout:
    """What the conversion needs of the model and of this rank's place in it.

    Args:
        num_layers, num_attention_heads, num_query_groups, head_dim: the model's shape.
        tp_size, pp_size: the tensor and pipeline parallel sizes.
        qkv_bias: q, k and v carry a bias (Qwen2).
        tie_word_embeddings: the output layer is the embedding (HF ``tie_word_embeddings``; with pipeline stages the
            last one's output layer holds a copy of the embedding, kept equal by Megatron).
        value_model: the output layer is a value head (HF ``score.weight``), not the LM head.
    """

    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    tp_size: int = 1
    pp_size: int = 1
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    value_model: bool = False

    def __post_init__(self) -> None:
        if self.num_query_groups % self.tp_size:
            raise ValueError(
                f"tensor_model_parallel_size={self.tp_size} must divide the model's num_key_value_heads "
                f"({self.num_query_groups}): each rank holds whole query groups"
            )
        if self.num_layers % self.pp_size:
            raise ValueError(
                f"pipeline_model_parallel_size={self.pp_size} must divide num_hidden_layers ({self.num_layers})"
            )


def layout_of(hf_config: Any, tp_size: int = 1, pp_size: int = 1, value_model: bool = False) -> McoreLayout:
    """The `McoreLayout` of a Hugging Face config split ``tp_size`` × ``pp_size`` ways."""
    from verl.models.mcore.config_converter import hf_to_mcore_config

    kwargs = hf_to_mcore_config(hf_config)
    return McoreLayout(
        num_layers=kwargs["num_layers"],
        num_attention_heads=kwargs["num_attention_heads"],
        num_query_groups=kwargs["num_query_groups"],
        head_dim=kwargs["kv_channels"],
        tp_size=tp_size,
        pp_size=pp_size,
        qkv_bias=kwargs["add_qkv_bias"],
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)) and not value_model,
        value_model=value_model,
    )


def stage_layers(layout: McoreLayout, pp_rank: int) -> range:
    """The global indices of the decoder layers pipeline stage ``pp_rank`` holds."""
    per_stage = layout.num_layers // layout.pp_size
    return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)


def _split(tensor: torch.Tensor, dim: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    if tensor.shape[dim] % tp_size:
        raise ValueError(f"a dimension of {tensor.shape[dim]} does not split over {tp_size} tensor-parallel ranks")
    return tensor.chunk(tp_size, dim=dim)[tp_rank].contiguous()


def _qkv_to_mcore(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: McoreLayout) -> torch.Tensor:
    """HF's q, k, v (weights or biases) → Megatron's fused rows, grouped by query group."""
    groups, d = layout.num_query_groups, layout.head_dim
    rest = q.shape[1:]
    per_group = layout.num_attention_heads // groups
    fused = torch.cat(
        [q.reshape(groups, per_group * d, *rest), k.reshape(groups, d, *rest), v.reshape(groups, d, *rest)], dim=1
    )
    return fused.reshape(-1, *rest)


def _qkv_to_hf(fused: torch.Tensor, layout: McoreLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's fused q/k/v rows (all groups) → HF's q, k, v."""
    groups, d = layout.num_query_groups, layout.head_dim
    per_group = layout.num_attention_heads // groups
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_to_mcore(
    get: Callable[[str], torch.Tensor], layout: McoreLayout, tp_rank: int, pp_rank: int
) -> dict[str, torch.Tensor]:
    """This rank's Megatron state dict, reading each HF tensor by name with ``get`` (a dict's ``__getitem__`` or a
    safetensors handle's ``get_tensor``: only the tensors this stage needs are read)."""
    tp = layout.tp_size
    first, last = pp_rank == 0, pp_rank == layout.pp_size - 1
    out: dict[str, torch.Tensor] = {}
    if first:
        out["embedding.word_embeddings.weight"] = _split(get("model.embed_tokens.weight"), 0, tp, tp_rank)
    for local, index in enumerate(stage_layers(layout, pp_rank)):
        hf, mc = f"model.layers.{index}.", f"decoder.layers.{local}."
        attn = hf + "self_attn."
        out[mc + "input_layernorm.weight"] = get(hf + "input_layernorm.weight")
        for kind in ("weight", "bias") if layout.qkv_bias else ("weight",):
            q, k, v = (get(f"{attn}{name}_proj.{kind}") for name in "qkv")
            fused = _qkv_to_mcore(q, k, v, layout)
            out[f"{mc}self_attention.linear_qkv.{kind}"] = _split(fused, 0, tp, tp_rank)
        out[mc + "self_attention.linear_proj.weight"] = _split(get(attn + "o_proj.weight"), 1, tp, tp_rank)
        out[mc + "pre_mlp_layernorm.weight"] = get(hf + "post_attention_layernorm.weight")
        gate = _split(get(hf + "mlp.gate_proj.weight"), 0, tp, tp_rank)
        up = _split(get(hf + "mlp.up_proj.weight"), 0, tp, tp_rank)
        out[mc + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[mc + "mlp.linear_fc2.weight"] = _split(get(hf + "mlp.down_proj.weight"), 1, tp, tp_rank)
    if last:
        out["decoder.final_layernorm.weight"] = get("model.norm.weight")
        if layout.value_model:
            out["output_layer.weight"], out["output_layer.bias"] = get("score.weight"), get("score.bias")
        elif not layout.tie_word_embeddings:
            out["output_layer.weight"] = _split(get("lm_head.weight"), 0, tp, tp_rank)
        elif not first:  # tied, over several stages: the last stage's output layer holds a copy of the embedding
            out["output_layer.weight"] = _split(get("model.embed_tokens.weight"), 0, tp, tp_rank)
    return out


def mcore_to_hf(
    shards: Sequence[Mapping[str, torch.Tensor]], layout: McoreLayout, pp_rank: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """The full HF tensors of pipeline stage ``pp_rank``, from each tensor-parallel rank's Megatron state dict of that
    stage (``shards[tp_rank]``), in HF's order. Entries that are not weights (``_extra_state``) are skipped."""
    if len(shards) != layout.tp_size:
        raise ValueError(f"mcore_to_hf needs {layout.tp_size} tensor-parallel shards, got {len(shards)}")

    def whole(name: str, dim: int) -> torch.Tensor:
        return torch.cat([shard[name] for shard in shards], dim=dim)

    if pp_rank == 0:
        embedding = whole("embedding.word_embeddings.weight", 0)
        yield "model.embed_tokens.weight", embedding
    for local, index in enumerate(stage_layers(layout, pp_rank)):
        hf, mc = f"model.layers.{index}.", f"decoder.layers.{local}."
        attn = hf + "self_attn."
        yield hf + "input_layernorm.weight", shards[0][mc + "input_layernorm.weight"]
        for kind in ("weight", "bias") if layout.qkv_bias else ("weight",):
            name = f"{mc}self_attention.linear_qkv.{kind}"
            q, k, v = _qkv_to_hf(whole(name, 0), layout)
            yield f"{attn}q_proj.{kind}", q
            yield f"{attn}k_proj.{kind}", k
            yield f"{attn}v_proj.{kind}", v
        yield attn + "o_proj.weight", whole(mc + "self_attention.linear_proj.weight", 1)
        yield hf + "post_attention_layernorm.weight", shards[0][mc + "pre_mlp_layernorm.weight"]
        fc1 = [shard[mc + "mlp.linear_fc1.weight"].chunk(2, dim=0) for shard in shards]
        yield hf + "mlp.gate_proj.weight", torch.cat([gate for gate, _ in fc1], dim=0)
        yield hf + "mlp.up_proj.weight", torch.cat([up for _, up in fc1], dim=0)
        yield hf + "mlp.down_proj.weight", whole(mc + "mlp.linear_fc2.weight", 1)
    if pp_rank == layout.pp_size - 1:
        yield "model.norm.weight", shards[0]["decoder.final_layernorm.weight"]
        if layout.value_model:
            yield "score.weight", shards[0]["output_layer.weight"]
            yield "score.bias", shards[0]["output_layer.bias"]
        elif not layout.tie_word_embeddings:
            yield "lm_head.weight", whole("output_layer.weight", 0)
