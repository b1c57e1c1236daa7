"""What megatron-core's MoE token permutation costs on the GPU, unfused and fused.

    python benchmarks/moe_permute.py --out $OUT/moe_permute.json            # on a GPU, megatron-core + TE installed
    python benchmarks/moe_permute.py --fit benchmarks/results/moe_permute_h200/moe_permute.json

megatron-core's alltoall token dispatcher (its default `--moe-token-dispatcher-type alltoall`, and what
`mat validate` runs) moves every routed token through three steps forward and three backward, per MoE layer
(megatron/core/transformer/moe/token_dispatcher.py, moe_utils.py):
- permute (`moe_utils.permute`): without `--moe-permute-fusion`, `tokens.index_select(0, sorted_indices)`; its
  backward is autograd's `index_add_` into a zero tensor: an atomic bf16 accumulate of every routed row.
- sort by local expert (`moe_utils.sort_chunks_by_idxs`, whenever a rank holds more than one expert): a split and
  `torch.cat` forward, and again backward.
- unpermute (`moe_utils.unpermute`, no probs: the alltoall dispatcher applies them in the expert activation):
  `scatter_add_` of every routed row into the token tensor (atomic); its backward is a gather.
With `--moe-permute-fusion` the three are Transformer Engine's fused permute / sort-chunks / unpermute kernels.

The real functions run here on random top-k routing (balanced in expectation), over token counts, hidden sizes,
expert counts and top-k. Each step's forward and backward is timed on its own (CUDA events, median of `--iters`
after `--warmup`), and one iteration per shape is profiled so that the time of each kernel class is known. What the
cost model takes from this: the bytes each step streams, and the rate of the atomic accumulates, as a fraction of
the GPU's HBM bandwidth (`costmodel.defaults`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import statistics
from pathlib import Path

# (tokens on the rank, hidden, experts, top-k): the MoE shapes of the 4-GPU runs (Qwen3-30B-A3B: h 2048, 128 experts,
# top-8; reduced to 32 / 64 experts) and of larger models (h 4096: Mixtral, Qwen3-235B; top-2: Mixtral)
TOKENS = (8192, 32768)
HIDDEN = (2048, 4096)
EXPERTS = (32, 128)
TOPK = (2, 8)
LOCAL_EXPERT_GROUPS = 2  # sort chunks as an EP 2 rank does: its experts' chunks from 2 source ranks


def routing(tokens: int, experts: int, topk: int, device: str, seed: int = 0):
    """A random top-k routing map [tokens, experts] (bool) and its bf16 probabilities."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    scores = torch.rand(tokens, experts, generator=gen)
    top = scores.topk(topk, dim=-1).indices
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, top, True)
    probs = torch.zeros(tokens, experts).scatter_(1, top, 1.0 / topk)
    return routing_map.to(device), probs.to(device=device, dtype=torch.bfloat16)


def steps(tokens: int, hidden: int, experts: int, topk: int, fused: bool, device: str):
    """The dispatcher's three steps as (name, forward, backward) closures over fresh inputs."""
    import torch
    from megatron.core.transformer.moe.moe_utils import permute, sort_chunks_by_idxs, unpermute

    routing_map, probs = routing(tokens, experts, topk, device)
    routed = tokens * topk
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    grad_routed = torch.randn(routed, hidden, dtype=torch.bfloat16, device=device)
    grad_tokens = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device)
    _, _, mapping = permute(x.detach(), routing_map, probs=probs, num_out_tokens=routed, fused=fused)[:3]
    per_expert = routing_map.sum(dim=0)
    chunk_sizes = per_expert.view(LOCAL_EXPERT_GROUPS, -1)  # [source rank, local expert]
    sort_order = torch.arange(experts, device=device).view(LOCAL_EXPERT_GROUPS, -1).T.ravel()
    state: dict = {}

    def permute_fwd():
        state["out"] = permute(x, routing_map, probs=probs, num_out_tokens=routed, fused=fused)[0]

    def permute_bwd():
        state["out"].backward(grad_routed)

    def sort_fwd():
        y = grad_routed.detach().requires_grad_(True)
        state["sorted"] = sort_chunks_by_idxs(y, chunk_sizes.ravel(), sort_order, fused=fused)[0]

    def sort_bwd():
        state["sorted"].backward(grad_routed)

    def unpermute_fwd():
        y = grad_routed.detach().requires_grad_(True)
        state["unp"] = unpermute(y, mapping, restore_shape=x.shape, routing_map=routing_map, fused=fused)

    def unpermute_bwd():
        state["unp"].backward(grad_tokens)

    return [
        ("permute", permute_fwd, permute_bwd),
        ("sort_chunks", sort_fwd, sort_bwd),
        ("unpermute", unpermute_fwd, unpermute_bwd),
    ]


