"""Dataset plug points at veRL's ``verl.experimental.dataset`` paths."""
