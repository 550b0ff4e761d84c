"""The Hugging Face folder inside each engine checkpoint (``<checkpoint>/huggingface``): the model config and the
tokenizer always, the full weights on request (``checkpoint.save_contents`` with ``hf_model``). On load, its config
tells whether the checkpoint belongs to the model being trained."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

__all__ = ["HF_FOLDER", "IDENTITY_KEYS", "check_same_model", "save_hf_folder"]

logger = logging.getLogger(__name__)

HF_FOLDER = "huggingface"
# Config fields that change the parameters' names or shapes: a checkpoint of another model differs in one of them.
IDENTITY_KEYS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "num_labels",
    "tie_word_embeddings",
)


# what a tokenizer folder holds (one of them at least); transformers builds an empty tokenizer from a folder with none
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def _has_tokenizer_files(path: str) -> bool:
    """A local folder holds a tokenizer file; a hub name is left for transformers to resolve."""
    if not os.path.isdir(path):
        return True
    return any(os.path.exists(os.path.join(path, name)) for name in TOKENIZER_FILES)


def save_hf_folder(
    folder: str,
    model_config: Any,
    tokenizer_path: str | None = None,
    full_state: dict[str, torch.Tensor] | None = None,
    is_value_model: bool = False,
) -> None:
    """Write ``model_config`` (and the tokenizer found at ``tokenizer_path``, and the weights ``full_state``) to
    ``folder``. Call it on one rank."""
    os.makedirs(folder, exist_ok=True)
    model_config.save_pretrained(folder)
    if tokenizer_path and not _has_tokenizer_files(tokenizer_path):
        logger.warning("no tokenizer saved with the checkpoint: %s has no tokenizer files", tokenizer_path)
    elif tokenizer_path:
        from transformers import AutoTokenizer

        try:
            AutoTokenizer.from_pretrained(tokenizer_path).save_pretrained(folder)
        except (OSError, ValueError) as e:  # a model folder without a tokenizer is legal
            logger.warning("no tokenizer saved with the checkpoint: %s has none (%s)", tokenizer_path, e)
    if full_state is not None:
        from verl.model_merger import save_hf_model

        save_hf_model(full_state, folder, folder, is_value_model=is_value_model)


def check_same_model(folder: str, model_config: Any) -> None:
    """Raise ValueError when the checkpoint's ``config.json`` describes another model than ``model_config`` (a
    resume with another ``model.path``), naming the first differing field; FileNotFoundError naming the file when
    the checkpoint has no config."""
    file = os.path.join(folder, "config.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"checkpoint file {file} is missing (an incomplete or foreign checkpoint?)")
    from transformers import AutoConfig

    saved = AutoConfig.from_pretrained(folder)
    for key in IDENTITY_KEYS:
        ours, theirs = getattr(model_config, key, None), getattr(saved, key, None)
        if ours != theirs:
            raise ValueError(
                f"the checkpoint {os.path.dirname(folder)} is of another model: its {key}={theirs!r}, this run's "
                f"model has {key}={ours!r} (resuming with a different actor_rollout_ref.model.path / critic.model.path"
                "? start a new run or point trainer.default_local_dir elsewhere)"
            )
