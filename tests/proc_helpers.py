"""Real CPU jobs in tests: the environment their workers need, a tiny model for them, and which processes are
still alive (a killed job must not leave ranks behind; Linux /proc)."""

import os
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def cpu_job_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """Variables a torchrun job of this checkout needs on a CPU machine: the sources on PYTHONPATH, no CUDA, one
    thread per rank (2-core CI machines)."""
    base = dict(os.environ if base is None else base)
    path = os.pathsep.join(p for p in (SRC, base.get("PYTHONPATH")) if p)
    return {**base, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def write_tiny_model(path: Path) -> str:
    """A 2-layer GQA model megatron-core builds in a second on CPU, saved as JSON; returns the path."""
    from megatron_autotuner.specs import ModelSpec

    ModelSpec(name="tiny", hidden_size=64, num_layers=2, num_attention_heads=4, num_query_groups=2,
              ffn_hidden_size=128, vocab_size=256, max_position_embeddings=128).save_json(path)  # fmt: skip
    return str(path)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose arguments contain `text`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        line = " ".join(a.decode(errors="replace") for a in args if a)
        if text in line and state != "Z":
            found.append(line)
    return found
