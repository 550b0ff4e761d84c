"""Waiting for Ray actors in tests.

An actor's constructor runs in a fresh worker process; at the suite's busiest moments (its first Ray tests beside
the CLI runs on 2 cores) that start can take minutes. A fixture waits for it under a deadline of its own and fails
with Ray's view of the actors, rather than letting the first call hit the test's bare timeout."""

from __future__ import annotations

import pytest
import ray

# an actor start is allowed this long; modules that start actors in a fixture give their tests a timeout above it
READY_TIMEOUT_S = 480


def wait_until_up(actors: list, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait for the actors' constructors; past ``timeout_s`` fail with Ray's own view of them (state, pid, death
    cause). A constructor that raised raises here."""
    ready, _ = ray.wait([a.__ray_ready__.remote() for a in actors], num_returns=len(actors), timeout=timeout_s)
    if len(ready) < len(actors):
        from ray._private import state  # the GCS's actor table: works without the dashboard

        ids = {a._actor_id.hex() for a in actors}
        seen = {k: (v["State"], v.get("Pid"), v.get("DeathCause")) for k, v in state.actors().items() if k in ids}
        pytest.fail(f"{len(ready)} of {len(actors)} actors up after {timeout_s:.0f} s; Ray's view: {seen}")
    ray.get(ready)
