"""validate_hf_model_output and BaseModelMerger's save step: a merged folder must hold a config and complete
weights, or the merge fails at once naming what is missing."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

from verl.model_merger.base_model_merger import BaseModelMerger, ModelMergerConfig
from verl.model_merger.output_validation import validate_hf_model_output


def _folder(tmp_path, config='{"model_type": "x"}'):
    tmp_path.mkdir(exist_ok=True)
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    return tmp_path


def test_single_file_or_complete_index_passes(tmp_path):
    single = _folder(tmp_path / "a")
    (single / "model.safetensors").write_text("w")
    validate_hf_model_output(single)
    sharded = _folder(tmp_path / "b")
    (sharded / "sub").mkdir()
    index = {"weight_map": {"x": "s-1.bin", "y": "sub/s-2.bin"}}
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    (sharded / "s-1.bin").write_text("w")
    (sharded / "sub" / "s-2.bin").write_text("w")
    validate_hf_model_output(sharded)


@pytest.mark.parametrize(
    ("config", "index", "message"),
    [
        (None, None, "missing or empty config.json"),
        ("[1]", None, "config.json is not a JSON object"),
        ('{"a": 1}', None, "no complete model weights"),
        ('{"a": 1}', {"weight_map": {}}, "empty or missing weight_map"),
        ('{"a": 1}', {"weight_map": {"x": 3}}, "invalid shard names"),
        ('{"a": 1}', {"weight_map": {"x": "../w.bin"}}, r"unsafe shard paths outside the folder: \['../w.bin'\]"),
        ('{"a": 1}', {"weight_map": {"x": "s1.bin", "y": "s2.bin"}}, r"missing or empty shards: \['s2.bin'\]"),
    ],
)
def test_each_problem_is_named(tmp_path, config, index, message):
    (tmp_path / "s1.bin").write_text("w")
    if index is not None:
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    _folder(tmp_path, config=config)
    with pytest.raises(RuntimeError, match=message):
        validate_hf_model_output(tmp_path)


class _Merger(BaseModelMerger):
    def merge_and_save(self) -> None:
        pass

    def cleanup(self) -> None:
        pass


def _tiny(tmp_path):
    config = Qwen2Config(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, architectures=["Qwen2ForCausalLM"], tie_word_embeddings=True,
    )  # fmt: skip
    source = tmp_path / "source"
    config.save_pretrained(source)
    GenerationConfig(eos_token_id=[3, 4], max_new_tokens=7).save_pretrained(source)
    model = AutoModelForCausalLM.from_config(config)
    cfg = ModelMergerConfig(operation="merge", backend="fsdp", target_dir=str(tmp_path / "out"))
    cfg.hf_model_config_path = str(source)
    return _Merger(cfg), model


def test_save_writes_a_loadable_model_with_the_pretrained_generation_config(tmp_path):
    merger, model = _tiny(tmp_path)
    assert merger.get_transformers_auto_model_class() is AutoModelForCausalLM
    merger.save_hf_model_and_tokenizer({k: v.clone() for k, v in model.state_dict().items()})
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert GenerationConfig.from_pretrained(tmp_path / "out").eos_token_id == [3, 4]


def test_save_refuses_unmerged_lora_weights(tmp_path):
    merger, _ = _tiny(tmp_path)
    with pytest.raises(ValueError, match="merge the LoRA weights"):
        merger.save_hf_model_and_tokenizer({"q.lora_A.weight": torch.zeros(1)})


def test_unknown_architecture_is_refused(tmp_path):
    merger, _ = _tiny(tmp_path)
    merger.model_config.architectures = ["SomethingElse"]
    with pytest.raises(NotImplementedError, match="unknown architecture"):
        merger.get_transformers_auto_model_class()


def test_generation_config_is_copied_and_a_stale_one_removed(tmp_path):
    merger, _ = _tiny(tmp_path)
    target = tmp_path / "t"
    target.mkdir()
    merger.save_generation_config(target)
    assert GenerationConfig.from_pretrained(target).max_new_tokens == 7
    (tmp_path / "source" / "generation_config.json").unlink()
    merger.save_generation_config(target)
    assert not (target / "generation_config.json").exists()
