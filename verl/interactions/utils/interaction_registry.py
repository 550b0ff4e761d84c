"""Build interactions from veRL's interaction YAML (``multi_turn.interaction_config_path``)::

    interaction:
      - name: gsm8k                                                   # optional: default from the class name
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
        config: {}

A sample picks one by ``extra_info.interaction_kwargs.name``. A missing file, bad YAML, an entry without
``class_name``, a class that is not a :class:`~verl.interactions.base.BaseInteraction` or a duplicate name raises an
error naming the file and the entry.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.interactions.base import BaseInteraction
from verl.tools.utils.tool_registry import get_tool_class, load_subclass
from verl.utils.config import load_yaml_file

__all__ = ["get_interaction_class", "initialize_interactions_from_config"]

logger = logging.getLogger(__name__)


def get_interaction_class(cls_name: str) -> type:
    """The class at the dotted path ``cls_name``."""
    return get_tool_class(cls_name)


def _default_name(cls: type) -> str:
    name = cls.__name__
    return (name[: -len("Interaction")] if name.endswith("Interaction") else name).lower()


def initialize_interactions_from_config(interaction_config_file: str) -> dict[str, BaseInteraction]:
    """The interactions listed in ``interaction_config_file``, by name."""
    where = f"interaction config {interaction_config_file!r}"
    config = load_yaml_file(interaction_config_file, where)
    if not isinstance(config, DictConfig) or not isinstance(config.get("interaction"), ListConfig):
        raise ValueError(f"{where}: must have a top-level 'interaction' list")
    interactions: dict[str, BaseInteraction] = {}
    for i, item in enumerate(config.interaction):
        entry = f"{where}, interaction[{i}]"
        if not isinstance(item, DictConfig) or not item.get("class_name"):
            raise ValueError(f"{entry}: needs 'class_name', got {item!r}")
        cls = load_subclass(str(item.class_name), BaseInteraction, entry)
        node: Any = item.get("config")
        settings = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
        name = str(item.get("name") or _default_name(cls))
        if name in interactions:
            raise ValueError(f"{entry}: a second interaction named {name!r}")
        interactions[name] = cls(config={**settings, "name": name})
    logger.info("interactions from %s: %s", interaction_config_file, sorted(interactions))
    return interactions
