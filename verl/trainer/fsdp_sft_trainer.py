"""Supervised fine-tuning (veRL's ``fsdp_sft_trainer``) on the FSDP2 engine.

    python -m verl.trainer.fsdp_sft_trainer data.train_files=... model.partial_pretrain=... [key=value ...]
    torchrun --nproc_per_node=N -m verl.trainer.fsdp_sft_trainer ...

Without torchrun (no ``RANK`` / ``WORLD_SIZE``) the run is one process in a world-size-1 group that meets through a
file in a temporary folder. The config (``config/sft_trainer.yaml``) is validated before any process group starts
(`verl.trainer.config.sft`). Each step trains on one global batch of ``data.train_batch_size`` rows, split evenly
over the ranks and, on each rank, into micro-batches of ``data.micro_batch_size_per_gpu`` rows (gradient
accumulation). The loss is the token-mean cross entropy over the loss-mask tokens of the whole global batch, so it
and its gradient do not depend on the micro-batch size or the number of ranks.

The data order is a fresh seeded shuffle per epoch (``trainer.seed`` + epoch), the same whatever the number of
ranks; a checkpoint records the step, so a resumed run sees exactly the batches an uninterrupted one would.
Checkpoints (``trainer.default_local_dir/global_step_<N>/``): the engine's sharded model, optimizer, lr schedule and
random states, ``huggingface/`` (config, tokenizer, generation config, full weights), ``data.pt`` and
``trainer_state.pt``; saved atomically and tracked by ``latest_checkpointed_iteration.txt`` as the RL trainer's.
Metrics: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/time(s)`` each step, ``val/loss``.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import hydra
import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import Dataset

from verl.trainer.config.sft import (
    build_engine_config,
    build_optim_config,
    sft_settings,
    validate_sft_config,
)
from verl.utils.checkpoint.checkpoint_manager import (
    DATA_FILE,
    TRAINER_STATE_FILE,
    begin_save,
    check_step_folder,
    commit_save,
    find_latest_ckpt_path,
    list_step_folders,
    load_state_file,
    save_state_file,
    step_of,
)
from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
from verl.utils.dataset.sft_dataset import SFTDataset
from verl.utils.device import get_nccl_backend
from verl.utils.distributed import destroy_global_process_group, initialize_global_process_group
from verl.utils.fs import copy_to_local
from verl.utils.model import compute_position_id_with_mask
from verl.workers.config.lora import LoraSpec
from verl.workers.engine import get_engine_class
from verl.workers.engine.hf_folder import HF_FOLDER

__all__ = ["BATCH_KEYS", "EpochOrder", "FSDPSFTTrainer", "create_sft_dataset", "main", "run_sft"]

logger = logging.getLogger(__name__)

BATCH_KEYS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


def create_sft_dataset(data_paths: Any, data_config: Any, tokenizer: Any, max_samples: int = -1) -> Dataset:
    """The dataset of ``data_paths``: ``data.custom_cls`` when set, else `MultiTurnSFTDataset` with
    ``data.multiturn.enable``, else `SFTDataset`. A custom class is built as ``cls(parquet_files=, tokenizer=,
    config=, max_samples=)`` and its items need ``input_ids``, ``attention_mask`` and ``loss_mask``."""
    custom = data_config.get("custom_cls") or {}
    if custom.get("path"):
        from verl.utils.import_utils import load_extern_type

        cls = load_extern_type(custom["path"], custom["name"])
        if not issubclass(cls, Dataset):
            raise TypeError(f"data.custom_cls: {cls.__qualname__} must subclass torch.utils.data.Dataset")
    elif (data_config.get("multiturn") or {}).get("enable", False):
        cls = MultiTurnSFTDataset
    else:
        cls = SFTDataset
    files = [data_paths] if isinstance(data_paths, str) else list(data_paths)
    dataset = cls(parquet_files=files, tokenizer=tokenizer, config=data_config, max_samples=max_samples)
    logger.info("%s: %d rows from %s", cls.__name__, len(dataset), files)
    return dataset


class EpochOrder:
    """Which rows each step trains on: epoch ``e`` is a permutation of the rows drawn from ``seed + e``, cut into
    ``steps_per_epoch`` global batches (the rows left over are skipped that epoch). The same for any world size."""

    def __init__(self, num_rows: int, batch_size: int, seed: int) -> None:
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.steps_per_epoch = num_rows // batch_size
        self._epoch: int | None = None
        self._perm: list[int] = []

    def batch(self, epoch: int, step_in_epoch: int) -> list[int]:
        """The row indices of the global batch ``step_in_epoch`` (0-based) of ``epoch``."""
        if epoch != self._epoch:
            generator = torch.Generator().manual_seed(self.seed + epoch)
            self._perm, self._epoch = torch.randperm(self.num_rows, generator=generator).tolist(), epoch
        start = step_in_epoch * self.batch_size
        return self._perm[start : start + self.batch_size]


def collate(dataset: Dataset, indices: Sequence[int], weights: Sequence[int] | None = None) -> dict[str, torch.Tensor]:
    """Stack the items ``indices`` of ``dataset`` (the four `BATCH_KEYS`; ``position_ids`` computed when an item
    lacks it); rows whose ``weights`` entry is 0 get an all-zero loss mask (padding rows)."""
    items = [dataset[i] for i in indices]
    batch: dict[str, torch.Tensor] = {}
    for key in BATCH_KEYS:
        if key == "position_ids" and key not in items[0]:
            mask = batch["attention_mask"]
            batch[key] = compute_position_id_with_mask(mask)
            continue
        if key not in items[0]:
            raise KeyError(f"{type(dataset).__name__} items have no {key!r} (keys: {sorted(items[0])})")
        batch[key] = torch.stack([torch.as_tensor(item[key]) for item in items])
    if weights is not None:
        batch["loss_mask"] = batch["loss_mask"] * torch.tensor(weights, dtype=batch["loss_mask"].dtype)[:, None]
    return batch


def _trim(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the trailing columns that are padding in every row (right padding)."""
    used = batch["attention_mask"].any(dim=0).nonzero()
    length = int(used.max()) + 1 if used.numel() else 1
    return {k: v[:, :length] for k, v in batch.items()}


