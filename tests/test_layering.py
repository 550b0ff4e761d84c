"""The package layering: arrows point down.

``verl.trainer`` (the driver) sits on top; the workers, the algorithms, the protocol, the checkpoint engine, the
single controller, the model merger and the utilities sit below it and never import it, at module level or inside a
function (``import``, ``from ... import``, and ``importlib.import_module("...")`` / ``__import__("...")`` with a
literal name all count). Inside ``verl.protocol`` the submodules import each other one way only, with no cycle at
module level.
"""

from __future__ import annotations

import ast
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERL = ROOT / "verl"

# Code below the trainer: a module whose path starts with one of these never imports ``verl.trainer``.
LOWER_LAYERS = (
    "verl/workers/",
    "verl/utils/",
    "verl/checkpoint_engine/",
    "verl/protocol/",
    "verl/algorithms/",
    "verl/single_controller/",
    "verl/model_merger/",
    "verl/experimental/",
    "verl/base_config.py",
    "verl/version.py",
    "verl/__init__.py",
)
UPPER = "verl.trainer"

# (module, imported name) pairs allowed to reach up, each with its reason.
EXEMPT: dict[tuple[str, str], str] = {
    # veRL's public path ``verl.utils.config.validate_config`` checks a whole *trainer* config, so it needs the
    # trainer's validator; the import runs only when the function is called (never at import time), and moving the
    # validator down would drag the whole trainer config schema (its not-implemented tables, reward and data
    # sections) into verl.utils.
    ("verl.utils.config", "verl.trainer.config.validate"),
    # veRL 0.10's path of the older-reward-keys migration, a rule of the trainer config (its aliases and defaults);
    # imported when the function is called
    ("verl.experimental.reward_loop", "verl.trainer.config.layout"),
}


@dataclass(frozen=True)
class Import:
    """One import statement (or ``importlib.import_module`` call) found in a module."""

    module: str  # the importing module, dotted
    path: str  # its file, relative to the repository root
    line: int
    name: str  # the absolute dotted name imported (``from a.b import c`` gives ``a.b.c``)
    top_level: bool  # executed when the module is imported (not inside a function)


def module_name(path: Path) -> str:
    """Dotted module name of a file under the repository root (``verl/a/__init__.py`` → ``verl.a``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """Absolute name of a (possibly relative) ``from`` import inside ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _is_import_module_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")


def imports_of(path: Path) -> list[Import]:
    """Every import of the file, with whether it runs at module import time."""
    module = module_name(path)
    rel = path.relative_to(ROOT).as_posix()
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    found: list[Import] = []

    def visit(node: ast.AST, top_level: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(module, rel, node.lineno, alias.name, top_level) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                name = base if alias.name == "*" else f"{base}.{alias.name}"
                found.append(Import(module, rel, node.lineno, name, top_level))
        elif isinstance(node, ast.Call) and _is_import_module_call(node) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append(Import(module, rel, node.lineno, arg.value, top_level))
        inner = top_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, True)
    return found


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def upward_imports(files: list[Path]) -> list[str]:
    """``path:line: module imports name`` for every import of ``verl.trainer`` by a lower-layer file."""
    problems = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(LOWER_LAYERS):
            continue
        for imp in imports_of(path):
            if not _in(imp.name, UPPER):
                continue
            if any(imp.module == mod and _in(imp.name, name) for mod, name in EXEMPT):
                continue
            where = "module level" if imp.top_level else "inside a function"
            problems.append(f"{imp.path}:{imp.line}: {imp.module} imports {imp.name} ({where})")
    return problems


def all_modules() -> list[Path]:
    return sorted(p for p in VERL.rglob("*.py") if "__pycache__" not in p.parts)


# ------------------------------------------------------------------------------------------------------ the rule
def test_lower_layers_never_import_the_trainer():
    files = all_modules()
    assert any(p.relative_to(ROOT).as_posix().startswith("verl/algorithms/") for p in files)
    problems = upward_imports(files)
    assert not problems, "modules below verl.trainer import it (arrows must point down):\n" + "\n".join(problems)


def test_every_exemption_is_still_needed():
    for module, name in EXEMPT:
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.exists():  # a package
            path = ROOT / module.replace(".", "/") / "__init__.py"
        names = [imp for imp in imports_of(path) if _in(imp.name, name)]
        assert names, f"the exemption ({module}, {name}) is stale: drop it from EXEMPT"
        assert not any(imp.top_level for imp in names), f"{module} imports {name} at module level"


