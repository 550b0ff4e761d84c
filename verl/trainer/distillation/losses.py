"""veRL's path of :mod:`verl.algorithms.distillation`: importing it gives that very module (same objects)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("verl.algorithms.distillation")
