"""Megatron-Core models built from Hugging Face configs and weights (Qwen2 and Llama families): the config
converter, the model builder and the HF ↔ Megatron weight converter, shared by the Megatron engine and the model
merger. Nothing here imports megatron-core until a model is built."""
