"""Time NCCL all-gather / reduce-scatter / all-reduce / all-to-all / ring send-recv per message size on 2 / 4 / 8
GPUs of one NVLink node.

    NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING \\
        torchrun --nproc-per-node=8 benchmarks/nccl_sweep.py --out $OUT/nccl_sweep_h200_x8.json

Not run yet: it needs a machine of 4 or 8 GPUs (nvidia-h200-x4 / -x8), withheld when it was written. Its output is
the per-size evidence `benchmarks/nccl_curves.py` lacks for TP 4 / 8 (only published 8-GPU plateaus are cited):
per (collective, ranks, bytes) the median of `--iters` CUDA-event timings after `--warmup` calls, back to back in
one stream as nccl-tests times them. With NCCL_DEBUG_SUBSYS=TUNING, NCCL prints its latency / bandwidth table on
rank 0 (tuning.cc), which checks `costmodel.nccl_protocols` constant by constant. Keep NCCL_NVLS_ENABLE=0: NVLink
multicast is off on these machines.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics


def main() -> None:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--min-log2", type=int, default=10)
    parser.add_argument("--max-log2", type=int, default=31)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "set NCCL_NVLS_ENABLE=0 (NVLink multicast is off here)"
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    sizes = [n for n in (2, 4, 8) if n <= world]
    groups = {n: dist.new_group(list(range(n))) for n in sizes}
    rows = []
    for n in sizes:
        if rank >= n:
            dist.barrier()
            continue
        g = groups[n]
        for p in range(args.min_log2, args.max_log2 + 1):
            nbytes = 2**p  # full buffer: all-gather output, reduce-scatter input, all-reduce buffer
            elems = nbytes // 2
            if elems % n:
                continue
            full = torch.empty(elems, dtype=torch.bfloat16, device="cuda")
            shard = torch.empty(elems // n, dtype=torch.bfloat16, device="cuda")
            out = torch.empty_like(full)
            ring = [(rank + 1) % n, (rank - 1) % n]

            def sendrecv(full=full, out=out, g=g, ring=ring):
                """The ring exchange of pipeline and ring context parallelism: send `full` to the next rank while
                receiving as much from the previous one (batched, as megatron-core's p2p_communication does)."""
                ops = [dist.P2POp(dist.isend, full, ring[0], g), dist.P2POp(dist.irecv, out, ring[1], g)]
                for req in dist.batch_isend_irecv(ops):
                    req.wait()

            calls = {
                "all_gather": lambda full=full, shard=shard, g=g: dist.all_gather_into_tensor(full, shard, group=g),
                "reduce_scatter": lambda full=full, shard=shard, g=g: dist.reduce_scatter_tensor(shard, full, group=g),
                "all_reduce": lambda full=full, g=g: dist.all_reduce(full, group=g),
                # expert parallelism's token exchange: `full` is each rank's send buffer, 1/n to every rank
                "all_to_all": lambda full=full, out=out, g=g: dist.all_to_all_single(out, full, group=g),
                "sendrecv": sendrecv,
            }
            for coll, fn in calls.items():
                for _ in range(args.warmup):
                    fn()
                torch.cuda.synchronize()
                times = []
                for _ in range(args.iters):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) * 1e3)
                rows.append({"collective": coll, "ranks": n, "bytes": nbytes, "us": statistics.median(times)})
            del full, shard, out
        dist.barrier()
    if rank == 0:
        out = {
            "kind": "nccl-sweep",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(),
            "device": torch.cuda.get_device_name(),
            "world_size": world,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_DEVICE_MAX"))},
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
