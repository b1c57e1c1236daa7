"""Host time of a CUDA-graphed transformer layer's forward and backward calls, against the same layer eager.

TE's `make_graphed_callables` (what megatron-core's TECudaGraphHelper uses for --cuda-graph-impl transformer_engine)
captures a module's forward and backward into CUDA graphs and returns an autograd Function that replays them. The
host then pays one Python call and one graph launch per phase instead of the layer's kernels one by one. This
times both on one GPU: a TE TransformerLayer of Qwen3-0.6B's shape (hidden 1024, ffn 3072, 16 heads, 8 KV groups,
RMSNorm, SwiGLU, no bias), 4096 tokens, bf16; each timed iteration starts from a synchronised, empty launch queue
and takes the wall time of the forward call and of the backward call (medians of `--repeats`).

    python benchmarks/testbench/graph_replay_host.py --out FILE.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path


def _host_times(torch, forward, x, grad, repeats: int, warmup: int) -> dict[str, float]:
    fwd, bwd = [], []
    for i in range(warmup + repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = forward(x)
        t1 = time.perf_counter()
        out.backward(grad)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= warmup:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
    return {"host_fwd_ms": statistics.median(fwd), "host_bwd_ms": statistics.median(bwd), "n": repeats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seq-length", type=int, default=4096)
    args = parser.parse_args(argv)
    import torch
    import transformer_engine
    import transformer_engine.pytorch as te

    torch.manual_seed(0)
    shape = dict(hidden_size=1024, ffn_hidden_size=3072, num_attention_heads=16, num_gqa_groups=8, kv_channels=128)
    layer = te.TransformerLayer(
        **shape,
        normalization="RMSNorm",
        activation="swiglu",
        bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        self_attn_mask_type="causal",
        params_dtype=torch.bfloat16,
        device="cuda",
    )
    x = torch.randn(args.seq_length, 1, shape["hidden_size"], device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn_like(x)
    eager = _host_times(torch, layer, x, grad, args.repeats, args.warmup)
    graphed_layer = te.make_graphed_callables(layer, (x,), num_warmup_iters=3)
    graphed = _host_times(torch, graphed_layer, x, grad, args.repeats, args.warmup)
    doc = {
        "schema_version": 1,
        "what": "host wall time of one TE TransformerLayer's forward / backward call, eager and CUDA-graphed "
        "(te.make_graphed_callables), Qwen3-0.6B shape, bf16",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        "versions": {"torch": torch.__version__, "transformer_engine": transformer_engine.__version__},
        "seq_length": args.seq_length,
        "shape": shape,
        "eager": eager,
        "graphed": graphed,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"eager": eager, "graphed": graphed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
