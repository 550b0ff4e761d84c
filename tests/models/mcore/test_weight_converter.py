"""The HF ↔ Megatron weight converter is exact both ways, for every tensor × pipeline layout: Qwen2 (q/k/v bias),
Llama with tied embeddings (the last stage's output layer is a copy of the embedding), a value model's head.
Pure tensors: no megatron-core needed (the engine test loads these shards into real Megatron models)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from verl.models.mcore.weight_converter import hf_to_mcore, layout_of, mcore_to_hf

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4)


def _models():
    torch.manual_seed(0)
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**SMALL, num_key_value_heads=2, tie_word_embeddings=False))
    llama = LlamaForCausalLM(LlamaConfig(**SMALL, num_key_value_heads=2, tie_word_embeddings=True))
    value = Qwen2ForTokenClassification(Qwen2Config(**SMALL, num_key_value_heads=2, num_labels=1))
    return [("qwen2", qwen2, False), ("llama_tied", llama, False), ("qwen2_value", value, True)]


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2), (2, 4)])
def test_round_trip_is_exact(tp, pp):
    for name, model, value in _models():
        state = {
            k: v
            for k, v in model.state_dict().items()
            if not (model.config.tie_word_embeddings and k == "lm_head.weight")
        }
        layout = layout_of(model.config, tp, pp, value_model=value)
        back = {}
        for stage in range(pp):
            shards = [hf_to_mcore(state.__getitem__, layout, t, stage) for t in range(tp)]
            if stage == pp - 1 and layout.tie_word_embeddings and pp > 1:  # Megatron's copy on the last stage
                assert torch.equal(
                    torch.cat([s["output_layer.weight"] for s in shards]), state["model.embed_tokens.weight"]
                )
            back.update(mcore_to_hf(shards, layout, stage))
        assert back.keys() == state.keys(), name
        assert all(torch.equal(back[k], state[k]) for k in state), name


def test_a_layout_that_does_not_split_is_named():
    config = LlamaConfig(**SMALL, num_key_value_heads=1)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2 must divide the model's num_key_value_heads"):
        layout_of(config, tp_size=2)
    with pytest.raises(ValueError, match="pipeline_model_parallel_size=3 must divide num_hidden_layers"):
        layout_of(config, pp_size=3)
