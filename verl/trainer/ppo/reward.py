"""Build the reward function of a run from its config, and apply it to a batch.

Config keys read (veRL 0.10's ``reward.*``; veRL's older names, ``reward_model.*`` / ``reward_manager.*`` /
``custom_reward_function.*``, are read into them by `verl.trainer.config.layout`; defaults in brackets):

- ``reward.reward_manager.source`` [register]: ``register`` (a name in the reward-manager registry) or
  ``importlib``;
- ``reward.reward_manager.name`` [naive]: the manager's registered name (``naive``, ``batch``, ``dapo``, ``gdpo``)
  or, with ``importlib``, its class name;
- ``reward.reward_manager.module.path`` / ``.name``: file and class of an ``importlib`` manager (``.name`` wins
  over ``reward_manager.name``);
- ``reward.custom_reward_function.path`` [null] / ``.name`` [compute_score] / ``.reward_kwargs`` [{}]: a user's
  ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict``; without a
  path, :func:`verl.utils.reward_score.default_compute_score` scores by ``data_source``. The function gets only the
  keywords it declares; a ``reward_kwargs`` key it does not declare is an error at start-up;
- ``reward.reward_kwargs`` [{}]: keywords for the manager (those its constructor declares, e.g. the dapo manager's
  ``max_resp_len`` and ``overlong_buffer_cfg.{enable, len, penalty_factor, log}``) or, for the built-in managers,
  for every ``compute_score`` call (veRL scripts give them as ``+reward.reward_kwargs.<key>=<value>``);
- ``data.reward_fn_key`` [data_source], ``data.max_response_length`` [512] (dapo);
- ``reward.timeout_s`` [30]: per-sample limit, in seconds, on one ``compute_score`` call (null or ≤ 0: none);
- ``reward.num_workers`` [1]: scoring processes; 0 scores in threads of the driver process.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.py_functional import rejected_kwargs
from verl.utils.reward_score.custom import FileFunction, load_object_from_file
from verl.workers.reward_manager.build import DEFAULT_REWARD_TIMEOUT_S, build_batch_manager, plain_container

__all__ = [
    "DEFAULT_REWARD_TIMEOUT_S",
    "compute_reward",  # and compute_reward_async, made on first use (see __getattr__)
    "compute_reward_with_metrics",
    "extract_reward",
    "get_custom_reward_fn",
    "load_reward_fns",
    "load_reward_manager",
    "registered_manager",
]

logger = logging.getLogger(__name__)


def _section(config: Any, key: str) -> Mapping[str, Any]:
    value = config.get(key) if config is not None else None
    return value if value is not None else {}


def _reward(config: Any) -> Mapping[str, Any]:
    """``config.reward``, with veRL's older reward keys read into it (`verl.trainer.config.layout`; a config that
    went through the trainer's start-up has nothing left to read, one that a recipe built itself may)."""
    if config is None:
        return {}
    from omegaconf import OmegaConf

    from verl.trainer.config.layout import migrate_legacy_reward_impl

    config = config if OmegaConf.is_config(config) else OmegaConf.create(config)
    return _section(migrate_legacy_reward_impl(OmegaConf.create(OmegaConf.to_container(config))), "reward")


def get_custom_reward_fn(config: Any) -> Callable[..., Any] | None:
    """The user's reward function from ``reward.custom_reward_function.{path, name, reward_kwargs}``, or None without
    a path.

    The file is imported now, so a wrong path or name fails at start-up. The returned callable merges
    ``reward_kwargs`` over each call's keywords and can be sent to scoring processes (it reloads the file there).
    """
    section = _section(_reward(config), "custom_reward_function")
    path = section.get("path")
    if not path:
        return None
    name = section.get("name") or "compute_score"
    fn = FileFunction(path, name, plain_container(section.get("reward_kwargs")) or {})
    rejected = rejected_kwargs(fn.load(), fn.kwargs)
    if rejected:
        raise TypeError(
            f"reward.custom_reward_function.reward_kwargs {rejected} are not parameters of {fn.describe()}; add them "
            "to "
            "its signature (or **kwargs) or drop them"
        )
    logger.info("using custom reward function %r from %s", name, fn.path)
    return fn


