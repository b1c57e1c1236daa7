"""`PipelineLayout`: which decoder layers, embedding, loss and MTP layers sit on each virtual pipeline stage.

One object that theory, cost model, search, export and validate all read. Megatron offers four ways to say it
(megatron-core `TransformerConfig` / `transformer_block.get_num_layers_to_build`, Megatron-LM `arguments.py`,
NVIDIA/Megatron-LM@d98e8a6); `form` remembers which one, so an export says it the way the user did:

- ``even``: num_layers / (pp * vpp) decoder layers per virtual stage;
- ``account``: `--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split`: the embedding
  (loss) takes the place of one decoder layer in the first (last) virtual stage: (L + E + loss) / (pp * vpp) slots;
- ``first_last``: `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`: the first (last)
  pipeline rank holds that many layers, split evenly over its vpp chunks, the other ranks share the rest evenly;
- ``string``: `--pipeline-model-parallel-layout`, e.g. ``"Et|(tt|)*30mL"``: one ``|``-separated entry per virtual
  stage in Megatron's order (virtual stage index = vpp_rank * pp + pp_rank); ``E`` embedding, ``t`` decoder layer,
  ``m`` MTP layer, ``L`` loss; ``(...)*N`` and ``x*N`` repeat, commas are cosmetic
  (`PipelineParallelLayerLayout.parse_str_to_list`).

Wherever the form, the embedding lives on virtual stage (rank 0, chunk 0) and the loss (final norm, output layer)
on (rank pp-1, chunk vpp-1); MTP layers sit where the layout string puts them, else on the last virtual stage
(megatron-core `mtp_on_this_rank`). A chunk holding MTP layers but not the first stage builds its own embedding
(`GPTModel`: `pre_process or mtp_process`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from ..errors import ConfigError
from .hashing import cached_hash

FORMS = ("even", "account", "first_last", "string")
# a layout string, repeats unrolled: one character per embedding / layer / loss plus the stage separators (the largest
# published layouts, DeepSeek-V3 / Qwen3-235B at pp 16 vpp 8, are a few hundred)
MAX_LAYOUT_CHARS = 100_000
_LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}


def parse_layout_string(layout: str) -> list[str]:
    """Megatron's `parse_str_to_list`: unroll ``(...)*N`` (innermost parentheses, no nesting) then ``x*N``, drop
    commas and split on ``|``. Returns one string of layer characters per virtual stage."""
    if not isinstance(layout, str) or not layout.strip():
        raise ConfigError("pipeline_model_parallel_layout", "must be a non-empty layout string such as 'Et|(tt|)*30mL'")
    text = layout.replace(",", "").replace(" ", "").replace('"', "").replace("'", "")
    if len(text) > MAX_LAYOUT_CHARS:
        raise ConfigError("pipeline_model_parallel_layout", f"is {len(text)} characters (limit {MAX_LAYOUT_CHARS})")

    def repeat(m: re.Match) -> str:
        count = int(m.group(2)) if len(m.group(2)) < 12 else MAX_LAYOUT_CHARS + 1
        if len(text) - len(m.group(0)) + len(m.group(1)) * count > MAX_LAYOUT_CHARS:
            raise ConfigError(
                "pipeline_model_parallel_layout",
                f"{m.group(0)[:40]!r}: unrolled, the layout would pass {MAX_LAYOUT_CHARS} characters (the limit)",
            )
        return m.group(1) * count

    for pattern in (r"\(([^()]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, repeat, text)
    stages = text.split("|")
    for stage in stages:
        for ch in stage:
            if ch not in _LAYER_CHARS:
                raise ConfigError(
                    "pipeline_model_parallel_layout",
                    f"invalid layer character {ch!r} in {layout!r} (known: E embedding, t decoder, m mtp, L loss; "
                    "repeat with (...)*N or x*N)",
                )
    return stages


def compress_layout(stages: list[str] | tuple[str, ...]) -> str:
    """The shortest common spelling of a stage list: runs of identical stages as ``(s|)*N``, runs of one layer
    character as ``t*N``. `parse_layout_string(compress_layout(x)) == list(x)`."""
    out: list[str] = []
    i = 0
    n = len(stages)
    while i < n:
        j = i
        while j + 1 < n and stages[j + 1] == stages[i]:
            j += 1
        run = j - i + 1
        body = _compress_chars(stages[i])
        last = j == n - 1
        if run >= 3 and not last:
            out.append(f"({body}|)*{run}")
        elif run >= 3:  # the final stage has no trailing separator
            out.append(f"({body}|)*{run - 1}{body}")
        else:
            out.extend(body + ("" if k == n - 1 else "|") for k in range(i, j + 1))
        i = j + 1
    return "".join(out)


def _compress_chars(stage: str) -> str:
    parts, i = [], 0
    while i < len(stage):
        j = i
        while j + 1 < len(stage) and stage[j + 1] == stage[i]:
            j += 1
        run = j - i + 1
        parts.append(stage[i] * run if run < 4 else f"{stage[i]}*{run}")
        i = j + 1
    return "".join(parts)


@dataclass(frozen=True)
class PipelineLayout:
    """Layers per virtual pipeline stage, in Megatron's order: `stages[v * pp + r]` is chunk v of rank r, a string
    of ``E`` / ``t`` / ``m`` / ``L``. `form` is how Megatron is told (see the module docstring); `first_stage_layers`
    / `last_stage_layers` and `account_embedding` / `account_loss` keep the flags of the `first_last` / `account`
    forms so an export repeats them."""

    pp: int
    stages: tuple[str, ...]
    form: str = "string"
    account_embedding: bool = False
    account_loss: bool = False
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

    __hash__ = cached_hash  # hashed once: the search's caches look it up constantly

    def __post_init__(self) -> None:
        if not isinstance(self.pp, int) or self.pp < 1:
            raise ConfigError("pp", f"must be a positive integer, got {self.pp!r}")
        object.__setattr__(self, "stages", tuple(self.stages))
        if self.form not in FORMS:
            raise ConfigError("pipeline_layout", f"form must be one of {', '.join(FORMS)}, got {self.form!r}")
        if len(self.stages) % self.pp:
            raise ConfigError(
                "pipeline_model_parallel_layout",
                f"has {len(self.stages)} virtual stages, not divisible by pipeline_model_parallel_size={self.pp}",
            )
        flat = "".join(self.stages)
        if flat.count("E") != 1 or not flat.startswith("E"):
            raise ConfigError("pipeline_model_parallel_layout", "the embedding 'E' must come first, exactly once")
        if flat.count("L") != 1 or not flat.endswith("L"):
            raise ConfigError("pipeline_model_parallel_layout", "the loss 'L' must come last, exactly once")
        if "m" in flat and "t" in flat[flat.index("m") :]:
            raise ConfigError("pipeline_model_parallel_layout", "decoder layers 't' must come before MTP layers 'm'")
        pp, v = self.pp, self.vpp
        for r in range(pp):
            for c in range(v - 1):
                if "m" in self.stages[c * pp + r]:
                    raise ConfigError(
                        "pipeline_model_parallel_layout", "MTP layers must sit in the last virtual stage of their rank"
                    )
        mtp_stages = [s for s in self.stages if "m" in s]
        if len(mtp_stages) > 1:
            raise ConfigError("pipeline_model_parallel_layout", "all MTP layers must sit in one virtual stage")
        if v > 1 and any("m" in self.stages[c * pp] for c in range(v - 1)):
            raise ConfigError("pipeline_model_parallel_layout", "MTP layers cannot sit on the first pipeline rank")

    # ---- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_string(cls, layout: str, pp: int) -> PipelineLayout:
        """`--pipeline-model-parallel-layout` with `--pipeline-model-parallel-size pp`."""
        return cls(pp, tuple(parse_layout_string(layout)), "string")

    @classmethod
    def even(cls, num_layers: int, pp: int, vpp: int | None = None, mtp_num_layers: int = 0) -> PipelineLayout:
        """Megatron's default split: num_layers / (pp * vpp) decoder layers per virtual stage."""
        return cls.from_counts(_even_counts(num_layers, pp, vpp or 1, False, False), pp, mtp_num_layers, "even")

    @classmethod
    def accounting(
        cls,
        num_layers: int,
        pp: int,
        vpp: int | None = None,
        embedding: bool = True,
        loss: bool = True,
        mtp_num_layers: int = 0,
    ) -> PipelineLayout:
        """`--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-pipeline-split`: (L + E + loss)
        slots over pp * vpp virtual stages; the first (last) virtual stage builds one decoder layer fewer."""
        if not (embedding or loss):
            return cls.even(num_layers, pp, vpp, mtp_num_layers)
        counts = _even_counts(num_layers, pp, vpp or 1, embedding, loss)
        layout = cls.from_counts(counts, pp, mtp_num_layers, "account")
        return cls(layout.pp, layout.stages, "account", account_embedding=embedding, account_loss=loss)

    @classmethod
    def first_last(
        cls,
        num_layers: int,
        pp: int,
        vpp: int | None = None,
        first: int | None = None,
        last: int | None = None,
        mtp_num_layers: int = 0,
    ) -> PipelineLayout:
        """`--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers` (megatron-core's
        num_layers_in_first/last_pipeline_stage): the rules of `TransformerConfig.__post_init__`."""
        v = vpp or 1
        if first is None and last is None:
            return cls.even(num_layers, pp, vpp, mtp_num_layers)
        rest, middle = num_layers, pp
        for name, value in (("decoder_first_pipeline_num_layers", first), ("decoder_last_pipeline_num_layers", last)):
            if value is None:
                continue
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
            if value % v:
                raise ConfigError(name, f"{value} must be divisible by the virtual pipeline size {v}")
            rest -= value
            middle -= 1
        if middle < 0:
            raise ConfigError("decoder_first_pipeline_num_layers", "first and last stage counts need pp >= 2")
        if bool(rest) != bool(middle) or rest < 0:
            raise ConfigError(
                "decoder_first_pipeline_num_layers",
                f"{max(rest, 0)} layers are left for {middle} middle pipeline stages (num_layers={num_layers})",
            )
        if middle and (rest % middle or (rest // middle) % v):
            raise ConfigError(
                "decoder_first_pipeline_num_layers",
                f"the {rest} middle layers must split evenly over {middle} middle ranks x {v} virtual stages",
            )
        per_middle = rest // middle if middle else 0
        per_rank = [per_middle] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
        counts = [per_rank[r] // v for _c in range(v) for r in range(pp)]
        layout = cls.from_counts(counts, pp, mtp_num_layers, "first_last")
        return cls(layout.pp, layout.stages, "first_last", first_stage_layers=first, last_stage_layers=last)

    @classmethod
    def from_counts(
        cls, decoder_counts: list[int] | tuple[int, ...], pp: int, mtp_num_layers: int = 0, form: str = "string"
    ) -> PipelineLayout:
        """Decoder layers per virtual stage (Megatron order) -> layout, embedding first, loss (and MTP) last."""
        stages = ["t" * n for n in decoder_counts]
        if not stages:
            raise ConfigError("pp", "a pipeline needs at least one stage")
        stages[0] = "E" + stages[0]
        stages[-1] = stages[-1] + "m" * mtp_num_layers + "L"
        return cls(pp, tuple(stages), form)

    # ---- shape ----------------------------------------------------------------------------------
    @property
    def vpp(self) -> int:
        """Virtual stages per rank (1: no interleaving)."""
        return len(self.stages) // self.pp

    @property
    def vpp_or_none(self) -> int | None:
        return self.vpp if self.vpp > 1 else None

    def stage(self, rank: int, chunk: int) -> str:
        return self.stages[chunk * self.pp + rank]

    # (cached: the search asks these for every stage of thousands of layouts)
    @cached_property
    def decoder_counts(self) -> tuple[int, ...]:
        """Decoder layers per virtual stage, Megatron order."""
        return tuple(s.count("t") for s in self.stages)

    @cached_property
    def _offsets(self) -> tuple[int, ...]:
        offsets, total = [], 0
        for n in self.decoder_counts:
            offsets.append(total)
            total += n
        return tuple(offsets)

    @cached_property
    def num_layers(self) -> int:
        return sum(self.decoder_counts)

    @cached_property
    def mtp_num_layers(self) -> int:
        return sum(s.count("m") for s in self.stages)

    def chunk_layers(self, rank: int, chunk: int) -> range:
        """Global decoder-layer indices of chunk `chunk` of rank `rank` (`get_layer_offset`: layers of every
        earlier virtual stage in Megatron order)."""
        index = chunk * self.pp + rank
        offset = self._offsets[index]
        return range(offset, offset + self.decoder_counts[index])

    @cached_property
    def _rank_layers(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(i for c in range(self.vpp) for i in self.chunk_layers(r, c)) for r in range(self.pp))

    def rank_layers(self, rank: int) -> list[int]:
        """Every decoder layer of pipeline rank `rank`, all its chunks."""
        return list(self._rank_layers[rank])

    def rank_mtp_layers(self, rank: int) -> int:
        return sum(self.stage(rank, c).count("m") for c in range(self.vpp))

    def rank_embedding_copies(self, rank: int) -> int:
        """Word embeddings rank `rank` builds: one per chunk holding the embedding or MTP layers (GPTModel builds
        it when `pre_process or mtp_process`)."""
        return sum(1 for c in range(self.vpp) if "E" in self.stage(rank, c) or "m" in self.stage(rank, c))

    @cached_property
    def final_norm_rank(self) -> int:
        """Rank of the decoder's final norm: the loss rank, or with MTP layers the rank of the last decoder layer
        (megatron-core `TransformerBlock.has_final_layernorm_in_this_stage`)."""
        if not self.mtp_num_layers:
            return self.pp - 1
        last = self.num_layers - 1
        return next(r for r in range(self.pp) if last in self.rank_layers(r)) if self.num_layers else self.pp - 1

    def to_string(self) -> str:
        """`--pipeline-model-parallel-layout` spelling of this layout (compressed)."""
        return compress_layout(self.stages)

    def describe(self) -> str:
        """Short label: 'even', 'E+loss accounted', 'first 6 / last 6', or the layout string."""
        if self.form == "even":
            return "even"
        if self.form == "account":
            parts = [p for p, on in (("embedding", self.account_embedding), ("loss", self.account_loss)) if on]
            return "+".join(parts) + " accounted"
        if self.form == "first_last":
            return f"first {self.first_stage_layers or '-'} / last {self.last_stage_layers or '-'}"
        return self.to_string()

    # ---- Megatron-LM ------------------------------------------------------------------------------
    def megatron_args(self) -> dict[str, Any]:
        """The Megatron-LM argument values (argparse dests) that say this layout in its own form. vpp goes as
        `num_virtual_stages_per_pipeline_rank` (works for every form but the layout string, which implies it)."""
        args: dict[str, Any] = {}
        if self.form == "string":
            args["pipeline_model_parallel_layout"] = self.to_string()
            return args
        if self.vpp > 1:
            args["num_virtual_stages_per_pipeline_rank"] = self.vpp
        if self.form == "account":
            args["account_for_embedding_in_pipeline_split"] = self.account_embedding
            args["account_for_loss_in_pipeline_split"] = self.account_loss
        elif self.form == "first_last":
            args["decoder_first_pipeline_num_layers"] = self.first_stage_layers
            args["decoder_last_pipeline_num_layers"] = self.last_stage_layers
        return args

    def check_model(self, num_layers: int, mtp_num_layers: int) -> None:
        """Megatron's `validate_layer_layout`: the layout holds every decoder and MTP layer of the model."""
        if self.num_layers != num_layers:
            raise ConfigError(
                "pipeline_model_parallel_layout",
                f"holds {self.num_layers} decoder layers 't', the model has num_layers={num_layers}",
            )
        if self.mtp_num_layers != mtp_num_layers:
            raise ConfigError(
                "pipeline_model_parallel_layout",
                f"holds {self.mtp_num_layers} MTP layers 'm', the model has mtp_num_layers={mtp_num_layers}",
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "form": self.form,
            "describe": self.describe(),
            "layout": self.to_string(),
            "decoder_layers_per_virtual_stage": list(self.decoder_counts),
            **{k: v for k, v in self.megatron_args().items() if k != "pipeline_model_parallel_layout"},
        }


def _even_counts(num_layers: int, pp: int, v: int, embedding: bool, loss: bool) -> list[int]:
    """Decoder layers per virtual stage when (num_layers + embedding + loss) slots split evenly over pp * v."""
    slots = num_layers + int(embedding) + int(loss)
    if slots % (pp * v):
        what = "num_layers" + (" + embedding" if embedding else "") + (" + loss" if loss else "")
        raise ConfigError(
            "pp",
            f"{what} = {slots} must be divisible by pp*vpp = {pp}*{v} (use an uneven pipeline layout otherwise)",
        )
    per = slots // (pp * v)
    counts = [per] * (pp * v)
    if embedding:
        counts[0] -= 1
    if loss:
        counts[-1] -= 1
    if min(counts) < 0:
        raise ConfigError("pp", "not enough layers for the embedding / loss stages")
    return counts


@lru_cache(maxsize=4096)
def even_layout(num_layers: int, pp: int, vpp: int | None, mtp_num_layers: int) -> PipelineLayout:
    """`PipelineLayout.even`, cached: the layout of every config that names none."""
    return PipelineLayout.even(num_layers, pp, vpp, mtp_num_layers)


def balanced_layout(
    weights: list[float],
    pp: int,
    vpp: int,
    embedding_weight: float = 0.0,
    loss_weight: float = 0.0,
    mtp_weights: tuple[float, ...] = (),
) -> PipelineLayout:
    """A layout string that splits the model into pp x vpp virtual stages of near-equal work: the embedding, each
    decoder layer (`weights`, e.g. forward FLOPs per token), the MTP layers and the loss, in that order, cut into
    contiguous groups; the k-th cut falls where the running weight is nearest k/(pp*vpp) of the total. No group
    is empty (NVIDIA's layouts have none), so the embedding joins the first layers and the loss the last."""
    stages = pp * vpp
    items = [("E", embedding_weight)] + [("t", w) for w in weights] + [("m", w) for w in mtp_weights]
    items.append(("L", loss_weight))
    n = len(items)
    if stages > n:
        raise ConfigError("pp", f"{stages} virtual stages for {n} layers (embedding and loss included)")
    prefix = [0.0]
    for _, w in items:
        prefix.append(prefix[-1] + w)
    total = prefix[-1]
    cuts = [0]
    for k in range(1, stages):
        lo = cuts[-1] + 1  # at least one item in the group before
        hi = n - (stages - k)  # at least one item in each group after
        target = total * k / stages
        cuts.append(min(range(lo, hi + 1), key=lambda i: (abs(prefix[i] - target), i)))
    cuts.append(n)
    groups = ["".join(ch for ch, _ in items[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]
    return PipelineLayout(pp, tuple(groups), "string")
