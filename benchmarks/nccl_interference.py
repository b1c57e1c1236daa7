"""How much slower do compute kernels run while an NCCL collective runs beside them, and the collective beside them?

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node=4 benchmarks/nccl_interference.py --out $OUT/nccl_interference.json

Overlapped communication is not free: an NCCL kernel keeps one CTA per channel resident on an SM for its whole
run (24 CTAs of 544 threads for the 4-GPU ring reduce-scatter / all-gather in the H200 traces of
benchmarks/results/scaling_pairs_h200_x4), and its copies share HBM bandwidth. In those traces, the compute kernels
that ran beside the data-parallel reduce-scatter / all-gather took 30% longer than the same kernels on one GPU.

Per collective of the training step (fp32 gradient reduce-scatter and bf16 all-gather of 160 MB DDP buckets, the
bf16 TP all-reduce, the ring send/recv of CP / PP, the EP all-to-all): a bf16 GEMM (compute-bound) and a bf16
add (HBM-bound) are timed alone, then again on the compute stream while the collective loops on a second stream on
every rank; the collective's own time is taken alone and beside the GEMMs. Every figure is the median over
`--iters` timings (CUDA events), rank 0's, after `--warmup`. Keep NCCL_NVLS_ENABLE=0: NVLink multicast is off on
these machines.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics

GEMM_N = 8192  # a square bf16 GEMM: ~1.1 TFLOP, ~1.6 ms on an H100/H200
ADD_BYTES = 2**30  # the add reads two 1 GiB tensors and writes one: HBM-bound
BUCKET_BYTES = 160_000_000  # a 40 M-parameter DDP bucket of fp32 gradients (megatron-core's default bucket)


def main() -> None:
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "set NCCL_NVLS_ENABLE=0 (NVLink multicast is off here)"
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    comm_stream = torch.cuda.Stream()

    a = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(GEMM_N, GEMM_N, dtype=torch.bfloat16, device="cuda")
    x = torch.ones(ADD_BYTES // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.ones_like(x)
    z = torch.empty_like(x)
    kernels = {"gemm": lambda: torch.mm(a, b), "hbm_add": lambda: torch.add(x, y, out=z)}

    grads = torch.empty(BUCKET_BYTES // 4, dtype=torch.float32, device="cuda")
    grad_shard = torch.empty(grads.numel() // world, dtype=torch.float32, device="cuda")
    params = torch.empty(BUCKET_BYTES // 4, dtype=torch.bfloat16, device="cuda")
    param_shard = torch.empty(params.numel() // world, dtype=torch.bfloat16, device="cuda")
    act = torch.empty(64 * 2**20 // 2, dtype=torch.bfloat16, device="cuda")  # a 64 MiB activation
    act_out = torch.empty_like(act)
    ring = [(rank + 1) % world, (rank - 1) % world]

    def sendrecv() -> None:
        ops = [dist.P2POp(dist.isend, act, ring[0]), dist.P2POp(dist.irecv, act_out, ring[1])]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    collectives = {
        "reduce_scatter_fp32": lambda: dist.reduce_scatter_tensor(grad_shard, grads),
        "all_gather_bf16": lambda: dist.all_gather_into_tensor(params, param_shard),
        "all_reduce_bf16": lambda: dist.all_reduce(act),
        "sendrecv_bf16": sendrecv,
        "all_to_all_bf16": lambda: dist.all_to_all_single(act_out, act),
    }

    def timed(fn, stream, repeat: int) -> float:
        """Milliseconds of `repeat` back-to-back calls of fn on `stream`."""
        with torch.cuda.stream(stream):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeat):
                fn()
            end.record()
        return start, end

    def median_ms(fn, stream, repeat: int) -> float:
        for _ in range(args.warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            dist.barrier()
            start, end = timed(fn, stream, repeat)
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / repeat)
        return statistics.median(times)

    main_stream = torch.cuda.current_stream()

    def interleaved_ms(cfn) -> dict[str, float]:
        """20 GEMMs, each issued right after one collective on the other stream (as megatron-core's DDP issues a
        bucket's reduce-scatter between backward kernels): the loop's time per pair, beside each alone."""
        g_ms = median_ms(kernels["gemm"], main_stream, 20)
        c_ms = median_ms(cfn, comm_stream, 20)
        loop = []
        for _ in range(args.iters):
            dist.barrier()
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            start.record(main_stream)
            comm_stream.wait_stream(main_stream)
            for _ in range(20):
                with torch.cuda.stream(comm_stream):
                    cfn()
                kernels["gemm"]()
            end_main, end_comm = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            end_main.record(main_stream)
            end_comm.record(comm_stream)
            torch.cuda.synchronize()
            loop.append(max(start.elapsed_time(end_main), start.elapsed_time(end_comm)) / 20)
        return {"gemm_alone_ms": g_ms, "collective_alone_ms": c_ms, "pair_ms": statistics.median(loop)}

    alone = {name: median_ms(fn, main_stream, 20) for name, fn in kernels.items()}
    rows = []
    for coll, cfn in collectives.items():
        comm_alone = median_ms(cfn, comm_stream, 5)
        for kname, kfn in kernels.items():
            # enough collectives to outlast 20 kernels, started first so the kernels run beside them throughout
            # (the largest count any rank asks for: every rank must call the collective as often)
            n = torch.tensor([max(2, int(2.5 * 20 * alone[kname] / max(comm_alone, 1e-3)) + 1)], device="cuda")
            dist.all_reduce(n, op=dist.ReduceOp.MAX)
            n_comm = int(n.item())
            beside, comm_beside = [], []
            for _ in range(args.iters):
                dist.barrier()
                torch.cuda.synchronize()
                c_start, c_end = timed(cfn, comm_stream, n_comm)
                k_start, k_end = timed(kfn, main_stream, 20)
                # the collective beside the kernels: its first calls, while the 20 kernels still run
                torch.cuda.synchronize()
                beside.append(k_start.elapsed_time(k_end) / 20)
                comm_beside.append(c_start.elapsed_time(c_end) / n_comm)
            k_ms = statistics.median(beside)
            rows.append(
                {
                    "collective": coll,
                    "kernel": kname,
                    "kernel_alone_ms": alone[kname],
                    "kernel_beside_ms": k_ms,
                    "kernel_slowdown": k_ms / alone[kname],
                    "collective_alone_ms": comm_alone,
                    "collective_calls": n_comm,
                    # the whole loop's average: the part beside the kernels and the rest alone
                    "collective_loop_ms": statistics.median(comm_beside),
                }
            )
            if rank == 0:
                r = rows[-1]
                print(
                    f"{coll:20s} {kname:8s} alone {r['kernel_alone_ms']:.3f} ms beside {k_ms:.3f} ms "
                    f"(x{r['kernel_slowdown']:.3f}); collective alone {comm_alone:.3f} ms",
                    flush=True,
                )
    # the kernels alone again: a drift of the GPU's clock over the run shows as a change here
    alone_after = {name: median_ms(fn, main_stream, 20) for name, fn in kernels.items()}
    pairs = {coll: interleaved_ms(cfn) for coll, cfn in collectives.items()}
    if rank == 0:
        print("alone before", alone, "after", alone_after, flush=True)
        for coll, row in pairs.items():
            print(coll, row, flush=True)
        doc = {
            "kind": "nccl-interference",
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(),
            "num_sms": torch.cuda.get_device_properties(0).multi_processor_count,
            "ranks": world,
            "torch": torch.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
            "gemm_n": GEMM_N,
            "add_bytes": ADD_BYTES,
            "bucket_bytes": BUCKET_BYTES,
            "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            "kernel_alone_after_ms": alone_after,
            "rows": rows,
            "interleaved": pairs,
        }
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
