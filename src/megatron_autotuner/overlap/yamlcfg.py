"""Userbuffers yaml files: the format Megatron-LM reads with `--tp-comm-overlap-cfg` (yaml.safe_load, passed
as `ub_cfgs` to TE's `initialize_ub`): a mapping `<gemm name>: {method: ..., num_sm: ..., ...}`.
Only keys TE's `add_ub` accepts are written; booleans as yaml booleans."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..files import write_text_atomic
from .rules import UB_NAMES, UbVariant, cfg_from_dict


def dump_ub_yaml(cfg: Mapping[str, UbVariant], path: str | Path, header: list[str] | None = None) -> Path:
    # `external` (proj/fc2 wgrad) is TE's fixed default and unknown to older TE: left out
    data = {name: cfg[name].to_cfg() for name in UB_NAMES if name in cfg and cfg[name].method != "external"}
    text = "".join(f"# {line}\n" for line in (header or []))
    text += yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(p, text)
    return p


def load_ub_yaml(path: str | Path) -> dict[str, UbVariant]:
    data: Any = yaml.safe_load(Path(path).read_text()) or {}
    return cfg_from_dict(data)
