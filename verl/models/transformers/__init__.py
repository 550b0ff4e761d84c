"""veRL's patches of Hugging Face models (see ``monkey_patch``)."""
