"""Shared fixtures of the trace tests."""

import pytest

import megatron_autotuner.cli as cli
from megatron_autotuner.cli import trace_cmd


@pytest.fixture
def mat(monkeypatch, capsys):
    """Run `mat ...` through the real CLI entry point; returns (exit code, stdout, stderr)."""
    if trace_cmd not in cli.COMMAND_MODULES:
        monkeypatch.setattr(cli, "COMMAND_MODULES", [*cli.COMMAND_MODULES, trace_cmd])

    def run(*argv: str):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's own errors (a bad number, a malformed R=US): exit code 2
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run
