import importlib.util
import os
import shutil
import tempfile

import pytest

# torch.compile's caches default to one folder per machine user (/tmp/torchinductor_<user>, triton's ~/.triton):
# a run killed mid-compile there once left a 0-byte .so that failed every later run on that machine. This test run
# keeps its own (set before anything imports torch; subprocesses inherit them) and removes them at the end.
_COMPILE_CACHE = tempfile.mkdtemp(prefix="mat-tests-compile-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(_COMPILE_CACHE, "inductor"))
os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(_COMPILE_CACHE, "triton"))


def pytest_unconfigure(config):
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
