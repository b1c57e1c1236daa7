"""Regenerate `src/megatron_autotuner/specs/presets/megatron_lm_flags.json`: every option of Megatron-LM's own
argparse (`megatron.training.arguments.add_megatron_arguments`, and `megatron.post_training.arguments.add_modelopt_args`
that pretrain_gpt.py adds), with its dest, default, action, nargs, group, and
for a value flag its type (int / float / str; none for a converter of Megatron's own) and choices.

Megatron-LM's training package imports GPU-only modules at import time; on a CPU machine they are replaced by
empty stand-ins (nothing of them is called: only the parser is built). Triton must be importable (torch checks
it): install its wheel into a folder and pass it with --extra-path.

    git -C <Megatron-LM mirror> archive <commit> megatron | tar -x -C /tmp/mlm
    pip install --no-deps --target /tmp/tritonlib triton
    python benchmarks/tools/extract_megatron_flags.py --megatron-lm /tmp/mlm --extra-path /tmp/tritonlib \
        --source "NVIDIA/Megatron-LM@<commit>"
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
import typing
import warnings
from pathlib import Path
from unittest import mock

OUT = Path(__file__).resolve().parents[2] / "src/megatron_autotuner/specs/presets/megatron_lm_flags.json"
# imported by megatron.training / megatron.core at import time, absent (or GPU-only) on a CPU machine
STUBBED = {
    "flash_attn", "nvidia_resiliency_ext", "tensorstore", "zarr", "modelopt", "einops", "nvtx", "flashinfer",
    "mamba_ssm", "causal_conv1d", "deep_ep", "multistorageclient", "onelogger", "one_logger", "wandb",
    "tensorboard", "transformers", "sentencepiece", "tiktoken", "datasets", "nltk", "flask_restful", "flask",
    "grouped_gemm", "hybrid_ep", "nvshmem", "cuda", "cutlass", "tqdm",
}  # fmt: skip
ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "BooleanOptionalAction": "boolean_optional",
}


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock()
        module.__version__, module.__path__, module.__spec__, module.__name__ = "99.0.0", [], spec, spec.name
        return module

    def exec_module(self, module):
        pass


def extract(megatron_lm: str, extra_path: list[str]) -> list[dict]:
    warnings.filterwarnings("ignore")
    sys.path[:0] = [megatron_lm, *extra_path]
    sys.meta_path.insert(0, _Stubs())
    if not hasattr(typing, "override"):  # Python 3.12's typing.override, used by megatron.training.models
        typing.override = lambda f: f
    from megatron.post_training.arguments import add_modelopt_args
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    # pretrain_gpt.py passes these as its extra_args_provider when nvidia-modelopt is installed (pretrain_gpt.py:526
    # @ d98e8a6): its gpt-oss example's --enable-gpt-oss and --export-* flags are pretrain_gpt.py's too
    add_modelopt_args(parser)
    rows = []
    for group in parser._action_groups:
        for action in group._group_actions:
            kind = ACTIONS.get(type(action).__name__)
            if not action.option_strings or kind is None:
                continue
            default = action.default
            try:
                json.dumps(default)
            except TypeError:
                default = repr(default)
            nargs = action.nargs if action.nargs not in (None, 0) else None
            row = {
                "flags": action.option_strings,
                "dest": action.dest,
                "default": default,
                "action": kind,
                "nargs": nargs,
                "group": group.title,
            }
            if kind == "store":
                row["type"] = {int: "int", float: "float", str: "str"}.get(action.type)
                if action.choices is not None:
                    row["choices"] = [c if isinstance(c, (int, float, str)) else str(c) for c in action.choices]
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron-lm", required=True, help="a Megatron-LM checkout (holds megatron/)")
    ap.add_argument("--extra-path", action="append", default=[], help="extra sys.path entry (triton)")
    ap.add_argument("--source", required=True, help="repo@commit written into the file")
    args = ap.parse_args()
    rows = extract(args.megatron_lm, args.extra_path)
    body = ",\n".join("  " + json.dumps(r) for r in rows)
    source = json.dumps(args.source + " megatron/training/arguments.py + megatron/post_training/arguments.py")
    OUT.write_text(f'{{"source": {source},\n "flags": [\n{body}\n ]}}\n')
    print(f"{len(rows)} flags -> {OUT}")


if __name__ == "__main__":
    main()
