"""RL prompt datasets (veRL's parquet schema), SFT datasets, collation and resumable dataloaders."""

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
from verl.utils.dataset.rl_dataset import (
    RLHFDataset,
    collate_fn,
    create_dataloader,
    create_rl_dataset,
    create_rl_sampler,
    dataloader_seed,
)
from verl.utils.dataset.sft_dataset import SFTDataset

__all__ = [
    "MultiTurnSFTDataset",
    "RLHFDataset",
    "SFTDataset",
    "collate_fn",
    "create_dataloader",
    "create_rl_dataset",
    "create_rl_sampler",
    "dataloader_seed",
]
