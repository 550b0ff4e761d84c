"""``apply_monkey_patch``: veRL patches a Hugging Face model's attention for Ulysses sequence parallelism and its
forward for fused log-prob kernels.

Neither is implemented here, and remove-padding needs no patch: our actor and critic pack the micro-batch without
its pad tokens themselves (``verl.utils.padding.forward_without_padding``) and the model is called with the packed
rows and their position ids. So at sequence-parallel size 1 without fused kernels there is nothing to patch; the
call logs that and returns. ``ulysses_sp_size > 1``, fused kernels, the prefix grouper and tiled MLP are refused
by name.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.utils.ulysses import check_sp_size

__all__ = ["apply_monkey_patch"]

logger = logging.getLogger(__name__)


def apply_monkey_patch(
    model: Any,
    ulysses_sp_size: int = 1,
    use_remove_padding: bool = True,
    use_fused_kernels: bool = False,
    fused_kernels_backend: str | None = None,
    use_prefix_grouper: bool = False,
    use_tiled_mlp: bool = False,
    tiled_mlp_shards: int = 4,
) -> None:
    """Check that ``model`` needs no patch for these options (see the module docstring); raise
    NotImplementedError naming an option that would need one."""
    check_sp_size(ulysses_sp_size)
    refused = {
        "use_fused_kernels": use_fused_kernels,
        "use_prefix_grouper": use_prefix_grouper,
        "use_tiled_mlp": use_tiled_mlp,
    }
    named = [name for name, value in refused.items() if value]
    if named:
        raise NotImplementedError(f"apply_monkey_patch: {', '.join(named)} not implemented; set them to false")
    logger.info(
        "apply_monkey_patch(%s): nothing to patch (sequence-parallel size 1%s)",
        type(model).__name__,
        "; remove-padding is done by the actor/critic, not by a patched attention" if use_remove_padding else "",
    )
