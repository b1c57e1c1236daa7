"""torchrun entry point: run every layout of a job file, one after another, on this rank.

    torchrun --nproc-per-node W -m megatron_autotuner.validate.worker --layouts job.json --out-dir D

Per layout: initialise megatron-core model parallelism, build, warm up, time, tear down, append one
record to D/runs/rank_<r>.jsonl (before any collective, so a rank that fails still leaves its
message), go on; a failed layout ends the job at once (exit code 3) so the next ones start in fresh processes.
Rank 0 writes the id of the layout it is on to D/runs/current_layout.txt so the
launcher can tell which layout hung. Process groups time out after `--timeout-s` seconds, so a
rank left waiting by a failed peer dies instead of hanging forever.

Memory stand-in (`--stand-in-rank R --stand-in-world-size W`, no torchrun): one process plays rank R of a
W-rank job on one GPU, over torch's fake process group (`torch.testing._internal.distributed.fake_pg`):
every collective and send / receive returns at once and moves no bytes. Each rank holds only its own
shards, so its model, optimizer and activations, and every allocation and free the caching allocator
sees, are those of that rank; received tensors hold garbage (losses are meaningless), NCCL's own buffers
and streams are absent, and step times are not real. Records say `stand_in: true`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from ..launch import append_record, exit_with_owner
from ..launch.environment import environment
from ..specs.parallel import needs_nccl_graph_register_off
from .layout import Layout
from .results import current_file, rank_file

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def set_allocator_config(layouts: list[Layout]) -> None:
    """Add `expandable_segments:True` to PYTORCH_CUDA_ALLOC_CONF when the job's layouts ask for it (before CUDA
    starts: the caching allocator reads it once), NCCL_GRAPH_REGISTER=0 beside TE CUDA graphs, and the all-to-all
    overlap's CUDA_DEVICE_MAX_CONNECTIONS. One process reads them once, so a job's layouts must agree
    (`Layout.process_settings`)."""
    settings = {lay.process_settings for lay in layouts}
    if len(settings) > 1:
        what = "expandable_segments or CUDA_DEVICE_MAX_CONNECTIONS"
        raise SystemExit(f"layouts of one job disagree on {what}: run them in separate jobs")
    expandable, connections = settings.pop() if settings else (False, 0)
    if expandable:
        current = os.environ.get(ALLOC_CONF_ENV, "")
        parts = [x for x in current.split(",") if x and not x.startswith("expandable_segments")]
        os.environ[ALLOC_CONF_ENV] = ",".join([*parts, "expandable_segments:True"])
    if any(needs_nccl_graph_register_off(lay.cuda_graph_impl, lay.expandable_segments) for lay in layouts):
        os.environ["NCCL_GRAPH_REGISTER"] = "0"
    if connections:  # the overlap's hardware queues; other layouts keep the environment's (../shared/gpu/env.sh: 1)
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)


def fake_gloo_groups(torch) -> None:
    """Make every later `new_group(backend="gloo")` a fake group too: megatron-core builds gloo groups (used for
    checkpoints) that the optimizer asks for, and a gloo group cannot stand on the fake store."""
    real_new_group = torch.distributed.new_group

    def new_group(*args, **kwargs):
        if kwargs.get("backend") == "gloo":
            kwargs["backend"] = None
        return real_new_group(*args, **kwargs)

    torch.distributed.new_group = new_group


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layouts", required=True, help="JSON list of layout objects (one world size)")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: functional tests only")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="process-group (NCCL) timeout")
    parser.add_argument("--stand-in-rank", type=int, help="memory stand-in: play this rank in one process")
    parser.add_argument("--stand-in-world-size", type=int, help="memory stand-in: of a job of this many ranks")
    args = parser.parse_args(argv)
    stand_in = args.stand_in_world_size is not None
    if stand_in != (args.stand_in_rank is not None) or (
        stand_in and not 0 <= args.stand_in_rank < args.stand_in_world_size
    ):
        parser.error("--stand-in-rank R needs --stand-in-world-size W with 0 <= R < W")
    exit_with_owner()
    layouts = [Layout.from_dict(x) for x in json.loads(Path(args.layouts).read_text())]
    set_allocator_config(layouts)
    import torch

    from .runner import run_layout

    if stand_in:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        rank, world = args.stand_in_rank, args.stand_in_world_size
        if args.device == "cuda":
            torch.cuda.set_device(0)
        torch.distributed.init_process_group(backend="fake", store=FakeStore(), rank=rank, world_size=world)
        fake_gloo_groups(torch)
    else:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(
            backend="nccl" if args.device == "cuda" else "gloo", timeout=dt.timedelta(seconds=args.timeout_s)
        )
    env = environment(args.device)
    env["pytorch_cuda_alloc_conf"] = os.environ.get(ALLOC_CONF_ENV, "")
    lead = stand_in or rank == 0  # the rank that reports progress (a stand-in is its own job)
    out_dir = Path(args.out_dir)
    current = current_file(out_dir)
    for layout in layouts:
        if layout.world_size != world:
            raise SystemExit(f"layout {layout.layout_id} needs {layout.world_size} ranks, job has {world}")
        if lead:
            current.parent.mkdir(parents=True, exist_ok=True)
            current.write_text(layout.layout_id)
        torch.distributed.barrier()
        record = run_layout(layout, args.device, out_dir, rank, args.timeout_s)
        record = {
            "layout_id": layout.layout_id,
            "layout": layout.to_dict(),
            "rank": rank,
            "world_size": world,
            "env": env,
            **({"stand_in": True} if stand_in else {}),
            **record,
        }
        append_record(rank_file(out_dir, rank), record)
        if lead:
            times = record["measured"].get("step_times_s") or []
            detail = record.get("error") or (f"{1e3 * sorted(times)[len(times) // 2]:.1f} ms/step" if times else "")
            print(f"[{record['status']}] {layout.label} ({layout.layout_id}): {detail}", flush=True)
        if record["status"] != "ok":
            # a failed layout can leave NCCL work or a peer mid-collective: end the job now (torchrun stops the
            # other ranks) and let the launcher restart a fresh one with the layouts after it, instead of
            # hanging until the process-group timeout
            sys.stdout.flush()
            os._exit(3)
    if lead and current.exists():
        current.unlink()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
