"""Shared test fixtures and the suite's tiers.

- Tiers, assigned here by the fixtures a test uses (never by hand): ``e2e`` — it reads a CLI run (``cli_runs``) or
  runs a command line itself (``cli``); ``integration`` — in-process Ray (``ray_cluster``) or a gloo process group
  (``gloo``); ``unit`` — the rest. ``pytest -m unit`` runs the fast tier alone (docs/testing.md).
- The CLI runs: one scheduler for the session (`tests/cli_runs.py`), started before the first test, and a budget
  (`RUN_BUDGET`): the session fails when it starts more runs, and the summary lists each run with its wall time.
- `gpu` tests skip without CUDA; in the vllm venv (``VERL_REQUIRE_VLLM=1``) a vllm that does not import is an error,
  and so is an sglang that does not import in the sglang venv (``VERL_REQUIRE_SGLANG=1``).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
from hypothesis import settings

from tests import cli_runs as cli_runs_module

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRACKIO_DIR", tempfile.mkdtemp(prefix="verl-trackio-"))  # not ~/.cache
# The Ray workers and CLI runs the suite starts (several at once on 2 cores) compute with one thread each, as Ray's
# default gives them; main_ppo would otherwise split the cores between a run's workers (this process, whose torch
# is already loaded, keeps its threads).
torch.get_num_threads()
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Property tests draw the same examples on every run: a failure reproduces, and CI never passes by luck.
settings.register_profile("verl", derandomize=True, deadline=None)
settings.load_profile("verl")

# Logical CPUs for the test cluster: bundles are {"CPU": 1} per worker, and several groups live at once.
RAY_TEST_NUM_CPUS = int(os.environ.get("VERL_TEST_RAY_CPUS", "8"))


E2E_FIXTURES = {"cli_runs", "cli"}
INTEGRATION_FIXTURES = {"ray_cluster", "gloo"}


def tier(item: pytest.Item) -> str:
    """``e2e``, ``integration`` or ``unit``, from the fixtures ``item`` uses (directly or through other fixtures)."""
    names = set(getattr(item, "fixturenames", ()))
    if names & E2E_FIXTURES:
        return "e2e"
    return "integration" if names & INTEGRATION_FIXTURES else "unit"


def pytest_collection_modifyitems(config, items):
    skip_gpu = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        item.add_marker(tier(item))
        if skip_gpu is not None and "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_sessionstart(session):
    if os.environ.get("VERL_REQUIRE_VLLM") == "1":  # the vllm venv: its tests must run, never skip
        try:
            import vllm  # noqa: F401
        except Exception as e:
            raise pytest.UsageError(f"VERL_REQUIRE_VLLM=1 but vllm does not import here: {e!r}") from e
    if os.environ.get("VERL_REQUIRE_SGLANG") == "1":  # the sglang venv: the engine and its CPU stand-ins import
        try:
            import sgl_kernel  # noqa: F401
            import sglang  # noqa: F401
        except Exception as e:
            raise pytest.UsageError(f"VERL_REQUIRE_SGLANG=1 but sglang does not import here: {e!r}") from e


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    count, rows = cli_runs_module.summary()
    terminalreporter.write_sep("=", f"CLI runs: {count} of a budget of {cli_runs_module.RUN_BUDGET}")
    for row in rows:
        terminalreporter.write_line(row)


def pytest_sessionfinish(session, exitstatus):
    count, _ = cli_runs_module.summary()
    if count > cli_runs_module.RUN_BUDGET:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        msg = f"the suite started {count} CLI runs, over its budget of {cli_runs_module.RUN_BUDGET} (tests/cli_runs.py)"
        session.config.get_terminal_writer().line(msg, red=True)


@pytest.fixture(scope="session", autouse=True)
def cli_scheduler(request, tmp_path_factory):
    """The session's CLI runs: every run a selected test needs, started now in the background."""
    wanted = {name for item in request.session.items for name in cli_runs_module.needed_by(item)}
    scheduler = cli_runs_module.Scheduler(wanted, tmp_path_factory)
    yield scheduler
    scheduler.close()


@pytest.fixture
def cli_runs(request, cli_scheduler):
    """The CLI runs this test named with ``@needs(...)`` (reading one waits for it)."""
    names = cli_runs_module.needed_by(request.node)
    if not names:
        raise pytest.UsageError(f"{request.node.nodeid} uses cli_runs without @needs(...)")
    return cli_runs_module.RunView(cli_scheduler, names)


@pytest.fixture(scope="session")
def cli():
    """`tests.cli_runs.Cli`, for a test that runs a command line itself (one that fails before Ray, or runs in the
    vllm venv): ``cli(tmp_path, *overrides)`` runs main_ppo, ``cli.command(argv, cwd)`` another command; counted
    in the budget like the scheduled runs."""
    return cli_runs_module.Cli()


@pytest.fixture(scope="session")
def gloo():
    """`tests.dist_utils.spawn_gloo`: run a function on N ranks of a real gloo process group."""
    from tests.dist_utils import spawn_gloo

    return spawn_gloo


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster, started once for the session and shut down at its end."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=RAY_TEST_NUM_CPUS,
            include_dashboard=False,
            log_to_driver=True,
            runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}},
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 saved as a HF folder (hidden 128, 4 heads, 2 layers, vocab 256; eos 1, pad 0)."""
    from verl.utils.tiny_model import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("models") / "tiny_qwen2", seed=0)
