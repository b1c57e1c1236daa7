"""Ground truth from megatron-core, built once per test session for every module that asks for it."""

from __future__ import annotations

import pytest

from tests.mcore_helpers import run_worlds


@pytest.fixture(scope="session")
def mcore_ground_truth(request, tmp_path_factory) -> dict:
    """{case name: per-rank results} for the `MCORE_CASES` of every collected module that uses `mcore_counts`:
    one `run_worlds` for all of them, so each world size's ranks import torch and megatron-core once (about 7 s of
    CPU per process on the CI machine) rather than once per module."""
    modules = {item.module for item in request.session.items if "mcore_counts" in getattr(item, "fixturenames", ())}
    cases = [case for module in sorted(modules, key=lambda m: m.__name__) for case in module.MCORE_CASES]
    return run_worlds(cases, tmp_path_factory.mktemp("mcore"), timeout_s=300)
