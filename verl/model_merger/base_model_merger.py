"""veRL's ``BaseModelMerger``: the Hugging Face side of a merge, for a merger class of a recipe's own.

Our ``python -m verl.model_merger`` merges through :func:`verl.model_merger.fsdp.merge_fsdp_checkpoint`, which ends
in :func:`verl.model_merger.hf_export.save_hf_model`; a subclass here reads its checkpoint in ``merge_and_save``
and hands the full state dict (Hugging Face names) to :meth:`BaseModelMerger.save_hf_model_and_tokenizer`. Both
save paths end with :func:`validate_hf_model_output`, so a merge that wrote no complete weights fails at once.

The messages about a missing generation config are printed: this is command-line output of the merger.
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from verl.model_merger.hf_export import _tied_weights, load_hf_config, state_dict_dtype
from verl.model_merger.output_validation import validate_hf_model_output
from verl.utils import hf_processor, hf_tokenizer

__all__ = ["BaseModelMerger", "ModelMergerConfig", "drop_tied_target_keys"]

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"


def drop_tied_target_keys(state_dict: dict[str, torch.Tensor], model: torch.nn.Module, config: Any = None) -> None:
    """Remove from ``state_dict`` (in place) the parameters ``model`` ties to another one (e.g. ``lm_head.weight``
    of a model with tied embeddings): ``save_pretrained`` writes the source once and the model re-ties on load."""
    for name in _tied_weights(model):
        state_dict.pop(name, None)


@dataclass
class ModelMergerConfig:
    """What a merge needs (veRL's field names).

    Args:
        operation: "merge" (write ``target_dir``) or "test" (compare with ``test_hf_dir``).
        backend: the checkpoint's training backend ("fsdp").
        target_dir: the Hugging Face folder to write.
        trust_remote_code: allow the model's own code from ``hf_model_config_path``.
        local_dir: the checkpoint folder to read.
        hf_model_config_path: the folder with the model's ``config.json`` (and tokenizer, generation config).
        test_hf_dir: the reference model folder of a "test" run.
    """

    operation: str
    backend: str
    target_dir: str | None = "tmp"
    trust_remote_code: bool = False
    local_dir: str | None = None
    hf_model_config_path: str | None = None
    test_hf_dir: str | None = None
    is_value_model: bool = False


class BaseModelMerger(ABC):
    """Turns a full state dict into a Hugging Face folder; subclasses read their checkpoint format.

    Attributes:
        config: the :class:`ModelMergerConfig`.
        hf_model_config_path: where the model's config, tokenizer and generation config are read from.
        model_config: the ``AutoConfig`` read from there.
    """

    def __init__(self, config: ModelMergerConfig) -> None:
        self.config = config
        self.hf_model_config_path = config.hf_model_config_path
        self.model_config = load_hf_config(
            self.hf_model_config_path, is_value_model=config.is_value_model, trust_remote_code=config.trust_remote_code
        )

    def get_transformers_auto_model_class(self) -> Any:
        """The ``transformers`` auto class for the config's first architecture (the ``auto_map`` entry naming it
        for a remote-code model); NotImplementedError for an architecture it cannot place."""
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForTokenClassification

        by_name = {
            "AutoModelForCausalLM": AutoModelForCausalLM,
            "AutoModelForTokenClassification": AutoModelForTokenClassification,
            "AutoModelForVision2Seq": AutoModelForImageTextToText,
            "AutoModelForImageTextToText": AutoModelForImageTextToText,
        }
        arch = (getattr(self.model_config, "architectures", None) or [""])[0]
        for auto_name, target in (getattr(self.model_config, "auto_map", None) or {}).items():
            if arch and arch in str(target):
                if auto_name not in by_name:
                    raise NotImplementedError(f"unknown auto class {auto_name} for {arch}")
                return by_name[auto_name]
        for suffix, auto_name in (
            ("ForTokenClassification", "AutoModelForTokenClassification"),
            ("ForCausalLM", "AutoModelForCausalLM"),
            ("ForConditionalGeneration", "AutoModelForImageTextToText"),
        ):
            if suffix in arch:
                return by_name[auto_name]
        raise NotImplementedError(f"unknown architecture {getattr(self.model_config, 'architectures', None)}")

    def load_generation_config(self, warn_if_missing: bool = True) -> Any:
        """The ``GenerationConfig`` saved next to the model config, or None (with a logged warning) when there is
        none. An unreadable file raises (OSError from ``transformers``)."""
        if not os.path.isfile(os.path.join(self.hf_model_config_path, GENERATION_CONFIG_FILE)):
            if warn_if_missing:
                logger.warning(
                    "Generation config file not found in %s; the merged model gets one derived from its model config",
                    self.hf_model_config_path,
                )
            return None
        from transformers import GenerationConfig

        return GenerationConfig.from_pretrained(self.hf_model_config_path)

    def patch_model_generation_config(self, model: Any) -> Any:
        """Give a generating model the pretrained generation config (the one derived from the model config can
        differ, e.g. in its EOS tokens); returns the model."""
        if model.can_generate():
            generation_config = self.load_generation_config()
            if generation_config is not None:
                model.generation_config = generation_config
        return model

    def save_generation_config(self, target_dir: str | os.PathLike) -> None:
        """Copy the pretrained generation config into ``target_dir``; without one, remove a stale copy there. A
        source file that cannot be read raises before anything in ``target_dir`` changes."""
        generation_config = self.load_generation_config(warn_if_missing=False)
        stale = os.path.join(target_dir, GENERATION_CONFIG_FILE)
        if generation_config is not None:
            generation_config.save_pretrained(target_dir)
        elif os.path.isfile(stale):
            os.remove(stale)

    def save_hf_model_and_tokenizer(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Write ``state_dict`` (full tensors, Hugging Face names) with the model config, the pretrained generation
        config and the tokenizer / processor (when the config folder has them) to ``config.target_dir``, then check
        the folder (:func:`validate_hf_model_output`: RuntimeError when no complete weights were written). LoRA
        weights must be merged first (``verl.model_merger.fsdp`` does): a state dict with ``lora_`` keys is
        refused."""
        lora = [k for k in state_dict if "lora_" in k]
        if lora:
            raise ValueError(f"merge the LoRA weights into the base weights before saving; found {lora[:4]}")
        auto_class = self.get_transformers_auto_model_class()
        dtype = state_dict_dtype(state_dict) if state_dict else torch.float32
        trust = self.config.trust_remote_code
        with torch.device("meta"):
            model = auto_class.from_config(self.model_config, dtype=dtype, trust_remote_code=trust)
        model = model.to_empty(device="cpu")
        model = self.patch_model_generation_config(model)
        drop_tied_target_keys(state_dict, model, self.model_config)
        target_dir = self.config.target_dir
        os.makedirs(target_dir, exist_ok=True)
        model.save_pretrained(target_dir, state_dict=state_dict)
        del model
        processor = hf_processor(self.hf_model_config_path, trust_remote_code=trust)
        try:
            tokenizer = hf_tokenizer(self.hf_model_config_path, trust_remote_code=trust)
        except (OSError, ValueError) as e:  # a config folder without tokenizer files
            logger.info("No tokenizer saved: none could be loaded from %s (%s)", self.hf_model_config_path, e)
            tokenizer = None
        for part in (processor, tokenizer):
            if part is not None:
                part.save_pretrained(target_dir)
        validate_hf_model_output(target_dir)

    @abstractmethod
    def merge_and_save(self) -> None:
        """Read the checkpoint of ``config.local_dir`` and save it (``save_hf_model_and_tokenizer``)."""

    @abstractmethod
    def cleanup(self) -> None:
        """Release what the merge held (process groups, temporary files)."""
