"""How much GPU memory outside PyTorch's caching allocator does each NCCL communicator take?

    torchrun --nproc-per-node=2 benchmarks/validation/nccl_memory.py --out nccl_memory.json

The validation runs show the memory outside the allocator (device used - reserved, `non_torch_gib`)
growing with the process groups a layout talks over (TP / DP / PP / CP / EP). This measures it step
by step on one node with torch only: after CUDA start-up and a first GEMM, then after the first
collective of each new communicator, in the patterns megatron-core uses: all-reduce, reduce-scatter
+ all-gather (distributed optimizer), all-gather alone (sequence parallel), send / recv both ways
(pipeline and ring context parallelism), all-to-all (expert parallelism). Each step uses a fresh
group, so its growth is that communicator's own. Rank 0 writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime, timezone
from pathlib import Path

GIB = 2**30
MIB_64 = 64 * 2**20


def main() -> int:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")  # lazy communicators, as in the validation worker
    rank, world = dist.get_rank(), dist.get_world_size()
    steps: list[dict] = []

    def record(step: str) -> None:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        used = (total - free) / GIB
        reserved = torch.cuda.memory_reserved() / GIB
        steps.append(
            {"step": step, "device_used_gib": used, "reserved_gib": reserved, "non_torch_gib": used - reserved}
        )

    x = torch.ones(MIB_64 // 2, device="cuda", dtype=torch.bfloat16)
    record("cuda context + 64 MiB tensor")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    record("first bf16 GEMM (cuBLAS)")
    dist.all_reduce(x)
    record("default group: all_reduce")

    def fresh_group():
        return dist.new_group(list(range(world)))

    g = fresh_group()
    dist.all_reduce(x, group=g)
    record("new group: all_reduce")
    g = fresh_group()
    shard = torch.empty(x.numel() // world, device="cuda", dtype=x.dtype)
    dist.reduce_scatter_tensor(shard, x, group=g)
    dist.all_gather_into_tensor(x, shard, group=g)
    record("new group: reduce_scatter + all_gather (distributed optimizer)")
    g = fresh_group()
    dist.all_gather_into_tensor(x, shard, group=g)
    record("new group: all_gather (sequence parallel)")
    g = fresh_group()
    peer = (rank + 1) % world
    recv = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, peer, g), dist.P2POp(dist.irecv, recv, (rank - 1) % world, g)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    record("new group: send + recv (pipeline / ring context parallel)")
    g = fresh_group()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=g)
    record("new group: all_to_all (expert parallel)")
    dist.barrier()
    for i, s in enumerate(steps):
        s["growth_gib"] = s["non_torch_gib"] - (steps[i - 1]["non_torch_gib"] if i else 0.0)
    everyone = [None] * world
    dist.all_gather_object(everyone, steps)
    if rank == 0:
        doc = {
            "kind": "nccl-communicator-memory",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(),
            "world_size": world,
            "torch": torch.__version__,
            "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
            "env": {
                k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM", "CUDA_DEVICE"))
            },
            "ranks": everyone,
        }
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        for s in steps:
            print(f"{s['step']:62s} non-torch {s['non_torch_gib']:6.3f} GiB  (+{s['growth_gib']:.3f})")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