def test_the_scanner_sees_every_kind_of_import(tmp_path, monkeypatch):
    """A planted upward import (module level, in a function, relative, by importlib) is reported with its line."""
    package = tmp_path / "verl" / "workers"
    package.mkdir(parents=True)
    (package / "planted.py").write_text(
        "import importlib\n"
        "from verl.trainer.ppo import core_algos\n"
        "def f():\n"
        "    import verl.trainer.main_ppo\n"
        "    from ..trainer.config import AlgoConfig\n"
        "    __import__('verl.trainer.ppo.reward')\n"
        "    return importlib.import_module('verl.trainer.ppo.utils')\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    problems = upward_imports([package / "planted.py"])
    assert problems == [
        "verl/workers/planted.py:2: verl.workers.planted imports verl.trainer.ppo.core_algos (module level)",
        "verl/workers/planted.py:4: verl.workers.planted imports verl.trainer.main_ppo (inside a function)",
        "verl/workers/planted.py:5: verl.workers.planted imports verl.trainer.config.AlgoConfig (inside a function)",
        "verl/workers/planted.py:6: verl.workers.planted imports verl.trainer.ppo.reward (inside a function)",
        "verl/workers/planted.py:7: verl.workers.planted imports verl.trainer.ppo.utils (inside a function)",
    ]


# -------------------------------------------------------------------------------------------- the protocol package
def _module_level_graph(package: str) -> dict[str, set[str]]:
    """Module-level import edges between the submodules of ``package`` (a package of this repository)."""
    folder = ROOT / package.replace(".", "/")
    modules = {module_name(p): p for p in sorted(folder.glob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imp in imports_of(path):
            if not imp.top_level:
                continue
            for other in modules:
                # ``from verl.protocol.core import X`` names verl.protocol.core.X; the package itself only counts
                # when imported as such (``import verl.protocol`` / ``from verl.protocol import X``).
                hit = imp.name == other or (other != package and _in(imp.name, other))
                hit = hit or (other == package and imp.name.rsplit(".", 1)[0] == package)
                if hit and other != name:
                    graph[name].add(other)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def dfs(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := dfs(nxt, stack)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := dfs(node, [])):
            return cycle
    return None


def test_protocol_submodules_have_no_import_cycle():
    assert not (VERL / "protocol.py").exists() and not (VERL / "protocol_ops.py").exists()
    graph = _module_level_graph("verl.protocol")
    assert {"verl.protocol", "verl.protocol.core", "verl.protocol.ops"} <= set(graph)
    submodules = {name: deps - {"verl.protocol"} for name, deps in graph.items() if name != "verl.protocol"}
    assert not any("verl.protocol" in deps for name, deps in graph.items() if name != "verl.protocol"), (
        f"a protocol submodule imports the package __init__ (which imports it back): {graph}"
    )
    cycle = _find_cycle(submodules)
    assert cycle is None, "import cycle between verl.protocol submodules: " + " -> ".join(cycle)
    assert "verl.protocol.ops" not in graph["verl.protocol.core"], "core must not import ops at module level"


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_a_pickle_naming_the_old_protocol_path_still_loads():
    """Pickles written before the split name ``verl.protocol.DataProto``; they still load, and new ones too."""
    import torch

    from verl.protocol import DataProto
    from verl.protocol.core import DataProto as CoreDataProto

    assert DataProto is CoreDataProto
    data = DataProto.from_dict({"x": torch.arange(4)}, non_tensors={"uid": ["a", "b", "c", "d"]})
    new = pickle.dumps(data, protocol=0)  # protocol 0 names classes as text lines, so the name can be rewritten
    old = new.replace(b"verl.protocol.core\n", b"verl.protocol\n")
    assert old != new and b"verl.protocol.core" not in old
    for blob in (old, new, pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)):
        restored = pickle.loads(blob)
        assert isinstance(restored, DataProto)
        assert torch.equal(restored.batch["x"], torch.arange(4))
        assert restored.non_tensor_batch["uid"].tolist() == ["a", "b", "c", "d"]


# --------------------------------------------------------------------------------------------- veRL's old paths
@pytest.mark.parametrize(
    "old",
    [
        "_common",
        "advantages",
        "agg",
        "aux_losses",
        "core_algos",
        "cov_losses",
        "group_advantages",
        "kl",
        "otb",
        "pf_ppo",
        "policy_losses",
        "registry",
        "rollout_corr_helper",
    ],
)
def test_old_algorithm_paths_are_the_new_modules(old):
    import importlib

    new = importlib.import_module(f"verl.algorithms.{old}")
    assert importlib.import_module(f"verl.trainer.ppo.{old}") is new
    parent = importlib.import_module("verl.trainer.ppo")
    assert getattr(parent, old) is new


def test_old_config_paths_are_the_new_classes():
    import verl.algorithms.config as new
    import verl.trainer.config as package
    import verl.trainer.config.algorithm as old
    from verl.base_config import omega_conf_to_dataclass

    assert old is new
    for name in ("AlgoConfig", "KLControlConfig", "FilterGroupsConfig", "PFPPOConfig", "RolloutCorrectionConfig"):
        assert getattr(package, name) is getattr(new, name)
    built = omega_conf_to_dataclass({"_target_": "verl.trainer.config.KLControlConfig", "kl_coef": 0.5})
    assert isinstance(built, new.KLControlConfig) and built.kl_coef == 0.5


def test_registries_are_shared_through_both_paths():
    from verl.algorithms import core_algos as new
    from verl.trainer.ppo import core_algos as old

    assert old is new
    for name in ("register_adv_est", "register_policy_loss", "get_adv_estimator_fn", "get_policy_loss_fn"):
        assert getattr(old, name) is getattr(new, name)
    assert old.ADV_ESTIMATOR_REGISTRY is new.ADV_ESTIMATOR_REGISTRY
    assert old.POLICY_LOSS_REGISTRY is new.POLICY_LOSS_REGISTRY


def test_the_trainers_mixins_declare_every_attribute_they_read():
    """Each class RayPPOTrainer is composed of reads only what it declares (an annotation or a method of its own or
    of its bases): a helper never depends on an attribute of the trainer that nothing names."""
    import ast
    import inspect
    import textwrap

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    undeclared = {}
    for cls in RayPPOTrainer.__mro__[1:]:
        if cls is object:
            continue
        known = {name for base in cls.__mro__ for name in (*vars(base), *getattr(base, "__annotations__", {}))}
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        reads = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
        }
        if reads - known:
            undeclared[cls.__qualname__] = sorted(reads - known)
    assert not undeclared, undeclared
