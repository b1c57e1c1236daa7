import importlib.util
import os
import shutil
import tempfile

import pytest

# torch.compile's caches default to one folder per machine user (/tmp/torchinductor_<user>, triton's ~/.triton):
# a run killed mid-compile there once left a 0-byte .so that failed every later run on that machine. This test run
# keeps its own (set before anything imports torch; subprocesses and pytest-xdist's workers inherit them, so only the
# process that made the folder removes it at the end).
_CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}
_COMPILE_CACHE = None
if any(var not in os.environ for var in _CACHE_VARS):
    _COMPILE_CACHE = tempfile.mkdtemp(prefix="mat-tests-compile-")
    for var, folder in _CACHE_VARS.items():
        os.environ.setdefault(var, os.path.join(_COMPILE_CACHE, folder))


def pytest_unconfigure(config):
    if _COMPILE_CACHE is not None:
        shutil.rmtree(_COMPILE_CACHE, ignore_errors=True)


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
