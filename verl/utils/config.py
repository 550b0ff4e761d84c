"""Config helpers at veRL's import path (``verl.utils.config``).

``omega_conf_to_dataclass`` is the one in :mod:`verl.base_config`. ``validate_config`` checks a whole trainer
config with :func:`verl.trainer.config.validate.validate_config`, imported only when called (``verl.utils`` never
imports the trainer at module import time). That call is the one import of ``verl.trainer`` below it, exempted by name
in ``tests/test_layering.py``: the validator checks a whole trainer config (its sections, its not-implemented table).
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from verl.base_config import omega_conf_to_dataclass

__all__ = ["load_yaml_file", "omega_conf_to_dataclass", "update_dict_with_config", "validate_config"]

logger = logging.getLogger(__name__)


def update_dict_with_config(dictionary: MutableMapping[str, Any], config: Any) -> None:
    """Overwrite each key of ``dictionary`` (in place) with ``config``'s attribute of that name, where it has one."""
    for key in dictionary:
        if hasattr(config, key):
            dictionary[key] = getattr(config, key)


def validate_config(
    config: Any,
    use_reference_policy: bool | None = None,
    use_critic: bool | None = None,
    check_environment: bool = True,
) -> None:
    """Raise ``ConfigError`` listing every problem of the composed trainer ``config``.

    ``use_reference_policy`` / ``use_critic`` are veRL's arguments; here both are derived from the config itself
    (``need_reference_policy`` / ``need_critic``); a value that contradicts the config is logged and ignored.
    ``check_environment``: also check that this machine can run the config (the rollout engine is installed).
    """
    from verl.trainer.config.validate import need_critic, need_reference_policy
    from verl.trainer.config.validate import validate_config as _validate

    for name, given, derived in (
        ("use_reference_policy", use_reference_policy, need_reference_policy),
        ("use_critic", use_critic, need_critic),
    ):
        if given is not None and bool(given) != derived(config):
            logger.warning(
                "validate_config(%s=%r) is ignored: the config implies %s=%s", name, given, name, derived(config)
            )
    _validate(config, check_environment=check_environment, own_keys_declared=True)


def load_yaml_file(path: str, where: str) -> Any:
    """``OmegaConf.load(path)``; a missing file or YAML that does not parse is an error starting with ``where``
    (the key or file the caller reads it for)."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{where}: no such file") from e
    except Exception as e:  # noqa: BLE001 - any parse error is reported with the file
        raise ValueError(f"{where}: not a YAML file: {e}") from e
