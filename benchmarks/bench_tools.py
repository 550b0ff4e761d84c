"""What a tool call costs: the sandboxed Python interpreter per run (alone and 4 at once) and the calculator.

    python benchmarks/bench_tools.py [--runs 20]

Prints the mean and the slowest of each; the sandbox's cost is the namespaces, the new root and a fresh interpreter
(``python -I -S``) per call.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from statistics import mean

from verl.tools.calculator_tool import CalculatorTool
from verl.tools.python_sandbox_tool import PythonSandboxTool


async def timed(coro) -> float:
    start = time.perf_counter()
    await coro
    return time.perf_counter() - start


async def measure(runs: int) -> None:
    sandbox = PythonSandboxTool({"type": "native"}, None)
    calculator = CalculatorTool({"type": "native"}, None)
    code = {"code": "print(sum(range(1000)))"}
    await sandbox.execute("warm-up", code)
    alone = [await timed(sandbox.execute(str(i), code)) for i in range(runs)]
    start = time.perf_counter()
    await asyncio.gather(*(sandbox.execute(str(i), code) for i in range(runs)))
    together = time.perf_counter() - start
    calc = [await timed(calculator.execute(str(i), {"expression": "12 * (3 + 4)"})) for i in range(runs)]
    print(f"python sandbox, one at a time: mean {mean(alone) * 1e3:.1f} ms, slowest {max(alone) * 1e3:.1f} ms")
    print(f"python sandbox, {runs} calls 4 at a time: {together:.2f} s ({together / runs * 1e3:.1f} ms per call)")
    print(f"calculator: mean {mean(calc) * 1e6:.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    asyncio.run(measure(parser.parse_args().runs))


if __name__ == "__main__":
    main()
