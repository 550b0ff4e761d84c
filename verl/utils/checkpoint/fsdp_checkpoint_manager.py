"""``FSDPCheckpointManager``: veRL's per-role checkpoint object for recipes.

Two kinds of model, two formats:

* A module built by ``ActorRolloutRefWorker._build_model_optimizer`` carries its ``FSDPEngine``; saving and loading
  are that engine's (``FSDPEngine.save_checkpoint`` / ``load_checkpoint``, `verl.workers.engine.checkpoint`), so a
  folder saved here loads into our worker and the other way round::

      <local_path>/.metadata, __<rank>_0.distcp     model + optimizer shards (torch.distributed.checkpoint)
      <local_path>/extra_state.pt, rng_rank_<r>.pt  lr scheduler, world size, random states
      <local_path>/huggingface/                     HF config, processing class, and with "hf_model" the weights

  Here ``save_contents`` entries other than "hf_model" are not selective (a resume needs all three parts).

* Any other module (a recipe's own model, a plain PEFT model) is saved per rank, in veRL's layout: each rank writes
  ``model_world_size_<W>_rank_<r>.pt`` (the module's ``state_dict()`` as it gives it: full tensors for a plain
  module, DTensor shards under FSDP2), ``optim_…`` and ``extra_state_…`` (lr scheduler, random states), as
  ``save_contents`` asks; rank 0 writes ``huggingface/`` (config, generation config, processing class, and the
  model's own code for a ``trust_remote_code`` model) and ``lora_train_meta.json`` for a PEFT model.
  ``verl.model_merger`` reads this layout. With ``checkpoint_config.save_lora_only`` and a PEFT model only the
  adapter weights are written; loading such a file updates the adapters and keeps the base weights.

Rotation (``max_ckpt_to_keep``) is :class:`BaseCheckpointManager`'s: the previous folder is removed only after
the new one is written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import torch
import torch.distributed as dist
from transformers.dynamic_module_utils import custom_object_save

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager, is_peft_adapter_key
from verl.utils.fsdp_utils import engine_of

__all__ = ["FSDPCheckpointManager"]

logger = logging.getLogger(__name__)


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


class FSDPCheckpointManager(BaseCheckpointManager):
    """Save and load one role's model, optimizer, lr scheduler and random states (veRL's signature).

    Args:
        model: a module built by ``_build_model_optimizer`` (saved by its engine) or any other module (saved per
            rank; see the module docstring).
        optimizer, lr_scheduler: for an engine's module, that engine's (or None); others are refused, since the
            engine saves its own.
        processing_class: tokenizer or processor saved into ``huggingface/`` (None: none).
        checkpoint_config: ``actor.checkpoint`` (``save_contents``, ``load_contents``, ``save_lora_only``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        lr_scheduler: Any = None,
        processing_class: Any = None,
        checkpoint_config: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, optimizer, lr_scheduler, processing_class, checkpoint_config)
        self.engine = engine_of(model)
        if self.engine is not None:
            for name, given, owned in (
                ("optimizer", optimizer, self.engine.optimizer),
                ("lr_scheduler", lr_scheduler, self.engine.lr_scheduler),
            ):
                if given is not None and given is not owned:
                    raise ValueError(f"FSDPCheckpointManager: the {name} is not the one built with this model's engine")
        self.save_hf_weights = self.should_save_hf_model

    def _unwrapped(self) -> Any:
        return getattr(self.model, "_fsdp_wrapped_module", self.model)

    def _has_lora(self) -> bool:
        """Whether the (unwrapped) model is a PEFT model (has a ``peft_config``)."""
        return hasattr(self._unwrapped(), "peft_config")

    def _rank_file(self, local_path: str, kind: str) -> str:
        return os.path.join(local_path, f"{kind}_world_size_{self.world_size}_rank_{self.rank}.pt")

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Save under ``local_path`` (every rank together); copy it to ``hdfs_path`` when given (a local path;
        remote ones raise NotImplementedError). ``max_ckpt_to_keep``: see :class:`BaseCheckpointManager`."""
        if local_path is None:
            return
        self.previous_global_step = global_step
        if self.rank == 0:
            self.ensure_checkpoint_capacity(max_ckpt_to_keep)
        if self.engine is not None:
            self.engine.save_checkpoint(local_path, hf_weights=self.save_hf_weights, tokenizer_path=None)
            if self.rank == 0 and self.processing_class is not None:
                self.processing_class.save_pretrained(os.path.join(local_path, "huggingface"))
        else:
            self._save_per_rank(local_path)
        if self.rank == 0 and hdfs_path is not None:
            from verl.utils import hdfs_io

            hdfs_io.makedirs(hdfs_path, exist_ok=True)
            hdfs_io.copy(src=local_path, dst=hdfs_path)
        if self.rank == 0:
            self.register_checkpoint(local_path, max_ckpt_to_keep)
        _barrier()
        logger.info("saved checkpoint of global step %d to %s", global_step, local_path)

    def _model_state_dict(self) -> dict[str, Any]:
        state_dict = self.model.state_dict()
        if not (self.should_save_lora_only and self._has_lora()):
            return state_dict
        adapters = {k: v for k, v in state_dict.items() if is_peft_adapter_key(k)}
        if not adapters:
            raise ValueError(
                f"save_lora_only is True and the model has a peft_config, but none of its {len(state_dict)} "
                f"state dict keys is a LoRA/adapter weight ('lora_' or '.adapter_' in the name)"
            )
        logger.info("LoRA-only save: %d of %d tensors", len(adapters), len(state_dict))
        return adapters

    def _save_per_rank(self, local_path: str) -> None:
        os.makedirs(local_path, exist_ok=True)
        if self.should_save_optimizer and self.optimizer is None:
            raise ValueError("checkpoint save_contents has 'optimizer' but the manager was given no optimizer")
        if self.should_save_model:
            torch.save(self._model_state_dict(), self._rank_file(local_path, "model"))
        if self.should_save_optimizer:
            torch.save(self.optimizer.state_dict(), self._rank_file(local_path, "optim"))
        if self.should_save_extra:
            lr_state = self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None
            extra = {"lr_scheduler": lr_state, "rng": self.get_rng_state()}
            torch.save(extra, self._rank_file(local_path, "extra_state"))
        if self.rank == 0:
            self._save_hf_side_files(local_path)

    def _save_hf_side_files(self, local_path: str) -> None:
        unwrapped = self._unwrapped()
        hf_dir = os.path.join(local_path, "huggingface")
        os.makedirs(hf_dir, exist_ok=True)
        config = getattr(unwrapped, "config", None)
        if config is not None:
            source = getattr(config, "name_or_path", None)
            if source and callable(getattr(unwrapped, "can_generate", None)) and unwrapped.can_generate():
                from transformers import GenerationConfig

                try:
                    GenerationConfig.from_pretrained(source).save_pretrained(hf_dir)
                except OSError:
                    logger.info("no generation config found at %s; none saved", source)
            auto_map = getattr(config, "auto_map", None)
            if isinstance(auto_map, dict) and None in auto_map:
                config.auto_map = {k: v for k, v in auto_map.items() if k is not None}
            config.save_pretrained(hf_dir)
            if getattr(config, "auto_map", None):
                # custom_object_save copies the source file of type(obj): the model's class, not PEFT's wrapper
                base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
                custom_object_save(base, hf_dir, config=config)
        if self.processing_class is not None:
            self.processing_class.save_pretrained(hf_dir)
        meta = self._lora_train_meta()
        if meta is not None:
            with open(os.path.join(local_path, "lora_train_meta.json"), "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=4)

    def _lora_train_meta(self) -> dict[str, Any] | None:
        peft_config = getattr(self._unwrapped(), "peft_config", None)
        if isinstance(peft_config, dict):
            peft_config = peft_config.get("default") or next(iter(peft_config.values()), None)
        rank = int(getattr(peft_config, "r", 0) or 0)
        if rank <= 0:
            return None
        task_type = getattr(peft_config, "task_type", None) or "CAUSAL_LM"
        task_type = getattr(task_type, "value", task_type)
        alpha = int(getattr(peft_config, "lora_alpha", rank) or 0)
        return {"r": rank, "lora_alpha": alpha, "task_type": str(task_type)}

    def load_checkpoint(
        self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        """Load what :meth:`save_checkpoint` (or our worker's ``save_checkpoint``) wrote; None does nothing.
        ``del_local_after_load`` removes the folder once every rank has loaded it."""
        if local_path is None:
            return
        if self.engine is not None:
            self.engine.load_checkpoint(local_path)
        else:
            self._load_per_rank(local_path)
        if del_local_after_load:
            _barrier()
            if self.rank == 0:
                shutil.rmtree(local_path, ignore_errors=True)
        _barrier()

    def _load_file(self, local_path: str, kind: str) -> Any:
        path = self._rank_file(local_path, kind)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"checkpoint file {path} is missing (saved with another world size, or without '{kind}'?)"
            )
        return torch.load(path, map_location="cpu", weights_only=False)

    def _load_per_rank(self, local_path: str) -> None:
        if self.should_load_model:
            state_dict = self._load_file(local_path, "model")
            if self.is_lora_only_state_dict(state_dict):
                result = self.model.load_state_dict(state_dict, strict=False)
                if result is not None and result.unexpected_keys:
                    raise ValueError(
                        f"LoRA-only checkpoint {local_path} has keys this model does not: {result.unexpected_keys} "
                        f"(is the model built with the same LoRA adapters?)"
                    )
            else:
                self.model.load_state_dict(state_dict)
        if self.should_load_optimizer and self.optimizer is not None:
            self.optimizer.load_state_dict(self._load_file(local_path, "optim"))
        if self.should_load_extra:
            extra = self._load_file(local_path, "extra_state")
            if "rng" in extra:
                self.load_rng_state(extra["rng"])
            if extra.get("lr_scheduler") is not None and self.lr_scheduler is not None:
                self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
