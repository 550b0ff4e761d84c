"""veRL's ``verl.models`` path, for the recipe-facing ``transformers.monkey_patch``."""
