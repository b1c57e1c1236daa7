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


# A run that must not skip: with MAT_TESTS_FAIL_ON_SKIP=1 a test that would skip (a framework that does not import,
# a missing tool) fails instead, naming the reason. CI sets it for the export checks in the frameworks' environment,
# which would otherwise pass with every framework test skipped; a plain `pytest` run skips as before.
FAIL_ON_SKIP_VAR = "MAT_TESTS_FAIL_ON_SKIP"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and os.environ.get(FAIL_ON_SKIP_VAR) == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{FAIL_ON_SKIP_VAR}=1 and this test skipped: {reason}"
