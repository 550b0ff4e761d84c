"""Build one pipeline stage of a Megatron-Core ``GPTModel`` from a Hugging Face config (Megatron's local layer spec:
the one that needs no Transformer Engine, so the one that runs on CPU), as a causal LM or a value model.

The LM returns logits gathered over the tensor-parallel ranks, (batch, seq, vocab), on the last stage, and the
hidden states, (seq, batch, hidden), elsewhere; a value model's last stage returns (batch, seq, 1).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.models.mcore.config_converter import hf_to_mcore_config, rope_theta

__all__ = ["ValueHead", "build_gpt_stage", "build_transformer_config"]


def build_transformer_config(hf_config: Any, parallel: dict[str, Any], dtype: torch.dtype, overrides: dict) -> Any:
    """Megatron's ``TransformerConfig`` for ``hf_config`` with the ``parallel`` sizes
    (``tensor_model_parallel_size``, ``pipeline_model_parallel_size``, ``sequence_parallel``, ...), ``dtype`` for the
    parameters, and ``overrides`` (``override_transformer_config``) last. On a machine without CUDA the CPU layer's
    flags come before the overrides (`verl.utils.megatron.cpu_layer`)."""
    from megatron.core.transformer import TransformerConfig

    kwargs = hf_to_mcore_config(hf_config)
    kwargs.update(parallel)
    kwargs.update(
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        activation_func=torch.nn.functional.silu,
        bias_dropout_fusion=False,
        # micro-batches of any shape (token-budget micro-batches): pipeline stages exchange each one's shape first;
        # Megatron checks that the MoE token dispatcher allows it even without experts
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",
    )
    if not torch.cuda.is_available():
        from verl.utils.megatron.cpu_layer import cpu_transformer_config_overrides

        kwargs.update(cpu_transformer_config_overrides())
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


class ValueHead(torch.nn.Module):
    """A value model's output layer, (hidden) → 1 with a bias (transformers' ``score`` of a token-classification
    model), replicated on every tensor-parallel rank; it stands where the LM head stands and answers its call
    (``(output, bias)``). Under sequence parallelism the hidden states are first gathered back to the whole
    sequence."""

    def __init__(self, hidden_size: int, sequence_parallel: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None) -> tuple:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden, self.weight, self.bias), None


def build_gpt_stage(
    hf_config: Any, transformer_config: Any, *, pre_process: bool, post_process: bool, value_model: bool = False
) -> torch.nn.Module:
    """This rank's stage of the model (parameters uninitialised where the HF weights will be loaded)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    tie = bool(getattr(hf_config, "tie_word_embeddings", False)) and not value_model
    model = GPTModel(
        config=transformer_config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=False,
        share_embeddings_and_output_weights=tie,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
    )
    if value_model and post_process:
        model.output_layer = ValueHead(
            transformer_config.hidden_size, transformer_config.sequence_parallel, transformer_config.params_dtype
        )
    return model
