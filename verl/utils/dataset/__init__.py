"""RL prompt datasets (veRL's parquet schema), collation and resumable dataloaders."""

from verl.utils.dataset.rl_dataset import (
    RLHFDataset,
    collate_fn,
    create_dataloader,
    create_rl_dataset,
    create_rl_sampler,
    dataloader_seed,
)

__all__ = [
    "RLHFDataset",
    "collate_fn",
    "create_dataloader",
    "create_rl_dataset",
    "create_rl_sampler",
    "dataloader_seed",
]
