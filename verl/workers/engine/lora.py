"""LoRA adapters on a Hugging Face model (peft), and the names and merges that move them around.

An engine with LoRA wraps its model with peft (``get_peft_model``, or a saved adapter folder): the base weights are
frozen, the ``lora_A`` / ``lora_B`` matrices (and, for a value model, its scalar head) train. The wrapped model's
state-dict keys (``base_model.model.<path>.base_layer.weight``, ``...lora_A.default.weight``) are mapped to two
public naming schemes:

* **sync names** — what a weight push carries and a rollout engine with the same adapters holds: base weights under
  their Hugging Face names (``model.layers.0.self_attn.q_proj.weight``), adapter weights under the names of peft's
  saved adapter file (``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``);
* **merged Hugging Face names** — an export: each adapted weight becomes ``W + (alpha / r) · B @ A`` under its plain
  name, so the folder loads as an ordinary model.

A saved adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``) is peft's format; vLLM and peft load
it as it is.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from verl.utils.checkpoint.checkpoint_manager import is_peft_adapter_key
from verl.workers.config.lora import LoraSpec

__all__ = [
    "ADAPTER_CONFIG_FILE",
    "adapted_modules",
    "ADAPTER_FOLDER",
    "ADAPTER_WEIGHTS_FILE",
    "LoraSpec",
    "apply_lora",
    "is_adapter_name",
    "lora_module_names",
    "merge_lora_stream",
    "merged_state_dict",
    "read_adapter_config",
    "save_adapter_folder",
    "sync_name",
]

logger = logging.getLogger(__name__)

# veRL's sub-folder of an engine checkpoint holding the adapters in peft's format.
ADAPTER_FOLDER = "lora_adapter"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
# the value heads a token-classification model adds (trained in full beside the adapters)
_VALUE_HEADS = ("score", "classifier")


def _with_heads_excluded(exclude: Any, heads: list[str]) -> Any:
    """``exclude_modules`` plus the value heads (they train in full, not through an adapter)."""
    if not heads:
        return exclude
    if exclude is None:
        return heads
    if isinstance(exclude, str):  # a regex over module names (peft's rule)
        return "|".join([f"(?:{exclude})", *(rf"(?:(?:.*\.)?{h})" for h in heads)])
    return [*exclude, *heads]


def apply_lora(model: torch.nn.Module, spec: LoraSpec, *, value_model: bool = False, seed: int = 0) -> torch.nn.Module:
    """``model`` wrapped with LoRA adapters: a fresh adapter (B = 0, so the model is unchanged; A drawn from
    ``seed``, the same on every rank and in every run) or the one saved at ``spec.adapter_path``. Only the adapters
    (and a value model's head) require gradients. Raises ValueError when the saved adapter's rank differs from
    ``spec.rank`` or LoRA would land on a layer other than a linear one."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    heads = [h for h in _VALUE_HEADS if value_model and isinstance(getattr(model, h, None), torch.nn.Module)]
    if spec.adapter_path:
        saved = read_adapter_config(spec.adapter_path)
        if int(saved.get("r", -1)) != spec.rank:
            raise ValueError(
                f"lora_adapter_path={spec.adapter_path!r} holds a rank-{saved.get('r')} adapter, but lora_rank="
                f"{spec.rank}: set lora_rank to the adapter's rank"
            )
        peft_model = PeftModel.from_pretrained(model, spec.adapter_path, is_trainable=True)
        logger.info("LoRA: loaded the adapter at %s (rank %d)", spec.adapter_path, spec.rank)
    else:
        config = LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,
            target_modules=spec.target_modules,
            exclude_modules=_with_heads_excluded(spec.exclude_modules, heads),
            modules_to_save=heads or None,
            lora_dropout=0.0,
            bias="none",
            task_type="TOKEN_CLS" if value_model else "CAUSAL_LM",
        )
        with torch.random.fork_rng(devices=[]):  # the process-global RNG is left untouched
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, config)
    layers = {name: m for name, m in peft_model.named_modules() if isinstance(m, LoraLayer)}
    if not layers:
        raise ValueError(f"LoRA target_modules={spec.target_modules!r} matched no module of the model")
    other = [name for name, m in layers.items() if not isinstance(m, LoraLinear)]
    if other:
        raise ValueError(
            f"LoRA on {other[:3]} (not linear layers) is not supported: their adapters cannot be merged or pushed "
            "by name here; restrict target_modules / exclude_modules to linear layers"
        )
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in peft_model.parameters())
    logger.info("LoRA rank %d on %d layers: %d of %d parameters train", spec.rank, len(layers), trainable, total)
    return peft_model


def adapted_modules(hf_config: Any, spec: LoraSpec) -> set[str]:
    """The Hugging Face module paths peft adapts for ``spec`` in a causal LM of ``hf_config`` (decided on a
    meta-device model: no memory, no weights read). Rollout engines carry adapters on exactly these."""
    from transformers import AutoModelForCausalLM

    fresh = LoraSpec(spec.rank, spec.alpha, spec.target_modules, spec.exclude_modules)  # no folder to read
    with torch.device("meta"):
        meta = apply_lora(AutoModelForCausalLM.from_config(hf_config), fresh)
    return lora_module_names(meta.state_dict())


def is_adapter_name(name: str) -> bool:
    """True for an adapter tensor's sync name (``...lora_A.weight`` / ``...lora_B.weight``)."""
    return ".lora_A." in name or ".lora_B." in name


