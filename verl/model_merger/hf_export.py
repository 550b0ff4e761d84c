"""Turning a full state dict with Hugging Face parameter names into a Hugging Face model folder, and comparing one.

Nothing here needs a process group or a DCP checkpoint: the FSDP engine calls ``save_hf_model`` with the full state
dict it gathered on rank 0, and the model merger calls it with the state dict it read from a DCP checkpoint.
"""

from __future__ import annotations

import collections
import fnmatch
import logging
import os
import shutil
from typing import Any

import torch

from verl.model_merger.output_validation import validate_hf_model_output

__all__ = [
    "TOKENIZER_FILE_PATTERNS",
    "build_hf_model",
    "compare_state_dicts",
    "copy_tokenizer_files",
    "describe",
    "load_hf_config",
    "load_reference_state_dict",
    "save_hf_model",
    "state_dict_dtype",
]

logger = logging.getLogger(__name__)

# Files of a model folder that belong to its tokenizer (or processor), copied next to the exported weights.
TOKENIZER_FILE_PATTERNS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.tiktoken",
    "spiece.model",
    "chat_template.json",
    "chat_template.jinja",
    "preprocessor_config.json",
    "processor_config.json",
)
# First name components of the scalar heads that value models put on top of the backbone.
VALUE_HEAD_NAMES = ("score", "classifier", "v_head", "value_head")
_SHOWN_KEYS = 8


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOWN_KEYS])
    return shown + (f" and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else "")


def load_hf_config(config_dir: str, *, is_value_model: bool = False, trust_remote_code: bool = False):
    """The ``AutoConfig`` of ``config_dir``; for a value model with one label (and no dropout on the head)."""
    from transformers import AutoConfig

    config_file = os.path.join(config_dir, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{config_file} does not exist: the model config is needed to build the model")
    config = AutoConfig.from_pretrained(config_dir, trust_remote_code=trust_remote_code)
    if is_value_model:
        config.num_labels = 1
        config.classifier_dropout = 0.0
    return config


def _model_class(is_value_model: bool):
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    return AutoModelForTokenClassification if is_value_model else AutoModelForCausalLM


def state_dict_dtype(state_dict: dict[str, torch.Tensor]) -> torch.dtype:
    """The floating-point dtype holding most elements of ``state_dict`` (float32 when it has none)."""
    counts: collections.Counter[torch.dtype] = collections.Counter()
    for tensor in state_dict.values():
        if tensor.is_floating_point():
            counts[tensor.dtype] += tensor.numel()
    return counts.most_common(1)[0][0] if counts else torch.float32


def _tied_weights(model: torch.nn.Module) -> dict[str, str]:
    """``{tied name: source name}`` of the parameters this model shares (e.g. ``lm_head.weight`` → embeddings)."""
    tied = getattr(model, "all_tied_weights_keys", None)  # transformers >= 5
    if isinstance(tied, dict):
        return dict(tied)
    # older transformers: a list of tied names; the output embedding is tied to the input embedding
    if not getattr(model.config, "tie_word_embeddings", False):
        return {}
    out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
    if out_emb is None or in_emb is None:
        return {}
    names = {id(module): name for name, module in model.named_modules()}
    return {f"{names[id(out_emb)]}.weight": f"{names[id(in_emb)]}.weight"}


def _check_keys(
    expected: dict[str, torch.Tensor], state_dict: dict[str, torch.Tensor], tied: dict[str, str], is_value_model: bool
) -> None:
    """Raise ValueError naming the keys when ``state_dict`` does not fit the model (tied copies may be absent)."""
    missing = [k for k in expected if k not in state_dict and not (k in tied and tied[k] in state_dict)]
    unexpected = [k for k in state_dict if k not in expected]
    if unexpected and not is_value_model:
        heads = [k for k in unexpected if k.split(".", 1)[0] in VALUE_HEAD_NAMES]
        if heads:
            raise ValueError(
                f"the checkpoint holds a value model ({_names(heads)}): merge it with --is-value-model "
                "(is_value_model=True)"
            )
    lm_heads = [k for k in unexpected if k.startswith("lm_head.")]
    if is_value_model and lm_heads:
        raise ValueError(
            f"the checkpoint holds a causal LM ({_names(lm_heads)}), not a value model: merge it without "
            "--is-value-model (is_value_model=False)"
        )
    if missing or unexpected:
        raise ValueError(
            f"the checkpoint does not fit the model of the config: missing keys [{_names(missing)}], unexpected keys "
            f"[{_names(unexpected)}] (is --hf_model_config_path the config of the trained model?)"
        )
    wrong = [
        f"{k} {tuple(state_dict[k].shape)} (model: {tuple(expected[k].shape)})"
        for k in expected
        if k in state_dict and state_dict[k].shape != expected[k].shape
    ]
    if wrong:
        raise ValueError(f"the checkpoint's shapes do not fit the model of the config: {_names(wrong)}")
    for name, source in tied.items():
        if name in state_dict and source in state_dict and not torch.equal(state_dict[name], state_dict[source]):
            raise ValueError(f"the config ties {name} to {source}, but the checkpoint holds different values for them")


def build_hf_model(
    state_dict: dict[str, torch.Tensor],
    config_dir: str,
    *,
    is_value_model: bool = False,
    trust_remote_code: bool = False,
):
    """The Hugging Face model of ``config_dir`` holding ``state_dict`` (HF names, CPU tensors, used without a copy).

    The model is built on the meta device and the tensors are assigned to it, so no random initialization runs; its
    non-persistent buffers (e.g. rotary frequencies) stay on the meta device: the model is for saving and comparing,
    not for running. The config's dtype is set to the state dict's (``state_dict_dtype``). Raises ValueError naming
    the keys when the state dict does not fit the model: a missing or unexpected key, another shape, a value head
    without ``is_value_model`` or the other way round. A tied weight (``lm_head.weight`` of a model with tied
    embeddings) may be absent.
    """
    config = load_hf_config(config_dir, is_value_model=is_value_model, trust_remote_code=trust_remote_code)
    dtype = state_dict_dtype(state_dict)
    with torch.device("meta"):
        model = _model_class(is_value_model).from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
    tied = _tied_weights(model)
    _check_keys(model.state_dict(), state_dict, tied, is_value_model)
    own = {k: v for k, v in state_dict.items() if k not in tied}
    model.load_state_dict(own, strict=False, assign=True)
    if tied:
        model.tie_weights()
    left = [name for name, tensor in model.state_dict().items() if tensor.is_meta]
    if left:
        raise ValueError(f"no value for {_names(left)} after loading the state dict (an unsupported tying scheme?)")
    model.eval()
    return model


def copy_tokenizer_files(source_dir: str, target_dir: str, *, with_code: bool = False) -> list[str]:
    """Copy the tokenizer/processor files of ``source_dir`` (``TOKENIZER_FILE_PATTERNS``; with ``with_code`` also
    its ``*.py`` files, the custom code of a trust_remote_code model) into ``target_dir``; returns their names."""
    if os.path.realpath(source_dir) == os.path.realpath(target_dir):
        return []
    patterns = TOKENIZER_FILE_PATTERNS + (("*.py",) if with_code else ())
    copied = []
    for name in sorted(os.listdir(source_dir)):
        source = os.path.join(source_dir, name)
        if os.path.isfile(source) and any(fnmatch.fnmatch(name, p) for p in patterns):
            if with_code and name.endswith(".py") and os.path.exists(os.path.join(target_dir, name)):
                continue  # save_pretrained already wrote the model's own code
            shutil.copyfile(source, os.path.join(target_dir, name))
            copied.append(name)
    return copied


def save_hf_model(
    state_dict: dict[str, torch.Tensor],
    config_dir: str,
    target_dir: str,
    *,
    is_value_model: bool = False,
    trust_remote_code: bool = False,
) -> str:
    """Write ``state_dict`` (full tensors, Hugging Face names) as a Hugging Face folder at ``target_dir``.

    The model class comes from the ``config.json`` of ``config_dir`` (``AutoModelForCausalLM``, or
    ``AutoModelForTokenClassification`` with one label for a value model); the weights keep their dtype and are
    written with ``save_pretrained`` (safetensors), with the generation config and the tokenizer files of
    ``config_dir`` when it has them. Raises ValueError naming the keys when the state dict does not fit the model
    (see ``build_hf_model``), RuntimeError when the written folder is not complete (``validate_hf_model_output``).
    Returns ``target_dir``.
    """
    model = build_hf_model(state_dict, config_dir, is_value_model=is_value_model, trust_remote_code=trust_remote_code)
    if not is_value_model and os.path.isfile(os.path.join(config_dir, "generation_config.json")):
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(config_dir)
    os.makedirs(target_dir, exist_ok=True)
    model.save_pretrained(target_dir)
    copied = copy_tokenizer_files(config_dir, target_dir, with_code=trust_remote_code)
    validate_hf_model_output(target_dir)
    logger.info(
        "saved %s (%d tensors, %s) to %s%s",
        type(model).__name__,
        len(state_dict),
        str(state_dict_dtype(state_dict)).removeprefix("torch."),
        target_dir,
        f" with {', '.join(copied)}" if copied else "",
    )
    return target_dir


def load_reference_state_dict(
    hf_dir: str, *, is_value_model: bool = False, trust_remote_code: bool = False
) -> dict[str, torch.Tensor]:
    """The state dict of the Hugging Face folder ``hf_dir`` as ``from_pretrained`` loads it (stored dtype, tied
    weights included). Raises ValueError naming the keys the folder lacks or has in excess."""
    config = load_hf_config(hf_dir, is_value_model=is_value_model, trust_remote_code=trust_remote_code)
    model, info = _model_class(is_value_model).from_pretrained(
        hf_dir, config=config, dtype="auto", trust_remote_code=trust_remote_code, output_loading_info=True
    )
    missing, unexpected = (sorted(str(k) for k in info.get(kind, ())) for kind in ("missing_keys", "unexpected_keys"))
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    if missing or unexpected or mismatched:
        kind = "value model (is_value_model=True)" if is_value_model else "causal LM (is_value_model=False)"
        raise ValueError(
            f"the reference folder {hf_dir} does not hold a {kind}: missing keys [{_names(missing)}], unexpected "
            f"keys [{_names(unexpected)}]" + (f", other shapes [{_names(mismatched)}]" if mismatched else "")
        )
    return model.state_dict()


def compare_state_dicts(
    merged: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], atol: float = 0.0
) -> list[str]:
    """Differences between two state dicts, one line per tensor (merged order, then keys only in ``reference``):
    a missing name, another shape or dtype, or values further apart than ``atol`` (0: bitwise equal)."""
    problems: list[str] = []
    for name, tensor in merged.items():
        if name not in reference:
            problems.append(f"{name}: not in the reference")
            continue
        ref = reference[name]
        if tensor.shape != ref.shape:
            problems.append(f"{name}: shape {tuple(tensor.shape)} != reference {tuple(ref.shape)}")
        elif tensor.dtype != ref.dtype:
            problems.append(f"{name}: dtype {tensor.dtype} != reference {ref.dtype}")
        elif atol == 0.0:
            if not torch.equal(tensor, ref):
                diff = (tensor.double() - ref.double()).abs().max().item()
                problems.append(f"{name}: values differ (max abs diff {diff:.3g}, atol 0)")
        elif tensor.numel():
            diff = (tensor.double() - ref.double()).abs().max().item()
            if not diff <= atol:  # NaN counts as a difference
                problems.append(f"{name}: values differ (max abs diff {diff:.3g} > atol {atol:g})")
    problems.extend(f"{name}: only in the reference" for name in reference if name not in merged)
    return problems


def describe(state_dict: dict[str, Any]) -> str:
    """``"<n> tensors, <dtype>"`` for log and result lines."""
    return f"{len(state_dict)} tensors, {str(state_dict_dtype(state_dict)).removeprefix('torch.')}"
