"""Small helpers on plain Python callables and containers.

:func:`accepted_kwargs` is how verl calls user code (reward functions, registered advantage estimators and policy
losses): each gets only the keyword arguments its signature declares, and a function with ``**kwargs`` gets all of
them, so a function written to veRL's documented signature works whatever extra inputs this version offers.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "accepted_kwargs",
    "append_to_dict",
    "call_with_accepted_kwargs",
    "declared_parameters",
    "rejected_kwargs",
    "temp_env_var",
    "timeout_limit",
]

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


def append_to_dict(data: dict[str, list[Any]], new_data: Mapping[str, Any], prefix: str = "") -> None:
    """Append each value of ``new_data`` to the list at ``prefix + key`` in ``data`` (veRL's metric gathering)."""
    for key, value in new_data.items():
        data.setdefault(f"{prefix}{key}", []).append(value)


def _run_and_put(func: Callable[..., Any], queue: Any, args: tuple, kwargs: dict) -> None:
    try:
        queue.put((True, func(*args, **kwargs)))
    except BaseException as error:  # the caller re-raises it
        queue.put((False, error))


def timeout_limit(seconds: float, use_signals: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator: the call raises ``TimeoutError`` (naming the function) after ``seconds``.

    ``use_signals=True`` interrupts the call with ``SIGALRM`` (main thread only); otherwise the call runs in a
    forked child process, killed at the deadline (its result and exceptions must pickle)."""

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        name = getattr(func, "__qualname__", repr(func))

        @functools.wraps(func)
        def with_signal(*args: Any, **kwargs: Any) -> Any:
            def expire(signum: int, frame: Any) -> None:
                raise TimeoutError(f"{name} timed out after {seconds} s")

            previous = signal.signal(signal.SIGALRM, expire)
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                return func(*args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

        @functools.wraps(func)
        def in_process(*args: Any, **kwargs: Any) -> Any:
            context = multiprocessing.get_context("fork")
            queue = context.Queue(maxsize=1)
            child = context.Process(target=_run_and_put, args=(func, queue, args, kwargs), daemon=True)
            child.start()
            try:
                ok, value = queue.get(timeout=seconds)
            except Exception:  # queue.Empty: the deadline passed
                raise TimeoutError(f"{name} timed out after {seconds} s") from None
            finally:
                if child.is_alive():
                    child.kill()
                child.join()
            if not ok:
                raise value
            return value

        return with_signal if use_signals else in_process

    return decorator


@contextlib.contextmanager
def temp_env_var(key: str, value: str) -> Iterator[None]:
    """Set the environment variable ``key`` to ``value`` inside the ``with`` block; afterwards (also on an
    exception) restore its previous value, or remove it if it was unset. Nests."""
    previous = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous
