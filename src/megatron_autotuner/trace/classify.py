"""Classification of GPU events (kernels, memcpys, memsets) by name into documented categories.

Categories (`CATEGORIES`):
- `gemm`: matrix multiplies (cuBLAS `nvjet_*`, `sm90_xmma_gemm*`, CUTLASS, anything named *gemm*).
- `attention`: fused attention (flash, cuDNN SDPA / fmha, TE fused-attn helpers, fused softmax),
  and `cudnn::fusion::*` kernels when launched inside an attention operator (a context rule).
- `comm`: collective or point-to-point communication kernels; `library` is `nccl`, `userbuffers`
  (TE tp-comm-overlap) or `symm_mem` (torch symmetric memory); `collective` is all_gather,
  reduce_scatter, all_reduce, all_to_all, send_recv, broadcast, reduce or barrier when the name says.
- `peer_copy`: `Memcpy PtoP` (copy engine between GPUs); counts as communication.
- `memcpy`, `memset`: other copy-engine work; neither compute nor communication.
- `norm`: normalization (RMSNorm, LayerNorm, ...).
- `elementwise`: ATen / TE / Triton elementwise, reduction, copy, cast, activation kernels.
- `other`: no rule matched (the fallback); counted as compute.

Compute = gemm + attention + norm + elementwise + other. Communication = comm + peer_copy.

Rules are `(pattern, category, library, reason)` tried in order, first match wins (`re.search`);
`Classifier(extra_rules=...)` puts user rules (Python or a yaml list, see `load_rules`) first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from os import PathLike
from typing import Any

from ..errors import ConfigError

GEMM = "gemm"
ATTENTION = "attention"
COMM = "comm"
PEER_COPY = "peer_copy"
MEMCPY = "memcpy"
MEMSET = "memset"
NORM = "norm"
ELEMENTWISE = "elementwise"
OTHER = "other"
CATEGORIES = (GEMM, ATTENTION, COMM, PEER_COPY, MEMCPY, MEMSET, NORM, ELEMENTWISE, OTHER)
COMPUTE_CATEGORIES = frozenset({GEMM, ATTENTION, NORM, ELEMENTWISE, OTHER})
COMM_CATEGORIES = frozenset({COMM, PEER_COPY})
FALLBACK_RULE = "fallback"

COLLECTIVES = (
    "reduce_scatter",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "send_recv",
    "broadcast",
    "reduce",
    "barrier",
)
# Tried in order on communication names; the first match names the collective.
_COLLECTIVE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(p, re.IGNORECASE))
    for kind, p in (
        ("reduce_scatter", r"reduce_?scatter|(?:^|[_:])rs(?:[_<(]|$)"),
        ("all_gather", r"all_?gather|(?:^|[_:])ag(?:[_<(]|$)"),
        ("all_reduce", r"all_?reduce"),
        ("all_to_all", r"all_?to_?all"),
        ("send_recv", r"send|recv"),
        ("broadcast", r"broadcast"),
        ("reduce", r"(?:^|_)reduce(?:_|$)"),
        ("barrier", r"barrier|signal"),
    )
)


def collective_from_name(name: str) -> str | None:
    """The collective a communication kernel's name states, or None (see `COLLECTIVES`)."""
    for kind, pattern in _COLLECTIVE_PATTERNS:
        if pattern.search(name):
            return kind
    return None


@dataclass(frozen=True)
class Rule:
    """Classify names matching `pattern` (regex, `re.search`) as `category`.

    `context`, when set, is a regex that one of the CPU ranges enclosing the event's launch must
    match (e.g. an attention operator); without a context the rule never applies. `collective`
    overrides the collective guessed from the name (communication categories only).
    """

    pattern: str
    category: str
    library: str | None
    reason: str
    collective: str | None = None
    context: str | None = None
    ignore_case: bool = False
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    _context_regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ConfigError("category", f"must be one of {', '.join(CATEGORIES)}, got {self.category!r}")
        if self.collective is not None and self.collective not in COLLECTIVES:
            raise ConfigError("collective", f"must be one of {', '.join(COLLECTIVES)}, got {self.collective!r}")
        flags = re.IGNORECASE if self.ignore_case else 0
        try:
            object.__setattr__(self, "_regex", re.compile(self.pattern, flags))
            ctx = re.compile(self.context, re.IGNORECASE) if self.context else None
        except re.error as exc:
            raise ConfigError("pattern", f"invalid regular expression {self.pattern!r}: {exc}") from None
        object.__setattr__(self, "_context_regex", ctx)

    def matches(self, name: str, context: Sequence[str] = ()) -> bool:
        if not self._regex.search(name):
            return False
        if self._context_regex is None:
            return True
        return any(self._context_regex.search(c) for c in context)


