"""tensordict without torch._dynamo: the marks tensordict sets for ``torch.compile`` are the same, set when dynamo
is imported; and the driver's config validation imports neither torch nor the training stack.

Each check runs in a fresh interpreter (what is imported is the point).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# tensordict imported the plain way (torch._dynamo first): the marks it sets, by decorator and function name
PLAIN = """
import json, torch._dynamo, torch.compiler
marks = []
for name in ("allow_in_graph", "assume_constant_result"):
    real = getattr(torch.compiler, name)
    def record(fn, name=name, real=real):
        marks.append([name, f"{fn.__module__}.{getattr(fn, '__qualname__', fn.__name__)}"])
        return real(fn)
    setattr(torch.compiler, name, record)
import tensordict
print(json.dumps(sorted(marks)))
"""

# through verl: dynamo not imported; the same marks wait, and are set once dynamo is imported
DEFERRED = """
import json, sys
import verl.protocol, verl.workers.fsdp_workers
from verl.utils.tensordict_import import deferred_marks
loaded = [m for m in ("torch._dynamo", "torch.distributed.tensor", "torch.distributed.checkpoint") if m in sys.modules]
waiting = deferred_marks()
names = sorted([n, f"{fn.__module__}.{getattr(fn, '__qualname__', fn.__name__)}"] for n, fn in waiting)
import torch._dynamo
from torch._dynamo import trace_rules
allowed = all(id(fn) in trace_rules._allowed_callable_ids for n, fn in waiting if n == "allow_in_graph")
constant = all(getattr(fn, "_dynamo_marked_constant", False) for n, fn in waiting if n == "assume_constant_result")
left = len(deferred_marks())
print(json.dumps({"loaded": loaded, "marks": names, "allowed": allowed, "constant": constant, "left": left}))
"""


def _run(code: str) -> object:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_deferred_marks_are_tensordicts_own_and_land_when_dynamo_is_imported():
    plain, deferred = _run(PLAIN), _run(DEFERRED)
    assert plain, "tensordict set no marks: nothing to compare"
    # the worker stack imports none of dynamo, DTensor or DCP until they are used
    assert deferred["loaded"] == []
    assert deferred["marks"] == plain  # the same decorators on the same functions
    assert deferred["allowed"] and deferred["constant"] and deferred["left"] == 0


def test_driver_validation_imports_neither_torch_nor_the_trainer():
    code = (
        "import sys\n"
        "from verl.trainer.config.validate import merged, validate_config\n"
        "from verl.trainer.main_ppo import with_demo_preset\n"
        "validate_config(with_demo_preset(merged([]), []))\n"
        "bad = [m for m in ('torch', 'tensordict', 'verl.trainer.ppo.ray_trainer') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('[]')\n"
    )
    # the demo's assets are built (with torch) once per cache; the claim is about a run that finds them built
    _run(
        "from verl.trainer.config.validate import merged\nfrom verl.trainer.main_ppo import with_demo_preset\n"
        "with_demo_preset(merged([]), [])\nprint('[]')\n"
    )
    assert _run(code) == []
