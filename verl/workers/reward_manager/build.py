"""Building a batch reward manager from the ``reward`` settings: one place for the constructor's arguments, used by
the trainer's ``load_reward_manager`` and by the reward-loop managers that score with a batch manager."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from verl.utils.py_functional import accepted_kwargs

__all__ = ["DEFAULT_REWARD_TIMEOUT_S", "build_batch_manager", "constructor_parameters", "plain_container"]

DEFAULT_REWARD_TIMEOUT_S = 30.0


def plain_container(value: Any) -> Any:
    """OmegaConf containers → plain dicts / lists (they are sent to scoring processes and user code)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def constructor_parameters(cls: type) -> tuple[set[str], bool]:
    """The keyword parameters a manager's constructor declares, following ``**kwargs`` up the base classes (a
    subclass that forwards ``**kwargs`` to ``super().__init__`` also takes its base's parameters), and whether the
    last constructor on that chain takes ``**kwargs`` itself."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters.values()
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        names.update(p.name for p in params if p.kind in kinds)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return names, False
    return names, True


def build_batch_manager(
    cls: type,
    tokenizer: Any,
    compute_score: Any,
    *,
    reward: Mapping[str, Any],
    data: Mapping[str, Any],
    trainer: Mapping[str, Any],
    num_examine: int = 0,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    **reward_kwargs: Any,
) -> Any:
    """``cls(tokenizer=, num_examine=, compute_score=, reward_fn_key=, **kwargs)``: ``reward_kwargs`` go to the
    constructor (a key it does not declare is an error naming it, unless it takes ``**kwargs``); the settings it
    declares among ``timeout_s`` / ``num_workers`` (``reward``), ``max_resp_len`` (``data.max_response_length``),
    ``experiment_name`` and ``overlong_buffer_cfg`` are filled in; a served reward model's address and tokenizer
    reach ``compute_score`` when it declares them."""
    kwargs: dict[str, Any] = {key: plain_container(value) for key, value in reward_kwargs.items()}
    declared, takes_any = constructor_parameters(cls)
    unknown = sorted(set(kwargs) - declared)
    if unknown and not takes_any:
        raise TypeError(
            f"reward.reward_kwargs {unknown} are not parameters of the reward manager "
            f"{cls.__module__}.{cls.__qualname__}; its parameters: {sorted(declared)}"
        )
    if reward_router_address is not None:  # a served reward model: the function's keywords, when it takes them
        from verl.utils.reward_score import default_compute_score

        router = {"reward_router_address": reward_router_address, "reward_model_tokenizer": reward_model_tokenizer}
        kwargs.update(accepted_kwargs(compute_score or default_compute_score, router))
    optional = {
        "timeout_s": reward.get("timeout_s", DEFAULT_REWARD_TIMEOUT_S),
        "num_workers": reward.get("num_workers", 1),
        "max_resp_len": data.get("max_response_length", 512),
        "experiment_name": trainer.get("experiment_name"),
        "overlong_buffer_cfg": plain_container((reward.get("reward_kwargs") or {}).get("overlong_buffer_cfg")),
    }
    for key, value in optional.items():
        if key not in kwargs and key in declared:
            kwargs[key] = value
    return cls(
        tokenizer=tokenizer,
        num_examine=num_examine,
        compute_score=compute_score,
        reward_fn_key=data.get("reward_fn_key", "data_source"),
        **kwargs,
    )
