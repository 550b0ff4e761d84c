"""Utilities shared across verl.

veRL exposes a few helpers at ``verl.utils`` itself; they are imported on first access so that importing any
``verl.utils.*`` module stays light (no torch / transformers / omegaconf at package import).
"""

__all__ = ["as_torch_index", "group_mean_std", "hf_processor", "hf_tokenizer", "omega_conf_to_dataclass"]

_LAZY = {
    "as_torch_index": "verl.utils.torch_functional",
    "group_mean_std": "verl.utils.torch_functional",
    "hf_processor": "verl.utils.tokenizer",
    "hf_tokenizer": "verl.utils.tokenizer",
    "omega_conf_to_dataclass": "verl.base_config",
}


def __getattr__(name: str):
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value
