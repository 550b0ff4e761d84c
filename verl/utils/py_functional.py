"""Small helpers on plain Python callables and containers.

:func:`accepted_kwargs` is how verl calls user code (reward functions, registered advantage estimators and policy
losses): each gets only the keyword arguments its signature declares, and a function with ``**kwargs`` gets all of
them, so a function written to veRL's documented signature works whatever extra inputs this version offers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["accepted_kwargs", "call_with_accepted_kwargs", "declared_parameters", "rejected_kwargs"]

_SIGNATURES: dict[int, tuple[Callable[..., Any], frozenset[str] | None]] = {}


def declared_parameters(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword-passable parameter names of ``fn``, or None when it takes ``**kwargs`` (or has no signature).

    ``inspect.signature`` follows ``__wrapped__``, so decorated functions and wrappers that set it report the
    signature of the function they wrap. Cached per callable object.
    """
    cached = _SIGNATURES.get(id(fn))
    if cached is not None and cached[0] is fn:
        return cached[1]
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: pass everything
        names = None
    else:
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            names = None
        else:
            keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            names = frozenset(p.name for p in params if p.kind in keyword_kinds)
    _SIGNATURES[id(fn)] = (fn, names)
    return names


def accepted_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The items of ``kwargs`` that ``fn`` declares (all of them when it takes ``**kwargs``)."""
    names = declared_parameters(fn)
    if names is None:
        return dict(kwargs)
    return {key: value for key, value in kwargs.items() if key in names}


def rejected_kwargs(fn: Callable[..., Any], keys: Iterable[str]) -> list[str]:
    """The names among ``keys`` that ``fn`` would not accept as keyword arguments."""
    names = declared_parameters(fn)
    return [] if names is None else [key for key in keys if key not in names]


def call_with_accepted_kwargs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **accepted_kwargs(fn, kwargs))``."""
    return fn(*args, **accepted_kwargs(fn, kwargs))
