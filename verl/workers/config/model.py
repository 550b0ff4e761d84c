"""Schema of ``actor_rollout_ref.model`` (veRL's ``HFModelConfig`` field names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig
from verl.workers.config.lora import LoraSpec

__all__ = ["HFModelConfig"]


@dataclass
class HFModelConfig(BaseConfig):
    """The Hugging Face model the actor, ref and rollout load.

    Args:
        path: a HF model folder (config + weights); ``hdfs://`` and hub ids are not fetched here.
        tokenizer_path: tokenizer folder; null: ``path``.
        hf_config_path: folder of the HF config; null: ``path``.
        trust_remote_code: allow the model's and the tokenizer's custom code.
        use_shm: copy the model to shared memory before loading it.
        external_lib: a module imported before the model is loaded (to register custom architectures).
        override_config: attributes set on the HF config before the model is built.
        custom_chat_template: a Jinja chat template that replaces the tokenizer's.
        enable_gradient_checkpointing: recompute activations in backward (actor and critic).
        enable_activation_offload: offload activations to host memory during training.
        use_remove_padding: forward packed sequences without pad tokens (the default of the actor and the ref).
        lora_rank: LoRA rank; 0 disables LoRA. With LoRA the actor trains the adapters only, the reference policy is
            the base model (adapters disabled), and weight pushes after the first carry the adapters alone.
        lora_alpha: LoRA scaling factor α (the adapter adds α/r · B A).
        target_modules: modules LoRA adapts ("all-linear" or a list of module names; linear layers only).
        exclude_modules: modules LoRA leaves alone (a list of names or a regex).
        lora_adapter_path: a saved peft adapter folder to start from (its rank must equal lora_rank).
        use_liger: use the Liger kernels.
        use_fused_kernels: compute log-probs and entropy with fused kernels.
        fused_kernel_options.impl_backend: backend of those kernels ("torch" or "triton").
        tiled_mlp.enabled: compute the MLP in tiles to save activation memory.
        tiled_mlp.num_shards: number of tiles.
        mtp: multi-token-prediction options.
    """

    path: str = "~/models/deepseek-llm-7b-chat"
    tokenizer_path: str | None = None
    hf_config_path: str | None = None
    trust_remote_code: bool = False
    use_shm: bool = False
    external_lib: str | None = None
    override_config: dict[str, Any] = field(default_factory=dict)
    custom_chat_template: str | None = None
    enable_gradient_checkpointing: bool = True
    enable_activation_offload: bool = False
    use_remove_padding: bool = True
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    lora_adapter_path: str | None = None
    use_liger: bool = False
    use_fused_kernels: bool = False
    fused_kernel_options: dict[str, Any] = field(default_factory=lambda: {"impl_backend": "torch"})
    tiled_mlp: dict[str, Any] = field(default_factory=lambda: {"enabled": False, "num_shards": 4})
    mtp: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"actor_rollout_ref.model.path={self.path!r} must be a model folder")
        LoraSpec.from_config(self)  # raises ValueError naming a bad lora_* key
        if self.override_config is None:
            object.__setattr__(self, "override_config", {})