class FSDPSFTTrainer:
    """veRL's SFT trainer on `verl.workers.engine.FSDPEngine` (see the module docstring).

    Args:
        config: the composed ``sft_trainer`` config (validated by `run_sft`; call
            `verl.trainer.config.sft.validate_sft_config` first when building the trainer yourself).
        device_mesh / ulysses_device_mesh: veRL's arguments; the engine builds its own mesh
            (``model.fsdp_config.fsdp_size``), so a mesh given here must span all ranks, and the Ulysses mesh (none
            here: sequence parallelism is refused) must be None.
        tokenizer: the tokenizer the datasets used (saved with every checkpoint).
        train_dataset / val_dataset: items with ``input_ids``, ``attention_mask``, ``loss_mask`` (and
            ``position_ids``) of equal length; ``val_dataset`` may be None (no validation).

    Needs the default process group; every rank builds the trainer and calls ``fit`` together.
    """

    def __init__(
        self,
        config: DictConfig,
        device_mesh: Any = None,
        ulysses_device_mesh: Any = None,
        tokenizer: Any = None,
        train_dataset: Dataset | None = None,
        val_dataset: Dataset | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError("FSDPSFTTrainer needs the default process group (see run_sft)")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if device_mesh is not None and device_mesh.size() != self.world_size:
            raise ValueError(f"device_mesh spans {device_mesh.size()} ranks, the run has {self.world_size}")
        if ulysses_device_mesh is not None:
            raise ValueError("ulysses_device_mesh: sequence parallelism is not implemented; pass None")
        if tokenizer is None or train_dataset is None:
            raise ValueError("FSDPSFTTrainer needs a tokenizer and a train_dataset")
        self.config = config
        self.settings = sft_settings(config)
        self.tokenizer = tokenizer
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        s = self.settings
        if s.train_batch_size % self.world_size:
            raise ValueError(f"data.train_batch_size={s.train_batch_size} does not divide over {self.world_size} ranks")
        self.local_batch_size = s.train_batch_size // self.world_size
        self.order = EpochOrder(len(train_dataset), s.train_batch_size, s.seed)
        self.steps_per_epoch = self.order.steps_per_epoch
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"data.train_batch_size={s.train_batch_size} is larger than the {len(train_dataset)} train rows"
            )
        self.total_steps = self.steps_per_epoch * s.total_epochs  # the lr schedule's length, as veRL's
        self.total_training_steps = min(s.total_training_steps or self.total_steps, self.total_steps)
        if s.total_training_steps and s.total_training_steps > self.total_steps:
            logger.warning(
                "trainer.total_training_steps=%d exceeds the %d steps of %d epoch(s): stopping after %d",
                s.total_training_steps,
                self.total_steps,
                s.total_epochs,
                self.total_steps,
            )
        torch.manual_seed(s.seed)
        self.engine = get_engine_class(config.model.strategy)(
            copy_to_local(s.model_path, use_shm=bool(config.model.get("use_shm", False))),
            build_engine_config(config.model, seed=s.seed),
            build_optim_config(config.optim, total_training_steps=self.total_steps),
            role="actor",
            enable_gradient_checkpointing=s.enable_gradient_checkpointing,
            trust_remote_code=s.trust_remote_code,
            lora=LoraSpec.from_config(config.model, key="model"),
        )
        self._use_cache = getattr(_source_config(s.model_path, s.trust_remote_code), "use_cache", None)
        self.resume_global_step = 0
        self.load_checkpoint()
        logger.info(
            "SFT: %d rows, %d steps/epoch, %d training steps, %d rank(s) × %d rows (micro-batches of %d)",
            len(train_dataset),
            self.steps_per_epoch,
            self.total_training_steps,
            self.world_size,
            self.local_batch_size,
            s.micro_batch_size_per_gpu,
        )

    # ------------------------------------------------------------------ one step
    def _micro_batches(self, batch: dict[str, torch.Tensor]) -> Iterator[dict[str, torch.Tensor]]:
        size = self.settings.micro_batch_size_per_gpu
        rows = batch["input_ids"].shape[0]
        for start in range(0, rows, size):
            micro = _trim({k: v[start : start + size] for k, v in batch.items()})
            yield {k: v.to(self.engine.device) for k, v in micro.items()}

    def _token_loss_sum(self, micro: dict[str, torch.Tensor]) -> torch.Tensor:
        """Σ cross entropy over the loss-mask tokens of one micro-batch (token ``t`` predicted from ``t - 1``)."""
        output = self.engine.module(
            input_ids=micro["input_ids"],
            attention_mask=micro["attention_mask"],
            position_ids=micro["position_ids"],
            use_cache=False,
        )
        logits = output.logits[:, :-1].float()
        labels = micro["input_ids"][:, 1:]
        mask = micro["loss_mask"][:, 1:].to(logits.dtype)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        return (ce * mask.reshape(-1)).sum()

    def _all_reduce(self, values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=self.engine.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def training_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One optimizer step on this rank's share of a global batch; returns the step's metrics (same on every
        rank). The gradient is that of Σ token losses / (loss tokens of the global batch)."""
        start = time.perf_counter()
        engine = self.engine
        (tokens,) = self._all_reduce([float(batch["loss_mask"][:, 1:].sum())])
        if tokens == 0:
            logger.warning("this global batch has no loss-mask tokens: the step trains on nothing")
        # FSDP averages the gradients over the ranks; the factor world / tokens makes that the global token mean.
        scale = self.world_size / max(tokens, 1.0)
        loss_sum = 0.0
        with engine.on_device():
            engine.module.train()
            for micro in self._micro_batches(batch):
                token_sum = self._token_loss_sum(micro)
                (token_sum * scale).backward()
                loss_sum += float(token_sum.detach())
            lr = engine.get_lr()
            grad_norm = engine.clip_grad_norm_and_step()
            engine.lr_scheduler_step()
        (loss_sum,) = self._all_reduce([loss_sum])
        return {
            "train/loss": loss_sum / max(tokens, 1.0),
            "train/lr": lr,
            "train/grad_norm": grad_norm,
            "train/time(s)": time.perf_counter() - start,
        }

    def validation_step(self, batch: dict[str, torch.Tensor]) -> tuple[float, float]:
        """``(Σ token losses, loss tokens)`` of this rank's batch, without gradients (not reduced)."""
        loss_sum = tokens = 0.0
        for micro in self._micro_batches(batch):
            loss_sum += float(self._token_loss_sum(micro))
            tokens += float(micro["loss_mask"][:, 1:].sum())
        return loss_sum, tokens

    def validate(self) -> float | None:
        """The token-mean loss over the whole validation set (None without one)."""
        if self.val_dataset is None:
            return None
        n, world = len(self.val_dataset), self.world_size
        per_rank = math.ceil(n / world)
        slots = [self.rank + k * world for k in range(per_rank)]  # equal counts: every rank runs the same forwards
        indices, weights = [i if i < n else 0 for i in slots], [int(i < n) for i in slots]
        loss_sum = tokens = 0.0
        with self.engine.on_device(optimizer=False), self.engine.eval_mode():
            size = self.settings.micro_batch_size_per_gpu
            for start in range(0, per_rank, size):
                batch = collate(self.val_dataset, indices[start : start + size], weights[start : start + size])
                part_sum, part_tokens = self.validation_step(batch)
                loss_sum, tokens = loss_sum + part_sum, tokens + part_tokens
        loss_sum, tokens = self._all_reduce([loss_sum, tokens])
        return loss_sum / max(tokens, 1.0)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, step: int) -> str:
        """Write ``global_step_<step>`` atomically (see the module docstring); returns its path."""
        root = self.settings.default_local_dir
        holder = [begin_save(root, step) if self.rank == 0 else None]
        dist.broadcast_object_list(holder, src=0)
        tmp = holder[0]
        hf_dir = os.path.join(tmp, HF_FOLDER)
        if self.rank == 0:  # read by the weight export, so that huggingface/ has the model's generation config
            source = os.path.join(self.settings.model_path, "generation_config.json")
            os.makedirs(hf_dir, exist_ok=True)
            if os.path.isfile(source):
                shutil.copy(source, hf_dir)
        config, saved_use_cache = self.engine.model_config, getattr(self.engine.model_config, "use_cache", None)
        if self._use_cache is not None:  # gradient checkpointing turned the KV cache off; the exported model keeps it
            config.use_cache = self._use_cache
        try:
            self.engine.save_checkpoint(tmp, hf_weights=True)
        finally:
            config.use_cache = saved_use_cache
        final = os.path.join(root, f"global_step_{step}")
        if self.rank == 0:
            self.tokenizer.save_pretrained(hf_dir)
            epoch, step_in_epoch = divmod(step, self.steps_per_epoch)
            data_state = {
                "epoch": epoch,
                "step_in_epoch": step_in_epoch,
                "seed": self.settings.seed,
                "num_rows": len(self.train_dataset),
                "train_batch_size": self.settings.train_batch_size,
            }
            save_state_file(data_state, os.path.join(tmp, DATA_FILE))
            save_state_file({"global_step": step}, os.path.join(tmp, TRAINER_STATE_FILE))
            final = commit_save(root, step, tmp)
            self._rotate(root)
        dist.barrier()
        return final

    def _rotate(self, root: str) -> None:
        """Keep the newest ``trainer.max_ckpt_to_keep`` step folders (never the one the tracker names)."""
        keep = self.settings.max_ckpt_to_keep
        if keep is None:
            return
        protected = find_latest_ckpt_path(root)
        folders = [folder for _, folder in list_step_folders(root)]
        for folder in folders[: max(0, len(folders) - keep)]:
            if folder != protected:
                shutil.rmtree(folder)
                logger.info("checkpoint rotation removed %s", folder)

    def _determine_resume_path(self) -> str | None:
        s = self.settings
        if s.resume_mode == "disable":
            return None
        if s.resume_from_path:
            return s.resume_from_path
        if s.resume_mode == "resume_path":
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
        return find_latest_ckpt_path(s.default_local_dir)

    def load_checkpoint(self) -> int:
        """Resume per ``trainer.resume_mode``; returns the step resumed from (0: a fresh start)."""
        path = self._determine_resume_path()
        if path is None:
            return 0
        check_step_folder(path, [])
        self.engine.load_checkpoint(path)
        step = int(load_state_file(os.path.join(path, TRAINER_STATE_FILE))["global_step"])
        if step != step_of(path):
            raise ValueError(f"checkpoint {path}: {TRAINER_STATE_FILE} says step {step}")
        data = load_state_file(os.path.join(path, DATA_FILE))
        now = {"num_rows": len(self.train_dataset), "train_batch_size": self.settings.train_batch_size}
        now["seed"] = self.settings.seed
        changed = {k: (data.get(k), v) for k, v in now.items() if data.get(k) != v}
        if changed:
            logger.warning(
                "resuming %s with other data settings (saved, now): %s: the batches differ from an uninterrupted run",
                path,
                changed,
            )
        self.resume_global_step = step
        logger.info("resumed from %s (step %d)", path, step)
        return step

    # ------------------------------------------------------------------ the loop
    def _local_rows(self, epoch: int, step_in_epoch: int) -> list[int]:
        rows = self.order.batch(epoch, step_in_epoch)
        return rows[self.rank * self.local_batch_size : (self.rank + 1) * self.local_batch_size]

    def fit(self) -> None:
        """Train from ``resume_global_step`` to ``total_training_steps``, validating and saving on the way."""
        from verl.utils.tracking import Tracking

        s = self.settings
        tracking = None
        if self.rank == 0:
            resolved = OmegaConf.to_container(self.config, resolve=True)
            tracking = Tracking(s.project_name, s.experiment_name, default_backend=list(s.logger), config=resolved)
        try:
            self._fit(tracking)
        finally:
            if tracking is not None:
                tracking.finish()

    def _fit(self, tracking: Any) -> None:
        s = self.settings
        global_step, last = self.resume_global_step, self.total_training_steps
        if global_step >= last:
            logger.info("nothing to train: resumed at step %d, the run ends at step %d", global_step, last)
            return
        first_epoch = global_step // self.steps_per_epoch
        for epoch in range(first_epoch, s.total_epochs):
            first = global_step % self.steps_per_epoch if epoch == first_epoch else 0
            for step_in_epoch in range(first, self.steps_per_epoch):
                batch = collate(self.train_dataset, self._local_rows(epoch, step_in_epoch))
                metrics = self.training_step(batch)
                global_step += 1
                if tracking is not None:
                    tracking.log(metrics, step=global_step)
                is_last = global_step >= last
                if is_last or (s.test_freq > 0 and global_step % s.test_freq == 0):
                    val_loss = self.validate()
                    if val_loss is not None and tracking is not None:
                        tracking.log({"val/loss": val_loss}, step=global_step)
                if is_last or (s.save_freq > 0 and global_step % s.save_freq == 0):
                    self.save_checkpoint(global_step)
                if is_last:
                    return


