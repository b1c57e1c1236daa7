"""Scripts of benchmarks/ loaded as modules, for tests that check what they compute (they are not a package)."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str) -> ModuleType:
    """benchmarks/NAME.py as module `benchmarks_NAME` (loaded once)."""
    key = f"benchmarks_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module  # dataclasses look their module up while the script runs
        spec.loader.exec_module(module)
    return sys.modules[key]