def registered_manager(name: str) -> type:
    """The manager registered as ``name``: a batch manager (`verl.workers.reward_manager`) first, else a
    reward-loop manager (`verl.experimental.reward_loop.reward_manager`); an unknown name lists both."""
    from verl.experimental.reward_loop.reward_manager import REWARD_MANAGER
    from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY

    for registry in (REWARD_MANAGER_REGISTRY, REWARD_MANAGER):
        if name in registry:
            return registry[name]
    raise ValueError(
        f"Unknown reward manager: {name} (reward.reward_manager.name); batch managers: "
        f"{sorted(REWARD_MANAGER_REGISTRY)}, reward-loop managers: {sorted(REWARD_MANAGER)}"
    )


def _manager_class(reward: Mapping[str, Any]) -> type:
    section = _section(reward, "reward_manager")
    source = section.get("source") or "register"
    name = section.get("name") or "naive"
    if source == "register":
        return registered_manager(name)
    if source == "importlib":
        module = section.get("module") or {}
        path = module.get("path")
        if not path:
            raise ValueError(
                "reward.reward_manager.source=importlib needs reward.reward_manager.module.path (a Python file)"
            )
        cls_name = module.get("name") or name
        cls = load_object_from_file(
            path, cls_name, "reward.reward_manager.module.path", "reward.reward_manager.module.name"
        )
        if not isinstance(cls, type):
            raise TypeError(f"reward.reward_manager.module: {cls_name!r} in {path} is not a class")
        return cls
    raise ValueError(f"reward.reward_manager.source={source!r} must be 'register' or 'importlib'")


_FROM_CONFIG: Any = object()


def load_reward_manager(
    config: Any,
    tokenizer: Any,
    num_examine: int = 0,
    *,
    manager_cls: type | None = None,
    compute_score: Any = _FROM_CONFIG,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    **reward_kwargs: Any,
) -> Any:
    """Build the reward manager that the config names (see the module docstring for the keys).

    A batch manager gets ``reward_kwargs`` (veRL's ``reward.reward_kwargs``) in its constructor (and, for the
    built-in managers, in every ``compute_score`` call); a key that neither takes is an error naming it. The
    settings this version adds (``timeout_s``, ``num_workers``) and the dapo manager's ``max_resp_len`` are given
    only to a constructor that declares them. ``num_examine``: responses printed per batch (veRL 0.10 dropped the
    argument: 0). A reward-loop manager (a :class:`~verl.experimental.reward_loop.reward_manager.RewardManagerBase`)
    is built with veRL 0.10's arguments — it reads ``config.reward`` itself — and returned as a
    :class:`~verl.experimental.reward_loop.reward_fn.RewardLoopFunction`. Either is called as
    ``manager(data, return_dict=False)``.

    ``manager_cls`` replaces the configured class, ``compute_score`` the configured function (default: the
    config's). With a served reward model (``reward.reward_model.enable`` and a custom function) the run's router
    is started (`verl.experimental.reward_loop.router`) and its ``reward_router_address`` and the reward model's
    tokenizer (``reward_model_tokenizer``) reach the function when it declares them (they may also be given).
    """
    from verl.experimental.reward_loop.reward_fn import RewardLoopFunction
    from verl.experimental.reward_loop.reward_manager import RewardManagerBase
    from verl.experimental.reward_loop.reward_model import served_reward_model
    from verl.experimental.reward_loop.router import RewardModelTokenizer, reward_router

    reward = _reward(config)
    cls = manager_cls or _manager_class(reward)
    data = _section(config, "data")
    fn = get_custom_reward_fn(config) if compute_score is _FROM_CONFIG else compute_score
    if reward_router_address is None and config is not None and served_reward_model(config):
        reward_router_address = reward_router(config)[1]
        logger.info("the reward function reaches the reward model at http://%s", reward_router_address)
        reward_model_tokenizer = RewardModelTokenizer(config.reward.reward_model.model_path)
        if fn is None and manager_cls is None:  # veRL's rule: no function of the user's, the model's score
            cls = discriminative_manager(config.reward.reward_model.model_path)
    if isinstance(cls, type) and issubclass(cls, RewardManagerBase):
        if reward_kwargs:
            logger.warning(
                "reward.reward_kwargs %s are not passed to the reward-loop manager %s: it reads config.reward itself",
                sorted(reward_kwargs),
                cls.__qualname__,
            )
        manager = cls(config, tokenizer, fn, reward_router_address, reward_model_tokenizer)
        return RewardLoopFunction(manager, reward_fn_key=data.get("reward_fn_key", "data_source"))
    return build_batch_manager(
        cls,
        tokenizer,
        fn,
        reward=reward,
        data=data,
        trainer=_section(config, "trainer"),
        num_examine=num_examine,
        reward_router_address=reward_router_address,
        reward_model_tokenizer=reward_model_tokenizer,
        **reward_kwargs,
    )


