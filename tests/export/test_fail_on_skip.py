"""CI runs the framework export checks with MAT_TESTS_FAIL_ON_SKIP=1 (.ci/run), so a Megatron-Bridge or verl that does
not import in the frameworks' environment fails that step instead of skipping every check (tests/conftest.py turns
a skip into a failure). Proved here on the real fixtures, `verl_env` and `run_bridge_check`, in a pytest subprocess
where verl and Megatron-Bridge cannot be imported whatever is installed (and torch neither, only to start faster);
without the variable the same tests still skip, as on a developer's machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# None in sys.modules: `import verl...` raises ImportError and find_spec("megatron.bridge") answers None
HIDDEN = "import sys; sys.modules.update(dict.fromkeys(('verl', 'megatron.bridge', 'torch'))); import pytest; "
CHECKS = "test_verl_rejects_the_old_ref_key or test_bridge_loader_applies_every_override"


def _run_export_checks(fail_on_skip: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MAT_TESTS_FAIL_ON_SKIP"}
    if fail_on_skip:
        env["MAT_TESTS_FAIL_ON_SKIP"] = "1"
    args = ["-q", "-n0", "-p", "no:cacheprovider", "tests/export/test_framework_exports.py", "-k", CHECKS]
    code = HIDDEN + f"sys.exit(pytest.main({args!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_framework_that_does_not_import_fails_the_checks_when_skips_are_refused():
    proc = _run_export_checks(fail_on_skip=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "MAT_TESTS_FAIL_ON_SKIP=1 and this test skipped: Skipped: could not import 'verl.utils.config'" in out
    assert "MAT_TESTS_FAIL_ON_SKIP=1 and this test skipped: Skipped: megatron-bridge is not installed" in out
    summary = proc.stdout.splitlines()[-1]  # e.g. "33 deselected, 8 errors in 3.0s"
    assert "error" in summary and not {"passed", "skipped"} & set(summary.replace(",", " ").split()), summary


def test_without_the_variable_the_same_checks_skip():
    proc = _run_export_checks(fail_on_skip=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = proc.stdout.splitlines()[-1]  # e.g. "8 skipped, 33 deselected in 3.0s"
    assert "skipped" in summary and not {"passed", "failed", "error", "errors"} & set(
        summary.replace(",", " ").split()
    ), summary
