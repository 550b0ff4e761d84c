"""Loading a Hugging Face model folder as a policy (causal LM) or a value model (LM backbone + scalar head)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["FORWARD_ONLY_ROLES", "ROLES", "VALUE_MODEL_ROLES", "decoder_layer_classes", "load_hf_model"]

logger = logging.getLogger(__name__)

# Roles an engine can serve; the value-model roles load a token-classification head with one label.
ROLES = ("actor", "ref", "critic", "reward_model")
VALUE_MODEL_ROLES = ("critic", "reward_model")
# Roles that never train: their engines build no optimizer whatever fsdp_config.forward_only says.
FORWARD_ONLY_ROLES = ("ref", "reward_model")


def load_hf_model(
    model_path: str,
    *,
    value_model: bool,
    dtype: torch.dtype,
    seed: int,
    trust_remote_code: bool = False,
    override_config: Mapping[str, Any] | None = None,
    attn_implementation: str | None = None,
) -> torch.nn.Module:
    """Load ``model_path`` on the host in ``dtype``.

    A value model is ``AutoModelForTokenClassification`` with ``num_labels=1`` and no dropout on the head: its output
    ``logits`` have shape (B, T, 1). When the folder holds a causal LM the head is missing from the checkpoint and is
    initialized from ``seed``, so every rank (and every run) starts from the same head. The process-global RNG is
    left untouched.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    config_file = os.path.join(model_path, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"no Hugging Face model at {model_path!r}: {config_file} does not exist")
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    if value_model:
        config.num_labels = 1
        config.classifier_dropout = 0.0
    model_cls = AutoModelForTokenClassification if value_model else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"config": config, "dtype": dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls.from_pretrained(model_path, **kwargs)
    logger.info("loaded %s from %s in %s", type(model).__name__, model_path, dtype)
    return model


def decoder_layer_classes(model: torch.nn.Module, wrap_policy: Mapping[str, Any]) -> set[str]:
    """Class names of the blocks that get their own FSDP unit.

    ``wrap_policy.transformer_layer_cls_to_wrap`` (or its other name ``layer_class``) when given, else the model's
    ``_no_split_modules`` (the decoder layer classes of a transformers model); empty when ``wrap_policy.disable`` is
    true.
    """
    if wrap_policy.get("disable", False):
        return set()
    names = wrap_policy.get("transformer_layer_cls_to_wrap")
    if names is None:
        names = wrap_policy.get("layer_class")
    if names is None:
        names = getattr(model, "_no_split_modules", None) or ()
    if isinstance(names, str):
        names = [names]
    return set(names)
