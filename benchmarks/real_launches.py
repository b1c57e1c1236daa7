"""The public launches of tests/fixtures/launches/real/, each read as it is: which are predicted, which are refused
and why.

    python benchmarks/real_launches.py    # writes benchmarks/results/real_launches.json (a few minutes)

Megatron-LM-style launches (scripts, flag files, functional-test yaml): `mat estimate --megatron-args FILE --gpu
H100-SXM` (read and predicted, `launch_to_specs` then `estimate`). verl launches: `mat rlhf --verl-args FILE --gpu
H100-SXM --top-k 1`. No `--var`, no `--model`. tests/specs/test_real_launches.py and
tests/rlhf/test_real_verl_launches.py hold the same lists, with each refusal's reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the corpus's reader lives with the tests

from tests.specs.real_launches import SOURCE, fixtures, helpers, materialize  # noqa: E402

from megatron_autotuner import __version__  # noqa: E402
from megatron_autotuner.cli import main as mat  # noqa: E402
from megatron_autotuner.costmodel.estimate import CostOptions, estimate  # noqa: E402
from megatron_autotuner.errors import AutotunerError  # noqa: E402
from megatron_autotuner.specs import get_gpu_spec  # noqa: E402
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch_file  # noqa: E402

OUT = ROOT / "benchmarks/results/real_launches.json"
GPU = "H100-SXM"


def megatron_reason(path: Path) -> str | None:
    """None when the launch is predicted; else its one-line refusal."""
    try:
        imported = launch_to_specs(read_launch_file(str(path)))
        if imported.model is None or imported.parallel is None:
            return "the launch does not describe the model"
        estimate(
            imported.model, imported.parallel, imported.workload, get_gpu_spec(GPU), CostOptions(**imported.options)
        )
    except AutotunerError as exc:
        return str(exc)
    return None


def verl_reason(path: Path, out_dir: Path) -> str | None:
    """None when `mat rlhf` plans the launch; else the line it printed."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = mat(["rlhf", "--verl-args", str(path), "--gpu", GPU, "--json", "--top-k", "1", "--output-dir",
                  str(out_dir)])  # fmt: skip
    return None if rc == 0 else err.getvalue().strip().removeprefix("mat: error: ")


def _group(name: str, tree: dict[str, Path], reason) -> dict:
    rows = []
    for fixture in fixtures(name):
        if fixture.name in helpers(name):
            continue
        source = SOURCE.match(fixture.read_text().partition("\n")[0])
        why = reason(tree[fixture.name])
        rows.append({"name": fixture.name, "repository": f"{source.group(1)}/{source.group(2)}",
                     "predicted": why is None, "reason": why})  # fmt: skip
        print(f"{name}: {fixture.name}: {'predicted' if why is None else why}", flush=True)
    return {"count": len(rows), "predicted": sum(r["predicted"] for r in rows), "rows": rows}


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        groups = {
            "megatron": _group("megatron", materialize("megatron", work / "megatron"), megatron_reason),
            "verl": _group("verl", materialize("verl", work / "verl"), lambda p: verl_reason(p, work / "out")),
        }
    doc = {"tool_version": __version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": GPU,
           "groups": groups}  # fmt: skip
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    for name, group in groups.items():
        print(f"{name}: {group['predicted']} of {group['count']} predicted as-is")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
