"""The ``huggingface/`` folder of a checkpoint: the model's config always, the tokenizer only when there is one."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

from verl.workers.engine.hf_folder import save_hf_folder


def test_a_model_folder_without_a_tokenizer_saves_none_and_says_so(tiny_model_dir, tmp_path, caplog):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    for file in model.iterdir():  # the tiny model folder may or may not ship tokenizer files: make sure it has none
        if file.name.startswith(("tokenizer", "vocab", "special_tokens", "chat_template")):
            file.unlink()
    with caplog.at_level(logging.WARNING, logger="verl.workers.engine.hf_folder"):
        save_hf_folder(str(tmp_path / "hf"), AutoConfig.from_pretrained(model), tokenizer_path=str(model))
    written = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert written == ["config.json"], written  # not an empty tokenizer built from nothing
    assert f"no tokenizer saved with the checkpoint: {model} has no tokenizer files" in caplog.text


def test_a_model_folder_with_a_tokenizer_saves_it(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    vocab = {"<pad>": 0, "</s>": 1, **{chr(97 + i): 2 + i for i in range(26)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>").save_pretrained(model)
    save_hf_folder(str(tmp_path / "hf"), AutoConfig.from_pretrained(model), tokenizer_path=str(model))
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    saved = AutoTokenizer.from_pretrained(Path(tmp_path / "hf"))  # (a qwen2 config adds its <|endoftext|>)
    assert vocab.items() <= saved.get_vocab().items() and saved.eos_token == "</s>"