@dataclass(frozen=True)
class Classification:
    """Category of one GPU event name, with the library, collective type and the reason (rule)."""

    category: str
    library: str | None
    collective: str | None
    reason: str
    rule: str

    @property
    def is_comm(self) -> bool:
        return self.category in COMM_CATEGORIES

    @property
    def is_compute(self) -> bool:
        return self.category in COMPUTE_CATEGORIES

    @property
    def is_fallback(self) -> bool:
        return self.rule == FALLBACK_RULE

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "library": self.library,
            "collective": self.collective,
            "reason": self.reason,
            "rule": self.rule,
        }


_ATTENTION_CONTEXT = r"attn|attention|sdpa|flash|fmha|DotProductAttention"

DEFAULT_RULES: tuple[Rule, ...] = (
    # -- communication ---------------------------------------------------------------------
    Rule(r"^(?:void )?nccl\w*Kernel|^(?:void )?ncclSymk", COMM, "nccl", "NCCL device kernel"),
    Rule(r"k?userbuffers_", COMM, "userbuffers", "TE userbuffers (tp-comm-overlap) communication kernel"),
    Rule(
        r"\breduce_(?:bf16|fp16|fp32|fp8\w*)_cuda\b",
        COMM,
        "userbuffers",
        "TE userbuffers reduction of received reduce-scatter chunks",
        collective="reduce_scatter",
    ),
    Rule(
        r"c10d::symmetric_memory|symm_mem|\b(?:barrier|put_signal|wait_signal)_kernel\b"
        r"|\b(?:multimem|one_shot|two_shot)_\w*(?:all_reduce|all_gather|reduce)\w*kernel",
        COMM,
        "symm_mem",
        "torch symmetric-memory communication / barrier kernel",
    ),
    Rule(r"^Memcpy (?:PtoP|Peer)", PEER_COPY, "copy_engine", "copy-engine copy between GPUs (communication)"),
    # -- copies ----------------------------------------------------------------------------
    Rule(r"^Memcpy", MEMCPY, "copy_engine", "copy-engine memcpy (neither compute nor communication)"),
    Rule(r"^Memset", MEMSET, "cuda", "memset (neither compute nor communication)"),
    # -- attention -------------------------------------------------------------------------
    Rule(r"cudnn_generated_fort_native_sdpa", ATTENTION, "cudnn", "cuDNN fused SDPA (flash) kernel"),
    Rule(r"^(?:void )?cudnn::fusion::fmha", ATTENTION, "cudnn", "cuDNN fused-attention helper kernel (fmha)"),
    Rule(r"fmha", ATTENTION, None, "fused multi-head attention kernel (fmha in name)", ignore_case=True),
    Rule(
        r"^(?:void )?cudnn::fusion::",
        ATTENTION,
        "cudnn",
        "cuDNN fusion kernel launched inside an attention operator",
        context=_ATTENTION_CONTEXT,
    ),
    Rule(r"\bflash::|flash_(?:fwd|bwd|attn)|FlashAttn", ATTENTION, "flash_attn", "FlashAttention kernel"),
    Rule(r"transformer_engine::fused_attn::", ATTENTION, "te", "TE fused-attention helper kernel"),
    Rule(
        r"scaled_(?:upper_triang_|aligned_causal_)?masked_softmax|scaled_softmax_warp",
        ATTENTION,
        "te",
        "TE fused softmax of attention scores",
    ),
    Rule(r"efficient_attention|attention|sdpa|_attn_", ATTENTION, None, "attention in name", ignore_case=True),
    # -- GEMM ------------------------------------------------------------------------------
    Rule(r"^nvjet_", GEMM, "cublas", "cuBLAS nvjet GEMM"),
    Rule(r"xmma_gemm|sm\d+_xmma_", GEMM, "cublas", "cuBLAS xmma GEMM"),
    Rule(r"splitKreduce", GEMM, "cublas", "cuBLAS split-K reduction (part of a GEMM)"),
    Rule(r"cutlass", GEMM, "cutlass", "CUTLASS kernel (GEMM)", ignore_case=True),
    Rule(r"gemm|gemv|matmul", GEMM, None, "GEMM in name", ignore_case=True),
    Rule(r"^triton_tem_", GEMM, "triton", "Triton template kernel (matmul)"),
    # -- normalization ---------------------------------------------------------------------
    Rule(
        r"rms_?norm|layer_?norm|batch_?norm|group_?norm|normalization::",
        NORM,
        None,
        "normalization kernel",
        ignore_case=True,
    ),
    # -- elementwise and other generic compute ---------------------------------------------
    Rule(r"^(?:void )?at::native::", ELEMENTWISE, "aten", "ATen kernel (elementwise, reduction, copy, cat, dropout)"),
    Rule(r"^(?:void )?transformer_engine::", ELEMENTWISE, "te", "TE cast / transpose / activation kernel"),
    Rule(r"^(?:void )?cudnn::fusion::", ELEMENTWISE, "cudnn", "cuDNN fusion kernel outside an attention operator"),
    Rule(r"^triton_", ELEMENTWISE, "triton", "Triton generated kernel (pointwise / reduction)"),
    Rule(r"^(?:void )?(?:cub|thrust)\w*::", ELEMENTWISE, "cub", "CUB / Thrust primitive"),
    Rule(
        r"elementwise|vectorized|reduce_kernel|copy_kernel|fill|softmax|dropout|cast|transpose|gelu|silu|swiglu|relu",
        ELEMENTWISE,
        None,
        "elementwise-like kernel name",
        ignore_case=True,
    ),
)

