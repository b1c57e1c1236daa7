"""Find a `ModelSpec` by name: shipped preset, config.json path, native spec JSON, or HF id in the local cache.

No network is used: a Hugging Face model id is looked up only in the local HF cache
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from ..errors import ConfigError, SpecNotFoundError
from .hf import model_spec_from_hf_config, read_json_file
from .model import ModelSpec

_PRESET_PACKAGE = "megatron_autotuner.specs.presets.models"


def preset_names() -> list[str]:
    """Names of the shipped model presets (HF-style config.json files in the package)."""
    files = resources.files(_PRESET_PACKAGE).iterdir()
    return sorted((f.name[: -len(".json")] for f in files if f.name.endswith(".json")), key=str.lower)


def _preset_path(name: str) -> Path | None:
    by_lower = {n.lower(): n for n in preset_names()}
    key = by_lower.get(name.lower())
    if key is None:
        return None
    return Path(str(resources.files(_PRESET_PACKAGE) / f"{key}.json"))


def hf_cache_dirs() -> list[Path]:
    """Where a Hugging Face hub cache may be on this machine, in lookup order."""
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def find_in_hf_cache(model_id: str) -> Path | None:
    """Path of `config.json` of `model_id` (e.g. 'Qwen/Qwen3-8B') in the local HF cache, if cached."""
    folder = "models--" + model_id.replace("/", "--")
    for cache in hf_cache_dirs():
        snapshots = cache / folder / "snapshots"
        if not snapshots.is_dir():
            continue
        ref = cache / folder / "refs" / "main"
        if ref.is_file():
            try:
                commit = ref.read_bytes()[:256].decode("utf-8", errors="replace").strip()
            except OSError:
                commit = ""
            candidate = snapshots / commit / "config.json"
            if commit and candidate.is_file():
                return candidate
        found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        if found:
            return found[0]
    return None


def load_model_spec_file(path: str | Path) -> ModelSpec:
    """A `ModelSpec` from a file: an HF `config.json` (has `model_type`) or a native ModelSpec JSON."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = read_json_file(p)
    if "model_type" in data:
        # a folder's config.json is named after its folder, any other file after itself
        name = data.get("_name_or_path") or (p.parent.name if p.name == "config.json" else p.stem) or p.stem
        return model_spec_from_hf_config(data, name=str(name))
    try:
        return ModelSpec.from_dict(data)
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("model", f"{p}: malformed ModelSpec JSON ({' '.join(str(exc).split())})") from exc


def load_model_spec(name_or_path: str) -> ModelSpec:
    """Resolve a model: preset name, file or folder path, or a HF id cached locally."""
    preset = _preset_path(name_or_path)
    if preset is not None:
        spec = load_model_spec_file(preset)
        return spec.replace(name=preset.stem)
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_model_spec_file(path)
    if "/" in name_or_path and not name_or_path.endswith(".json"):
        cached = find_in_hf_cache(name_or_path)
        if cached is not None:
            return load_model_spec_file(cached).replace(name=name_or_path)
        raise SpecNotFoundError(
            f"model {name_or_path!r} is not a preset, not a file, and not in the local Hugging Face cache "
            f"({', '.join(str(d) for d in hf_cache_dirs())}); no network is used. Presets: {', '.join(preset_names())}"
        )
    raise SpecNotFoundError(
        f"unknown model {name_or_path!r}: not a preset or a file. Presets: {', '.join(preset_names())}"
    )
