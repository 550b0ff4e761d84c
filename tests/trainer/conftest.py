"""Fixtures shared by the trainer's end-to-end tests."""

from __future__ import annotations

import pytest

from tests.trainer.async_runs import run_async_modes


@pytest.fixture(scope="session")
def async_runs(tmp_path_factory):
    """The CLI runs of the async trainer modes (see ``tests/trainer/async_runs.py``), run once per session."""
    return run_async_modes(tmp_path_factory)
