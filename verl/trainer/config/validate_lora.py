"""The config rules of LoRA (``actor_rollout_ref.model.lora_*``, ``critic.model.lora_*``) that span several keys or
read the disk; the single-key rules live in `verl.workers.config.lora.LoraSpec`."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from omegaconf import OmegaConf

__all__ = ["check_lora"]

logger = logging.getLogger(__name__)

_MODEL = "actor_rollout_ref.model"


def check_lora(config: Any, problems: list[str], check_environment: bool, base: Any = None) -> None:
    """Append a problem for each LoRA rule ``config`` (resolved) breaks. With ``base`` (the default config), warn
    about the reference policy's engine keys, which a LoRA actor does not read (its reference is the actor's own
    engine with the adapters disabled)."""
    model = config.actor_rollout_ref.model
    rank, path = model.get("lora_rank", 0) or 0, model.get("lora_adapter_path")
    ref_engine = OmegaConf.select(config, "actor_rollout_ref.ref.fsdp_config")
    default = OmegaConf.select(base, "actor_rollout_ref.ref.fsdp_config") if base is not None else None
    if rank and ref_engine is not None and default is not None:
        changed = sorted(k for k in ref_engine if k in default and ref_engine[k] != default[k])
        if changed:
            logger.warning(
                "actor_rollout_ref.ref.fsdp_config.{%s} has no effect with model.lora_rank > 0: the reference policy "
                "runs in the actor's engine with its adapters disabled",
                ",".join(changed),
            )
    if rank and OmegaConf.select(config, "actor_rollout_ref.rollout.name") == "sglang":
        problems.append(
            f"{_MODEL}.lora_rank={rank} with actor_rollout_ref.rollout.name='sglang': the SGLang engine does not serve "
            "LoRA adapters in this build; use rollout.name=vllm or hf"
        )
    if path and not rank:
        problems.append(f"{_MODEL}.lora_adapter_path={path!r} needs {_MODEL}.lora_rank > 0 (the adapter's rank)")
    if path and rank and check_environment:
        file = os.path.join(os.path.expanduser(str(path)), "adapter_config.json")
        if not os.path.isfile(file):
            problems.append(f"{_MODEL}.lora_adapter_path={path!r}: {file} does not exist (not a peft adapter folder)")
        else:
            try:
                with open(file) as f:
                    saved = json.load(f).get("r")
            except (OSError, ValueError) as e:
                problems.append(f"{_MODEL}.lora_adapter_path={path!r}: {file} cannot be read ({e})")
            else:
                if saved != rank:
                    problems.append(
                        f"{_MODEL}.lora_adapter_path={path!r} holds a rank-{saved} adapter, but {_MODEL}.lora_rank="
                        f"{rank}: set lora_rank to the adapter's rank"
                    )
