"""`mat models`: list the shipped model presets."""

from __future__ import annotations

import argparse

from ..specs import load_model_spec, preset_names
from .output import console, make_table, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models",
        help="list shipped model presets",
        description="The shipped model presets (any --model also takes an HF config.json or a cached HF id): "
        "layers, hidden size, heads, experts, vocabulary, total and active parameters.",
        epilog="examples:\n  mat models\n  mat models --json",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..theory.params import total_parameters

    specs = [load_model_spec(name) for name in preset_names()]
    rows = []
    for s in specs:
        counts = total_parameters(s)
        rows.append(
            {
                "name": s.name,
                "layers": s.num_layers,
                "hidden_size": s.hidden_size,
                "heads": s.num_attention_heads,
                "query_groups": s.num_query_groups,
                "experts": s.num_moe_experts,
                "top_k": s.moe_router_topk,
                "vocab_size": s.vocab_size,
                "total_params": counts.total,
                "active_params": counts.active,
            }
        )
    if args.json:
        print_json({"models": rows, "specs": [s.to_dict() for s in specs]})
        return 0
    columns = ["name", "layers", "hidden", "heads/groups", "experts (top-k)", "vocab", "params (B)", "active (B)"]
    table_rows = [
        [
            r["name"],
            r["layers"],
            r["hidden_size"],
            f"{r['heads']}/{r['query_groups']}",
            f"{r['experts']} ({r['top_k']})" if r["experts"] else "-",
            r["vocab_size"],
            f"{r['total_params'] / 1e9:.2f}",
            f"{r['active_params'] / 1e9:.2f}",
        ]
        for r in rows
    ]
    console().print(make_table("Model presets", columns, table_rows))
    return 0
