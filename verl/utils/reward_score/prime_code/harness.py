"""The program that checks a solution against its test cases, run inside the sandbox (standard library only).

:func:`verl.utils.reward_score.prime_code.testing_util.run_test` sends this file's source followed by
``main(<payload JSON>)``; it writes one line ``<marker><result JSON>`` to the stdout it had at start, while the
solution's own stdout and stderr go to /dev/null (or to the capture of a standard-input case).

Payload: ``{"in_outs": {"inputs": [...], "outputs": [...], "fn_name": optional}, "test": code, "timeout": s,
"marker": str}``. Result: ``{"results": [...], "metadata": {...}}``, one result per case checked until the first
failure: ``True``; ``False`` (wrong answer); ``-1`` (runtime error or a case over ``timeout`` seconds); ``-2``
(the solution does not compile or load, or lacks ``fn_name``) — the APPS codes veRL's ``run_test`` uses.

Two kinds of problems, as in APPS:

- call-based (``fn_name`` set): each input is lines of JSON, one per argument; the function (or
  ``Solution().<fn_name>`` when the code defines ``class Solution``) must return the JSON-decoded output (a tuple
  counts as a list; an expected ``[x]`` also accepts ``x``);
- standard input (no ``fn_name``): the program runs as ``__main__`` once per case with the input as
  ``sys.stdin`` (and as ``open(0)``); its stdout must equal the expected text up to surrounding whitespace, per-line
  whitespace and blank lines, or be numerically close line by line (``|a - b| <= 1e-8 + 1e-5 |b|``).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import signal
import sys
import traceback

# Names the solution may use without importing them (the prelude of APPS-style harnesses).
PRELUDE = """from string import *
from re import *
from datetime import *
from collections import *
from heapq import *
from bisect import *
from copy import *
from math import *
from random import *
from statistics import *
from itertools import *
from functools import *
from operator import *
from io import *
from sys import *
from json import *
from builtins import *
from typing import *
import string, re, datetime, collections, heapq, bisect, copy, math, random, statistics, itertools, functools
import operator, io, sys, json
sys.setrecursionlimit(600000)
"""
TRUNCATE = 300


class CaseTimeout(BaseException):
    """A case (or loading the solution) ran past the time limit (a BaseException: ``except Exception`` in the
    solution does not swallow it)."""


def _on_alarm(signum, frame):
    raise CaseTimeout("time limit exceeded")


def _truncate(text, length=TRUNCATE):
    text = str(text)
    return text if len(text) <= length else text[: length // 2] + "...(truncated) ..." + text[-length // 2 :]


def _error(exc):
    """veRL's error metadata: the exception and its traceback from the solution's first frame on."""
    text = traceback.format_exc()
    start = text.find('File "<string>"')
    text = "Traceback (most recent call last):\n  " + text[start:] if start >= 0 else text
    return {"error": repr(exc), "traceback": _truncate(text, 2000)}


class _Timer:
    def __init__(self, seconds):
        self.seconds = seconds

    def __enter__(self):
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)


def _int_keys(value):
    """JSON makes dict keys strings; a ``[{"1": ...}]`` or ``{"1": ...}`` gets its int keys back (as APPS does)."""
    try:
        if isinstance(value, dict):
            return [{int(k): v for k, v in value.items()}]
        if isinstance(value, list) and value and isinstance(value[0], dict):
            return [{int(k): v for k, v in value[0].items()}]
    except (TypeError, ValueError):
        pass
    return value


def _call_matches(output, expected):
    if isinstance(output, tuple):
        output = list(output)
    if output == expected:
        return True
    if isinstance(expected, list) and expected:
        if output == expected[0]:
            return True
        if isinstance(output, list) and output and isinstance(output[0], tuple):
            return [list(x) for x in output] == expected[0]
    return False


def _is_int_text(value):
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


def _close(a, b):
    return a == b or abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def _stdout_matches(output, expected):
    if isinstance(expected, list):
        expected = "\n".join(expected)
    lines = output.splitlines()
    if "\n".join(lines).strip() == expected.strip():
        return True
    if "\n".join(line.strip() for line in lines).strip() == expected.strip():
        return True
    expected_lines = [line.strip() for line in expected.split("\n") if line]
    got = [line for line in lines if line]
    if lines == expected_lines or got == expected_lines:
        return True
    if len(got) != len(expected_lines) or all(_is_int_text(a) and _is_int_text(b) for a, b in zip(got, expected_lines)):
        return False
    try:
        return all(_close(float(a), float(b)) for a, b in zip(got, expected_lines))
    except ValueError:
        return False


def _call_based(in_outs, code, timeout):
    fn_name = in_outs["fn_name"]
    namespace = {"__name__": "solution"}
    try:
        with _Timer(timeout):
            exec(compile(PRELUDE + code, "<string>", "exec"), namespace)
            target = namespace["Solution"]() if "class Solution" in code else namespace
            method = getattr(target, fn_name) if "class Solution" in code else target[fn_name]
    except BaseException as exc:
        return [-2], _error(exc)
    results = []
    for raw_inputs, raw_output in zip(in_outs["inputs"], in_outs["outputs"]):
        try:
            args = _int_keys([json.loads(line) for line in raw_inputs.split("\n")])
            expected = _int_keys(json.loads(raw_output))
        except ValueError as exc:
            results.append(-1)
            return results, _error(exc)
        try:
            with _Timer(timeout):
                output = method(*args)
        except BaseException as exc:
            results.append(-1)
            return results, _error(exc)
        ok = bool(_call_matches(output, expected))
        results.append(ok)
        if not ok:
            return results, _wrong(_as_json(output), raw_output, raw_inputs)
    return results, {}


def _as_json(value):
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _wrong(shown, expected, inputs):
    return {
        "output": _truncate(shown, 200),
        "expected": _truncate(expected, 200),
        "inputs": _truncate(inputs),
        "error_message": "Wrong Answer",
    }


def _standard_input(in_outs, code, timeout):
    try:
        program = compile(PRELUDE + code, "<string>", "exec")
    except BaseException as exc:
        return [-2], _error(exc)
    real_open, real_stdin = builtins.open, sys.stdin
    results = []
    for raw_inputs, expected in zip(in_outs["inputs"], in_outs["outputs"]):
        if isinstance(raw_inputs, list):
            raw_inputs = "\n".join(raw_inputs)
        captured = io.StringIO()

        def fake_open(file, *args, _text=raw_inputs, **kwargs):
            if file in (0, "/dev/stdin"):
                return io.StringIO(_text)
            return real_open(file, *args, **kwargs)

        sys.stdin, sys.stdout, builtins.open = io.StringIO(raw_inputs), captured, fake_open
        try:
            with _Timer(timeout):
                try:
                    exec(program, {"__name__": "__main__"})
                except SystemExit:
                    pass
        except BaseException as exc:
            results.append(-1)
            return results, _error(exc)
        finally:
            sys.stdin, sys.stdout, builtins.open = real_stdin, sys.__stdout__, real_open
        output = captured.getvalue()
        ok = _stdout_matches(output, expected)
        results.append(ok)
        if not ok:
            return results, _wrong(output, expected, raw_inputs)
    return results, {}


def main(payload_json):
    """Check the payload's solution and write the marked result line to the original stdout."""
    payload = json.loads(payload_json)
    report = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    sys.stdout = sys.__stdout__ = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the program
    sys.stderr = sys.__stderr__ = sys.stdout
    signal.signal(signal.SIGALRM, _on_alarm)
    in_outs, code, timeout = payload["in_outs"], payload["test"], float(payload["timeout"])
    if in_outs.get("fn_name") is None:
        results, metadata = _standard_input(in_outs, code, timeout)
    else:
        results, metadata = _call_based(in_outs, code, timeout)
    report.write("\n" + payload["marker"] + json.dumps({"results": results, "metadata": metadata}) + "\n")
    report.flush()