def sync_name(key: str) -> str | None:
    """The sync name of a peft-wrapped model's state-dict key (see the module docstring); a key without peft's
    prefix is returned as is. None for the frozen copy peft keeps of a fully trained module (``original_module``),
    which is never sent."""
    if not key.startswith(_PEFT_PREFIX):
        return key
    if ".original_module." in key:
        return None
    key = key.replace(".modules_to_save.default.", ".")
    if ".lora_A." in key or ".lora_B." in key:
        return key.replace(".default.", ".")
    return key[len(_PEFT_PREFIX) :].replace(".base_layer.", ".")


def normalize_peft_param_name(params: dict[str, Any]) -> dict[str, Any]:
    """veRL's name: a peft-wrapped model's state dict under the base model's names, its adapter tensors dropped
    (``base_model.model.model.layers.0.q_proj.base_layer.weight`` -> ``model.layers.0.q_proj.weight``)."""
    names = ((key.removeprefix(_PEFT_PREFIX).removeprefix("base_model."), value) for key, value in params.items())
    return {name.replace(".base_layer", ""): value for name, value in names if not is_peft_adapter_key(name)}


def lora_module_names(names: Iterable[str]) -> set[str]:
    """The Hugging Face module paths that carry an adapter, from sync names or peft keys."""
    modules = set()
    for name in names:
        for part in (".lora_A.", ".lora_B."):
            if part in name:
                modules.add(name.split(part)[0].removeprefix(_PEFT_PREFIX))
    return modules


def merge_lora_stream(
    named_tensors: Iterable[tuple[str, torch.Tensor]], lora_modules: set[str], scaling: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """Merged Hugging Face ``(name, tensor)`` pairs from a stream of sync-named (or peft-keyed) ones.

    Each adapted linear weight ``<module>.weight`` is yielded once its ``lora_A`` and ``lora_B`` have passed, as
    ``W + scaling · B @ A`` (computed in float32, cast to W's dtype, a new tensor); every other tensor is yielded as
    it comes, renamed. Raises ValueError naming a module whose weight or adapter never came.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    out: list[list[Any]] = []  # [name, tensor or None while its adapters are pending]: yielded in the input's order
    slots: dict[str, list[Any]] = {}
    for key, tensor in named_tensors:
        name = sync_name(key)
        if name is None:
            continue
        module, part = None, None
        if is_adapter_name(name):
            module = name.removeprefix(_PEFT_PREFIX).rsplit(".lora_", 1)[0]
            part = "A" if ".lora_A." in name else "B"
        elif name.endswith(".weight") and name[: -len(".weight")] in lora_modules:
            module, part = name[: -len(".weight")], "W"
        if module is None:
            out.append([name, tensor])
        else:
            parts = pending.setdefault(module, {})
            parts[part] = tensor
            if part == "W":
                slots[module] = [name, None]
                out.append(slots[module])
            if len(parts) == 3:
                del pending[module]
                weight = parts["W"]
                delta = parts["B"].float() @ parts["A"].float()
                slots.pop(module)[1] = (weight.float() + scaling * delta).to(weight.dtype)
        while out and out[0][1] is not None:
            yield tuple(out.pop(0))
    if pending:
        incomplete = {module: sorted(parts) for module, parts in list(pending.items())[:3]}
        raise ValueError(f"LoRA merge: {len(pending)} adapted module(s) lack a part (have: {incomplete})")


def merged_state_dict(state_dict: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A peft-keyed (or sync-named) state dict with its adapters merged: plain Hugging Face names."""
    modules = lora_module_names(state_dict)
    return dict(merge_lora_stream(state_dict.items(), modules, scaling))


def adapter_config(spec: LoraSpec, lora_modules: set[str], base_model_path: str, value_model: bool) -> dict[str, Any]:
    """peft's ``adapter_config.json`` for the trained adapters (target modules listed by their short names, which
    is what peft and vLLM match)."""
    targets = sorted({name.rsplit(".", 1)[-1] for name in lora_modules})
    return {
        "peft_type": "LORA",
        "task_type": "TOKEN_CLS" if value_model else "CAUSAL_LM",
        "base_model_name_or_path": base_model_path,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": targets,
        "modules_to_save": [h for h in _VALUE_HEADS if value_model] or None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "init_lora_weights": True,
    }


def save_adapter_folder(
    folder: str,
    spec: LoraSpec,
    adapters: Mapping[str, torch.Tensor],
    base_model_path: str,
    value_model: bool = False,
) -> str:
    """Write ``adapters`` (sync names) as a peft adapter folder; returns ``folder``."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    modules = lora_module_names(adapters)
    with open(os.path.join(folder, ADAPTER_CONFIG_FILE), "w") as f:
        json.dump(adapter_config(spec, modules, base_model_path, value_model), f, indent=2)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in adapters.items()}
    save_file(tensors, os.path.join(folder, ADAPTER_WEIGHTS_FILE))
    return folder


def read_adapter_config(folder: str) -> dict[str, Any]:
    """The ``adapter_config.json`` of a peft adapter folder; FileNotFoundError / ValueError naming the file."""
    path = os.path.join(folder, ADAPTER_CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist: not a LoRA adapter folder")
    try:
        with open(path) as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if config.get("peft_type", "LORA") != "LORA" or "r" not in config:
        raise ValueError(f"{path} does not describe a LoRA adapter (peft_type={config.get('peft_type')!r})")
    return config