def discriminative_manager(model_path: str) -> type:
    """The manager that makes a served reward model's score the reward; a causal LM there is an error (a generative
    judge needs a function that prompts it)."""
    from verl.experimental.reward_loop.reward_manager.discriminative import DiscriminativeRewardManager
    from verl.experimental.reward_loop.score_server import is_discriminative

    if not is_discriminative(model_path):
        raise ValueError(
            f"reward.reward_model.enable without reward.custom_reward_function.path: {model_path} is a causal LM, "
            "a generative judge — give a reward function that asks it (reward_router_address), or a classifier "
            "(ForTokenClassification / ForSequenceClassification) whose score is the reward"
        )
    return DiscriminativeRewardManager


def load_reward_fns(config: Any, tokenizer: Any) -> tuple[Any, Any]:
    """``(reward_fn, val_reward_fn)`` the config names: the managers of :func:`load_reward_manager` with
    ``reward.reward_kwargs``, the validation one printing one response per batch."""
    kwargs = dict(_reward(config).get("reward_kwargs") or {})
    return (
        load_reward_manager(config, tokenizer, num_examine=0, **kwargs),
        load_reward_manager(config, tokenizer, num_examine=1, **kwargs),
    )


def compute_reward_with_metrics(
    data: DataProto, reward_fn: Callable[..., Any]
) -> tuple[torch.Tensor, dict[str, list[Any]], dict[str, float]]:
    """``(reward_tensor, reward_extra_infos_dict, reward_metrics)`` for a batch.

    ``reward_metrics`` holds ``reward/error_count`` and ``reward/timeout_count`` when the manager reports them.
    A ``reward_fn`` that returns a bare tensor (ignoring ``return_dict``) is accepted too.
    """
    result = reward_fn(data, return_dict=True)
    if isinstance(result, torch.Tensor):
        return result, {}, {}
    return (
        result["reward_tensor"],
        dict(result.get("reward_extra_info") or {}),
        dict(result.get("reward_metrics") or {}),
    )


def compute_reward(data: DataProto, reward_fn: Callable[..., Any]) -> tuple[torch.Tensor, dict[str, list[Any]]]:
    """``(reward_tensor, reward_extra_infos_dict)`` for a batch: veRL's signature of
    :func:`compute_reward_with_metrics`, without the metrics."""
    reward_tensor, extra, _ = compute_reward_with_metrics(data, reward_fn)
    return reward_tensor, extra


def extract_reward(data: DataProto) -> tuple[torch.Tensor, dict[str, list[Any]]]:
    """``(reward_tensor, reward_extra_infos_dict)`` already in the batch: ``rm_scores`` and the non-tensor keys
    named by ``meta_info["reward_extra_keys"]`` (veRL's helper for rewards scored during the rollout).

    In this version only a reward model (``reward_model.enable``) puts ``rm_scores`` in the batch; without it, score
    with the trainer's ``_compute_or_extract_reward(batch)``.
    """
    if data.batch is None or "rm_scores" not in data.batch.keys():
        raise KeyError(
            "extract_reward: the batch has no 'rm_scores' (nothing scored it during the rollout); compute the reward "
            "with RayPPOTrainer._compute_or_extract_reward(batch) or the reward function"
        )
    keys = data.meta_info.get("reward_extra_keys", [])
    return data.batch["rm_scores"], {key: list(data.non_tensor_batch[key]) for key in keys}


def _compute_reward_async(
    data: DataProto, config: Any = None, tokenizer: Any = None, reward_fn: Callable[..., Any] | None = None
) -> tuple[torch.Tensor, dict[str, list[Any]]]:
    """`compute_reward` in a Ray task; without ``reward_fn`` the manager is loaded from ``config`` and
    ``tokenizer`` (veRL's older call)."""
    if reward_fn is None:
        if config is None or tokenizer is None:
            raise ValueError("compute_reward_async needs reward_fn, or config and tokenizer to load one")
        reward_fn = load_reward_fns(config, tokenizer)[0]
    return compute_reward(data, reward_fn)


def __getattr__(name: str) -> Any:
    """``compute_reward_async``: veRL's ``ray.remote(num_cpus=1)`` reward task, made on first use (this module
    does not import Ray otherwise); call it with ``.remote(data, reward_fn=...)``."""
    if name == "compute_reward_async":
        import ray

        remote = ray.remote(num_cpus=1)(_compute_reward_async)
        globals()[name] = remote
        return remote
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