_FALLBACK = Classification(OTHER, None, None, "no rule matched; counted as compute", FALLBACK_RULE)


class Classifier:
    """Applies `extra_rules` (first) then `rules` (default: `DEFAULT_RULES`); caches context-free results."""

    def __init__(self, rules: Iterable[Rule] | None = None, extra_rules: Iterable[Rule] = ()):
        self.rules: tuple[Rule, ...] = tuple(extra_rules) + tuple(DEFAULT_RULES if rules is None else rules)
        self._cache: dict[str, Classification] = {}
        self._context_rules = tuple(r for r in self.rules if r.context)

    def _make(self, rule: Rule, name: str) -> Classification:
        collective = None
        if rule.category in COMM_CATEGORIES:
            collective = rule.collective or collective_from_name(name)
        return Classification(rule.category, rule.library, collective, rule.reason, rule.pattern)

    def needs_context(self, name: str) -> bool:
        """True when a context rule could apply to `name` (callers then pass the enclosing range names)."""
        return any(r._regex.search(name) for r in self._context_rules)

    def classify(self, name: str, context: Sequence[str] = ()) -> Classification:
        """Classify one GPU event name; `context` = names of CPU ranges enclosing its launch."""
        if not context:
            hit = self._cache.get(name)
            if hit is not None:
                return hit
        result = _FALLBACK
        for rule in self.rules:
            if rule.matches(name, context):
                result = self._make(rule, name)
                break
        if not context:
            self._cache[name] = result
        return result


def load_rules(path: str | PathLike[str]) -> tuple[Rule, ...]:
    """Read user rules from yaml: a list of `{pattern, category, library?, reason?, collective?, context?}`."""
    from ..files import CONFIG_LIMIT_BYTES, read_yaml_bounded

    data = read_yaml_bounded(path, "rules", CONFIG_LIMIT_BYTES)
    if isinstance(data, dict) and "rules" in data:
        data = data["rules"]
    if not isinstance(data, list):
        raise ConfigError("rules", f"{path} must hold a list of rules")
    rules = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "pattern" not in item or "category" not in item:
            raise ConfigError(f"rules[{i}]", f"{path}: each rule needs 'pattern' and 'category'")
        unknown = set(item) - {"pattern", "category", "library", "reason", "collective", "context", "ignore_case"}
        if unknown:
            raise ConfigError(f"rules[{i}]", f"{path}: unknown keys {sorted(unknown)}")
        for key in ("library", "collective", "context"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise ConfigError(f"rules[{i}].{key}", f"{path}: must be a string, got {item[key]!r}")
        rules.append(
            Rule(
                pattern=str(item["pattern"]),
                category=str(item["category"]),
                library=item.get("library"),
                reason=str(item.get("reason", f"user rule {item['pattern']!r}")),
                collective=item.get("collective"),
                context=item.get("context"),
                ignore_case=bool(item.get("ignore_case", False)),
            )
        )
    return tuple(rules)


_DEFAULT_CLASSIFIER = Classifier()


def default_classifier() -> Classifier:
    return _DEFAULT_CLASSIFIER


def classify(name: str, context: Sequence[str] = ()) -> Classification:
    """Classify a GPU event name with the default rules (see module docstring)."""
    return _DEFAULT_CLASSIFIER.classify(name, context)
