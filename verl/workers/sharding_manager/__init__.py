"""veRL's sharding managers (``fsdp_ulysses``), kept for recipes that enter them around their passes."""
