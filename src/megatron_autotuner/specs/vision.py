"""`VisionEncoder`: the vision tower of a vision-language model, as the Megatron builds RL frameworks train see it.

Qwen2.5-VL (HF `qwen2_5_vl` `vision_config`; verl's megatron-core build, verl/models/mcore/qwen2_5_vl @ b178a3c):
- a patch embedding, Conv3d(in_chans, hidden, kernel = stride = (temporal_patch_size, patch_size, patch_size)),
  no bias, not split over TP (vision_model.PatchEmbed);
- `depth` pre-norm transformer blocks of width `hidden_size` (RMSNorm; qkv and proj with bias; a gated SiLU MLP of
  `intermediate_size` with biases), megatron-core layers split over the decoder's TP without sequence parallelism
  (vision_config.get_vision_model_config: sequence_parallel False). Attention is bidirectional: within windows of
  `window_size` pixels (window_size / patch_size patches a side) except the `fullatt_block_indexes` blocks, which
  attend over the whole image;
- a merger: RMSNorm(hidden), then an MLP of spatial_merge_size^2 x hidden -> the same -> the language model's
  hidden size, GELU, with biases (get_vision_projection_config), one output per spatial_merge_size^2 patches: each
  image token of the language model is that many patches.
It runs on the first pipeline stage only (model.Qwen2_5VLModel builds it with `pre_process`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, reject_unknown_fields

if TYPE_CHECKING:
    from .model import ModelSpec


@dataclass(frozen=True)
class VisionEncoder:
    """A ViT-style vision tower with a patch merger (field names: HF `vision_config`'s meanings, megatron-core's
    spelling where the language model has one)."""

    depth: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    out_hidden_size: int  # the language model's hidden size: the merger's output
    patch_size: int = 14
    temporal_patch_size: int = 2
    in_channels: int = 3
    spatial_merge_size: int = 2
    # patches a side of an attention window (Qwen2.5-VL: window_size 112 px / patch 14 = 8); 0: every block
    # attends over the whole image
    window_patches: int = 0
    full_attention_blocks: tuple[int, ...] = ()  # blocks that attend over the whole image despite the window
    gated_linear_unit: bool = True
    activation: str = "silu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "full_attention_blocks", tuple(int(i) for i in self.full_attention_blocks))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"vision.{f.name}", f"must be an integer >= 0, got {value!r}")
        for name in ("depth", "hidden_size", "num_attention_heads", "ffn_hidden_size", "out_hidden_size",
                     "patch_size", "temporal_patch_size", "in_channels", "spatial_merge_size"):  # fmt: skip
            if not getattr(self, name):
                raise ConfigError(f"vision.{name}", "must be > 0")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("vision.num_attention_heads", f"must divide hidden_size={self.hidden_size}")
        if any(not 0 <= i < self.depth for i in self.full_attention_blocks):
            raise ConfigError("vision.full_attention_blocks", f"block indexes must be in 0..{self.depth - 1}")

    @property
    def patches_per_token(self) -> int:
        """Patches behind one image token of the language model: spatial_merge_size^2."""
        return self.spatial_merge_size**2

    @property
    def patch_features(self) -> int:
        """Pixels x channels of one patch: the patch embedding's input width."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merger_width(self) -> int:
        """The merger MLP's input and hidden width: hidden_size x spatial_merge_size^2."""
        return self.hidden_size * self.patches_per_token

    @property
    def window_size(self) -> int:
        """Patches in one attention window (a square of `window_patches` a side); 0 without windows."""
        return self.window_patches**2

    def tower_model(self) -> ModelSpec:
        """The transformer blocks as a `ModelSpec` (bidirectional attention, a window of `window_size` patches on
        every block but the full-attention ones), so parameters, FLOPs, memory and time read the same layer
        formulas as the language model's."""
        return _tower_model(self)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "full_attention_blocks": list(self.full_attention_blocks)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VisionEncoder:
        if not isinstance(data, dict):
            raise ConfigError("vision", "must be an object of VisionEncoder fields")
        reject_unknown_fields(cls, data, "VisionEncoder")
        return cls(**data)


@lru_cache(maxsize=64)
def _tower_model(vision: VisionEncoder) -> ModelSpec:
    from .model import ModelSpec

    windowed = vision.window_patches > 0
    return ModelSpec(
        name="vision tower",
        hidden_size=vision.hidden_size,
        num_layers=vision.depth,
        num_attention_heads=vision.num_attention_heads,
        ffn_hidden_size=vision.ffn_hidden_size,
        vocab_size=1,  # no vocabulary: the tower's input is the patch embedding
        gated_linear_unit=vision.gated_linear_unit,
        activation=vision.activation,
        add_bias_linear=True,
        causal_attention=False,
        window_size=vision.window_size if windowed else 0,
        window_layer_pattern=tuple(int(i not in vision.full_attention_blocks) for i in range(vision.depth))
        if windowed
        else (),
    )


def qwen2_5_vl_vision(cfg: dict[str, Any], out_hidden_size: int) -> VisionEncoder:
    """The `vision_config` of an HF `qwen2_5_vl` config.json (transformers Qwen2_5_VLVisionConfig names)."""
    if not isinstance(cfg, dict):
        raise ConfigError("vision_config", "must be an object")
    for key in ("depth", "hidden_size", "num_heads", "intermediate_size"):
        if key not in cfg:
            raise ConfigError(f"vision_config.{key}", "missing from the qwen2_5_vl config.json")
    out = cfg.get("out_hidden_size", out_hidden_size)
    if out != out_hidden_size:
        raise ConfigError("vision_config.out_hidden_size", f"{out} is not the language model's hidden_size")
    patch = cfg.get("patch_size", 14)
    window_px = cfg.get("window_size", 0)
    if not isinstance(patch, int) or not isinstance(window_px, int) or patch <= 0 or window_px % patch:
        raise ConfigError("vision_config.window_size", f"{window_px!r} px must be a multiple of patch_size {patch!r}")
    return VisionEncoder(
        depth=cfg["depth"],
        hidden_size=cfg["hidden_size"],
        num_attention_heads=cfg["num_heads"],
        ffn_hidden_size=cfg["intermediate_size"],
        out_hidden_size=out,
        patch_size=patch,
        temporal_patch_size=cfg.get("temporal_patch_size", 2),
        in_channels=cfg.get("in_chans", cfg.get("in_channels", 3)),
        spatial_merge_size=cfg.get("spatial_merge_size", 2),
        window_patches=window_px // patch,
        full_attention_blocks=tuple(cfg.get("fullatt_block_indexes") or ()),
        activation=cfg.get("hidden_act", "silu"),
    )
