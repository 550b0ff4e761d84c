"""veRL's path of :mod:`verl.algorithms.config`: importing it gives that very module (the ``algorithm.*`` schemas)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("verl.algorithms.config")
