"""Where code may import from (DESIGN.md: arrows only point down the package list). Read from the sources with
ast, so a lazy import inside a function counts too."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "megatron_autotuner"


def imports_of(path: Path) -> set[str]:
    """Absolute module names `path` imports (relative imports resolved against its package)."""
    module = ".".join(("megatron_autotuner", *path.relative_to(PACKAGE).with_suffix("").parts))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def modules_under(sub: str) -> list[Path]:
    return sorted((PACKAGE / sub).rglob("*.py"))


@pytest.mark.parametrize("sub", [p.name for p in sorted(PACKAGE.iterdir()) if p.is_dir() and p.name != "cli"])
def test_only_the_cli_imports_the_cli(sub):
    for path in modules_under(sub):
        bad = {m for m in imports_of(path) if m == "megatron_autotuner.cli" or m.startswith("megatron_autotuner.cli.")}
        assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


def test_the_torchrun_plumbing_is_the_launch_package_s():
    """testbench, validate and overlap start, watch and kill jobs through `launch`, not through each other."""
    for sub in ("validate", "overlap"):
        for path in modules_under(sub):
            borrowed = {m for m in imports_of(path) if m.startswith("megatron_autotuner.testbench.launcher")}
            borrowed -= {"megatron_autotuner.testbench.launcher", "megatron_autotuner.testbench.launcher.run_cases"}
            assert not borrowed, f"{path.relative_to(PACKAGE)} borrows {sorted(borrowed)}"
    for path in modules_under(""):
        if "subprocess.Popen" in path.read_text() and path.parent.name != "launch":
            pytest.fail(f"{path.relative_to(PACKAGE)} starts processes itself (use launch.start_job)")


def test_overlap_worker_and_backends_form_no_cycle():
    """The worker makes backends; a backend needs nothing from the worker (the job protocol is in jobs.py)."""
    backends = imports_of(PACKAGE / "overlap" / "backends.py")
    assert not any(m.startswith("megatron_autotuner.overlap.worker") for m in backends)


def test_the_library_holds_no_published_run_comparison():
    assert not (PACKAGE / "costmodel" / "published.py").exists()
    assert not (PACKAGE / "costmodel" / "measured.py").exists()
