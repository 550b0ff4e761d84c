"""The trainer's data: the train and validation loaders built from ``config.data`` (veRL's ``_create_dataloader``)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["TrainerData", "build_dataloaders"]


class TrainerData(NamedTuple):
    """The datasets and their loaders (no validation loader without ``data.val_files``)."""

    train_dataset: Any
    val_dataset: Any
    train_dataloader: Any
    val_dataloader: Any


def build_dataloaders(
    data: Any,
    tokenizer: Any,
    processor: Any = None,
    train_dataset: Any = None,
    val_dataset: Any = None,
    collate_fn: Any = None,
    train_sampler: Any = None,
) -> TrainerData:
    """The train and validation loaders of ``data`` (the ``data`` config): a dataset, sampler or ``collate_fn`` not
    given is built as ``main_ppo`` builds it (``create_rl_dataset``, ``create_rl_sampler``, the RL dataset's
    ``collate_fn``); no ``data.val_files``: no validation loader. Fewer prompts than one batch is an error."""
    from verl.utils.dataset import rl_dataset
    from verl.utils.dataset.rl_dataset import create_dataloader, create_rl_dataset, dataloader_workers

    if train_dataset is None:
        train_dataset = create_rl_dataset(data.train_files, data, tokenizer, processor)
    if val_dataset is None and data.get("val_files"):
        val_dataset = create_rl_dataset(data.val_files, data, tokenizer, processor, is_train=False)
    if train_sampler is None:
        train_sampler = rl_dataset.create_rl_sampler(data, train_dataset)
    collate_fn = collate_fn or rl_dataset.collate_fn
    workers = dataloader_workers(data.dataloader_num_workers)
    train_dataloader = create_dataloader(
        train_dataset,
        batch_size=data.get("gen_batch_size", data.train_batch_size),
        sampler=train_sampler,
        collate_fn=collate_fn,
        num_workers=workers,
        drop_last=True,
    )
    val_dataloader = None
    if val_dataset is not None:
        val_dataloader = create_dataloader(
            val_dataset,
            batch_size=data.val_batch_size or len(val_dataset),
            sampler=None,
            collate_fn=collate_fn,
            num_workers=workers,
            drop_last=False,
        )
    if len(train_dataloader) == 0:
        raise ValueError(
            f"data.train_files give {len(train_dataset)} prompts, fewer than one batch of data.train_batch_size="
            f"{data.train_batch_size}"
        )
    return TrainerData(train_dataset, val_dataset, train_dataloader, val_dataloader)