def time_step(fwd, bwd, warmup: int, iters: int) -> tuple[float, float]:
    """Median milliseconds of the forward and of the backward (each timed alone, CUDA events)."""
    import torch

    fwd_ms, bwd_ms = [], []
    for i in range(warmup + iters):
        times = []
        for fn in (fwd, bwd):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        if i >= warmup:
            fwd_ms.append(times[0])
            bwd_ms.append(times[1])
    return statistics.median(fwd_ms), statistics.median(bwd_ms)


def kernel_us(fwd, bwd) -> dict[str, dict[str, float]]:
    """Device microseconds per kernel name of one forward and one backward (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, dict[str, float]] = {}
    for phase, fn in (("fwd", fwd), ("bwd", bwd)):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels: dict[str, float] = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                kernels[event.name[:160]] = kernels.get(event.name[:160], 0.0) + event.device_time
        out[phase] = kernels
    return out


# What each step's kernels are charged for (`costmodel.layer.moe_dispatch_work`): per permuted element
# (T x top-k x h), per local token element (T x h) and per routing-map entry (T x E).
FIT_TERMS = ("permuted", "tokens", "routing_map")


def fit(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Least-squares device picoseconds per permuted element, per token element and per routing-map entry of each
    step, direction and mode (summed kernel time of the profiled iteration, all shapes), with the largest relative
    residual, keyed like "permute.bwd.unfused" with permuted_ps, tokens_ps, routing_map_ps and max_error."""
    import numpy as np

    samples: dict[str, list[tuple[float, ...]]] = {}
    for r in rows:
        terms = (r["tokens"] * r["topk"] * r["hidden"], r["tokens"] * r["hidden"], r["tokens"] * r["experts"])
        for name, step in r["steps"].items():
            for phase in ("fwd", "bwd"):
                key = f"{name}.{phase}.{'fused' if r['fused'] else 'unfused'}"
                samples.setdefault(key, []).append((*terms, sum(step["kernel_us"][phase].values()) * 1e6))
    out = {}
    for key, points in sorted(samples.items()):
        a = np.array(points)
        coef, *_ = np.linalg.lstsq(a[:, :3], a[:, 3], rcond=None)
        residual = np.abs(a[:, :3] @ coef - a[:, 3]) / a[:, 3]
        out[key] = {f"{t}_ps": float(c) for t, c in zip(FIT_TERMS, coef, strict=True)} | {
            "max_error": float(residual.max())
        }
    return out


def environment() -> dict:
    import torch

    env = {"date": dt.datetime.now(dt.timezone.utc).isoformat(), "torch": torch.__version__}
    env["device"] = torch.cuda.get_device_name(0)
    try:
        import megatron.core

        env["megatron_core"] = megatron.core.__version__
    except (ImportError, AttributeError):
        env["megatron_core"] = None
    try:
        import transformer_engine

        env["transformer_engine"] = transformer_engine.__version__
    except ImportError:
        env["transformer_engine"] = None
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fit", type=Path, help="print the per-element fit of a finished run's JSON and stop")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--no-fused", action="store_true", help="skip TE's fused kernels")
    args = parser.parse_args()
    if args.fit:
        print(json.dumps(fit(json.loads(args.fit.read_text())["rows"]), indent=1))
        return
    if args.out is None:
        parser.error("--out is required")
    rows = []
    if args.out.exists():  # resume: keep what a stopped run measured
        rows = json.loads(args.out.read_text())["rows"]
    done = {(r["tokens"], r["hidden"], r["experts"], r["topk"], r["fused"]) for r in rows}
    fused_modes = (False,) if args.no_fused else (False, True)
    for tokens, hidden, experts, topk, fused in itertools.product(TOKENS, HIDDEN, EXPERTS, TOPK, fused_modes):
        if (tokens, hidden, experts, topk, fused) in done:
            continue
        row = {"tokens": tokens, "hidden": hidden, "experts": experts, "topk": topk, "fused": fused, "steps": {}}
        for name, fwd, bwd in steps(tokens, hidden, experts, topk, fused, "cuda"):
            fwd_ms, bwd_ms = time_step(fwd, bwd, args.warmup, args.iters)
            row["steps"][name] = {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms, "kernel_us": kernel_us(fwd, bwd)}
        rows.append(row)
        print(
            json.dumps({k: row[k] for k in ("tokens", "hidden", "experts", "topk", "fused")}),
            {n: (round(s["fwd_ms"], 3), round(s["bwd_ms"], 3)) for n, s in row["steps"].items()},
            flush=True,
        )
        doc = {"kind": "moe-permute", "env": environment(), "rows": rows}
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
