"""Helpers for megatron-core (``cpu_layer``: train megatron-core models on CPU over gloo)."""
