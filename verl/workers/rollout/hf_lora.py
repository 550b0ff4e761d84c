"""LoRA adapters in the hf rollout engine, without peft's per-call machinery.

The engine decodes a few tokens per request per step, so the cost of an adapter is its per-call overhead, not its
arithmetic: peft's ``lora.Linear`` checks its adapters, casts, and allocates three output-sized temporaries per call
(``B(A x)``, the scaling, the sum). Here each adapted ``nn.Linear`` becomes a :class:`LoraLinear` that computes
``W x + b`` and adds ``alpha/r · B (A x)`` in place with one ``addmm_``. The adapted modules are exactly those
peft picks for the same ``LoraSpec`` (``adapted_modules``: a meta-device copy of the model), and the tensors are
exposed under the sync names of ``verl.workers.engine.lora`` (``<module>.weight`` for the base, peft's file names for
A and B), so a weight push fills them by name; the engine's log-probs equal the trainer's up to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verl.workers.config.lora import LoraSpec

__all__ = ["LoraLinear", "attach_lora"]

_PEFT_PREFIX = "base_model.model."


class LoraLinear(torch.nn.Module):
    """``base(x) + scaling · B (A x)``: a frozen ``nn.Linear`` with a LoRA adapter (inference only)."""

    def __init__(self, base: torch.nn.Linear, rank: int, scaling: float) -> None:
        super().__init__()
        self.base = base
        self.scaling = scaling
        factory = {"dtype": base.weight.dtype, "device": base.weight.device}
        self.lora_A = torch.nn.Parameter(torch.zeros(rank, base.in_features, **factory), requires_grad=False)
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank, **factory), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.base.weight, self.base.bias)
        flat_x, flat_out = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
        flat_out.addmm_(flat_x @ self.lora_A.t(), self.lora_B.t(), alpha=self.scaling)
        return out


def attach_lora(model: torch.nn.Module, spec: LoraSpec) -> dict[str, torch.Tensor]:
    """Replace ``model``'s adapted linears with :class:`LoraLinear` (A = B = 0: the model is unchanged) and return
    its tensors by sync name (tied weights under each of their names, as one object)."""
    from verl.workers.engine.lora import adapted_modules

    adapted = adapted_modules(model.config, spec)
    for path in adapted:
        parent_path, _, child = path.rpartition(".")
        parent = model.get_submodule(parent_path)
        base = getattr(parent, child)
        if not isinstance(base, torch.nn.Linear):
            raise ValueError(f"LoRA target {path} is a {type(base).__name__}, not a linear layer")
        setattr(parent, child, LoraLinear(base, spec.rank, spec.scaling))
    named: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        head, _, leaf = key.rpartition(".")
        if head in adapted:  # <module>.lora_A → peft's file name
            named[f"{_PEFT_PREFIX}{head}.{leaf}.weight"] = tensor
        elif head.endswith(".base") and head[: -len(".base")] in adapted:  # <module>.base.weight → <module>.weight
            named[f"{head[: -len('.base')]}.{leaf}"] = tensor
        else:
            named[key] = tensor
    return named
