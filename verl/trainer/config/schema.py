"""The schema a config is validated against: the base trainer config plus the keys a recipe's own yaml declares.

A recipe's primary yaml (``defaults: [ppo_trainer, _self_]`` plus its own sections) may declare keys the base
config does not have: a new section (``my_recipe: {alpha: 1}``) or a new key in an existing one
(``trainer.my_flag: true``). `extend_schema` adds those to the schema, so validation accepts them; a declared key
that is a near-miss of a key at the same level of the base (edit distance ≤ 2, e.g. ``clip_ratoi`` for
``clip_ratio``) is not added but reported, as the typo it almost certainly is. Keys given only on the command line
are never added: a command-line typo is an unknown key.

Which yaml is the primary one: ``run_ppo(config, schema=...)`` may pass the schema; otherwise, under a running
Hydra app, `running_schema` composes the app's ``HydraConfig.get().job.config_name`` with the app's search path
(no overrides); otherwise the base config alone is the schema.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from verl.trainer.config.validate_reward import RATE_LIMIT_KEYS

__all__ = ["BASE_CONFIG_NAMES", "PLUS_KEYS", "edit_distance", "extend_schema", "running_schema"]

logger = logging.getLogger(__name__)

# Keys of the config dataclasses that veRL's YAML leaves out, so veRL's scripts add them with ``+`` (a key the
# YAML had would make Hydra refuse the ``+``): not generated into the YAML, accepted by validation.
PLUS_KEYS = (
    "algorithm.gdpo_reward_keys",
    "algorithm.gdpo_reward_weights",
    *(f"reward.{key}" for key in RATE_LIMIT_KEYS),
)

# Config names whose keys are the base schema itself (nothing to add).
BASE_CONFIG_NAMES = ("ppo_trainer",)
NEAR_MISS = 2


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between ``a`` and ``b``."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _near_miss(key: str, known: list[str]) -> str | None:
    close = sorted((edit_distance(key, k), k) for k in known if k != key)
    return close[0][1] if close and close[0][0] <= NEAR_MISS else None


def _extend(schema: DictConfig, declared: DictConfig, prefix: str, problems: list[str], where: str) -> None:
    for key in declared:
        path = f"{prefix}.{key}" if prefix else str(key)
        node = declared._get_node(key)
        if key in schema:
            snode = schema._get_node(key)
            if isinstance(snode, DictConfig) and len(snode) > 0 and isinstance(node, DictConfig):
                _extend(snode, node, path, problems, where)
            continue
        match = _near_miss(str(key), [str(k) for k in schema])
        if match is not None:
            problems.append(
                f"unknown key {path!r} declared in {where}: did you mean "
                f"{(prefix + '.' if prefix else '') + match!r}? (a recipe's new key must not be within edit distance "
                f"{NEAR_MISS} of a key at the same level; rename it or fix the typo)"
            )
            continue
        value = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node._value()
        schema[key] = value


def extend_schema(base: DictConfig, declared: DictConfig, where: str = "the recipe's yaml") -> tuple[DictConfig, list]:
    """``(schema, problems)``: ``base`` plus the keys ``declared`` (a composed recipe config, unresolved) adds,
    and one problem per declared key that looks like a typo of a base key at the same level."""
    schema = OmegaConf.create(OmegaConf.to_container(base, resolve=False))
    problems: list[str] = []
    _extend(schema, declared, "", problems, where)
    return schema, problems


def running_schema(base: DictConfig) -> tuple[DictConfig, list[str]] | None:
    """The schema of the running Hydra app's primary config (see the module docstring); None outside Hydra or
    when the primary config is the base one."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    name = HydraConfig.get().job.config_name
    if not name or name in BASE_CONFIG_NAMES:
        return None
    from verl.trainer.config.compose import compose_in_running_app

    try:
        declared = compose_in_running_app(name)
    except Exception as e:  # the app's own composition succeeded; this one should too, but never mask the config
        logger.warning("could not compose %r to read the recipe's keys (%s); validating against the base", name, e)
        return None
    return extend_schema(base, declared, where=f"{name}.yaml") if declared is not None else None