def _source_config(model_path: str, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)


def _load_tokenizer(model_path: str, trust_remote_code: bool, chat_template: str | None) -> Any:
    from verl.utils.tokenizer import hf_tokenizer

    tokenizer = hf_tokenizer(model_path, trust_remote_code=trust_remote_code)
    if chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer


def _join_process_group() -> str | None:
    """Join the default process group unless the caller has: torchrun's (``env://``) when ``RANK`` and
    ``WORLD_SIZE`` are set, else a world of one meeting through a file in a new temporary folder, whose path is
    returned (None otherwise) so that `run_sft` removes it."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        initialize_global_process_group()
        return None
    folder = tempfile.mkdtemp(prefix="verl-sft-pg-")
    dist.init_process_group(backend=get_nccl_backend(), init_method=f"file://{folder}/pg", rank=0, world_size=1)
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    return folder


def run_sft(config: DictConfig) -> None:
    """Validate ``config``, join (or create) the process group, build the tokenizer, the datasets and the trainer,
    and train. A process group the caller created is left as it is; one made here is destroyed at the end."""
    if config.trainer.get("device") == "cpu":  # before anything asks torch about CUDA
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    validate_sft_config(config, world_size=dist.get_world_size() if dist.is_initialized() else None)
    s = sft_settings(config)
    if s.device == "cpu" and torch.cuda.is_available():
        raise RuntimeError("trainer.device=cpu, but CUDA was initialised in this process before run_sft")
    from verl.utils.import_utils import import_external_libs

    import_external_libs(list(s.external_lib))
    owned = not dist.is_initialized()
    folder = _join_process_group() if owned else None
    try:
        tokenizer = _load_tokenizer(s.model_path, s.trust_remote_code, s.chat_template)
        data = config.data
        train = create_sft_dataset(data.train_files, data, tokenizer, max_samples=int(data.train_max_samples))
        val = None
        if data.val_files:
            val = create_sft_dataset(data.val_files, data, tokenizer, max_samples=int(data.val_max_samples))
        FSDPSFTTrainer(config, tokenizer=tokenizer, train_dataset=train, val_dataset=val).fit()
    finally:
        if owned:
            destroy_global_process_group()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


@hydra.main(config_path="config", config_name="sft_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """The command-line entry point."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True)
    run_sft(config)


if __name__ == "__main__":
    main()
