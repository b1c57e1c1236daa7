"""Testbench cases: one operator of one model under one parallel setting and input size.

A case is what one `torchrun` job measures on every rank. Cases expand from a grid (models x ops x
tp x cp x ep x seq x micro-batch) or come from a JSON case file (a list of case objects).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, reject_unknown_fields
from ..specs import ModelSpec, ParallelConfig, Workload, load_model_spec
from ..specs.parallel import FP8_RECIPES, PRECISIONS

# Operators the testbench can build from megatron-core modules.
OPERATORS = (
    "embedding",  # LanguageModelEmbedding (vocab-parallel word embeddings [+ positions])
    "attention",  # SelfAttention incl. fused input norm (TE spec), RoPE, GQA, core attention
    "mlp",  # dense MLP incl. fused pre-MLP norm (TE spec)
    "moe",  # MoELayer: router + token dispatcher + experts (+ shared experts)
    "decoder",  # one TransformerLayer (dense or MoE per the model's first MoE/dense layer)
    "lm_head",  # final norm + output layer + vocab-parallel cross-entropy
    "gpt_chunk",  # GPTModel with `num_layers` layers (embedding, layers, head, loss)
    "column_linear",  # ColumnParallelLinear h -> ffn (fc1 shape)
    "row_linear",  # RowParallelLinear ffn -> h (fc2 shape)
    "norm",  # the model's norm (RMSNorm / LayerNorm) on [s, b, h]
)
MODES = ("collect", "torch-profile", "memory-snapshot", "nsys")


@dataclass(frozen=True)
class Case:
    """One measurement: `op` of `model` with the given parallel sizes and input size."""

    model: str
    op: str
    seq_length: int
    micro_batch_size: int = 1
    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    sequence_parallel: bool | None = None  # default: on when tp > 1
    num_layers: int = 2  # for gpt_chunk only
    dtype: str = "bf16"
    fp8_recipe: str = "delayed"  # with dtype fp8: Megatron-LM's --fp8-recipe (delayed | tensorwise | blockwise)
    cp_comm_type: str = "p2p"
    use_te: bool = True  # TE layer spec; False = megatron-core local spec
    # packed THD input (decoder / gpt_chunk): one micro-batch of whole sequences up to max_token_len tokens, lengths
    # prompt + response, each [mean, max] (`specs.lengths.SequenceLengths`, seed `length_seed`); without them every
    # sequence is seq_length long (`testbench.packed`)
    max_token_len: int | None = None
    prompt_length: tuple[float, int] | None = None
    response_length: tuple[float, int] | None = None
    length_seed: int = 0
    # moe: TE's fused token permute / unpermute (Megatron-LM --moe-permute-fusion, what NVIDIA's MoE recipes run);
    # off: megatron-core's default index_select / scatter_add path
    moe_permute_fusion: bool = False

    PACKED_OPS = ("decoder", "gpt_chunk")

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ConfigError("ops", f"unknown operator {self.op!r}; allowed: {', '.join(OPERATORS)}")
        for name in ("seq_length", "micro_batch_size", "tp", "cp", "ep", "num_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, f"must be a positive integer, got {value!r}")
        if self.etp is None:
            object.__setattr__(self, "etp", self.tp)
        if self.sequence_parallel is None:
            object.__setattr__(self, "sequence_parallel", self.tp > 1)
        if self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)
        if self.dtype not in PRECISIONS:
            raise ConfigError("dtype", f"must be {' or '.join(PRECISIONS)}, got {self.dtype!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError("fp8_recipe", f"must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
        if self.fp8_recipe != "delayed" and self.dtype != "fp8":
            raise ConfigError("fp8_recipe", f"needs dtype fp8, got dtype {self.dtype!r}")
        if self.cp > 1 and self.seq_length % (2 * self.cp):
            raise ConfigError("seq_length", f"{self.seq_length} must be divisible by 2*cp={2 * self.cp}")
        if self.sequence_parallel and (self.seq_length // self.cp) % self.tp:
            raise ConfigError("seq_length", f"seq_length/cp must be divisible by tp={self.tp} with sequence parallel")
        if self.moe_permute_fusion and not self.model_spec().is_moe:
            raise ConfigError("moe_permute_fusion", f"{self.model} has no MoE layers to permute tokens for")
        if self.max_token_len is not None:
            if self.op not in self.PACKED_OPS:
                raise ConfigError("max_token_len", f"packed input is built for ops {', '.join(self.PACKED_OPS)} only")
            if not self.use_te:
                # megatron-core's local DotProductAttention asserts packed_seq_params is None
                raise ConfigError("use_te", "packed THD input (max_token_len) needs Transformer Engine attention")
            if self.micro_batch_size != 1:
                raise ConfigError("micro_batch_size", "must be 1 with packed input (one packed row)")
            self.packed_micro_batch()  # raises ConfigError for a distribution that cannot be drawn
        elif self.prompt_length or self.response_length or self.length_seed != 0:
            raise ConfigError("prompt_length", "length distributions need packed input (max_token_len)")

    @property
    def world_size(self) -> int:
        """Ranks the case runs on: the tp x cp grid, widened so the expert grid (ep x etp) fits."""
        dense = self.tp * self.cp
        expert = self.ep * self.etp
        world = dense * expert // math.gcd(dense, expert)
        return world

    @property
    def case_id(self) -> str:
        """Stable id: readable prefix + hash of every field (resume keys on it); a field added later counts only
        when it differs from its default, so earlier results keep their ids."""
        data = dataclasses.asdict(self)
        if data["fp8_recipe"] == "delayed":
            del data["fp8_recipe"]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        # fields added later: the ids of older cases stay
        for key in ("max_token_len", "prompt_length", "response_length", "length_seed", "moe_permute_fusion"):
            if data[key] == defaults[key]:
                del data[key]
        fields = json.dumps(data, sort_keys=True)
        digest = hashlib.sha1(fields.encode()).hexdigest()[:10]
        model = re.sub(r"[^A-Za-z0-9._-]", "_", Path(self.model).name.removesuffix(".json"))
        sizes = f"tp{self.tp}.cp{self.cp}.ep{self.ep}.s{self.seq_length}.b{self.micro_batch_size}"
        return f"{model}.{self.op}.{sizes}.{digest}"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        reject_unknown_fields(cls, data, "case")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError("case", str(exc)) from exc

    def packed_micro_batch(self):
        """The packed micro-batch of a case with max_token_len (`testbench.packed.PackedMicroBatch`), else None."""
        if self.max_token_len is None:
            return None
        from ..specs.lengths import LengthDistribution, SequenceLengths
        from .packed import single_micro_batch

        if self.max_token_len < self.seq_length:
            raise ConfigError("max_token_len", f"{self.max_token_len} is below seq_length={self.seq_length}")
        if (self.prompt_length is None) != (self.response_length is None):
            raise ConfigError("prompt_length", "give both prompt_length and response_length, or neither")
        try:
            if self.prompt_length is None:
                fixed = LengthDistribution.from_histogram("sequence_len", [(self.seq_length, 1)])
                lengths = SequenceLengths(sequence=fixed, seed=self.length_seed)
            else:
                lengths = SequenceLengths.from_mean_max(
                    tuple(self.prompt_length), tuple(self.response_length), seed=self.length_seed
                )
        except TypeError as exc:
            raise ConfigError("prompt_length", f"must be [mean, max] in tokens ({exc})") from exc
        if lengths.max_tokens > self.seq_length:
            raise ConfigError("seq_length", f"{self.seq_length} is below the longest sequence ({lengths.max_tokens})")
        return single_micro_batch(lengths, self.max_token_len, self.tp, self.cp)

    def model_spec(self) -> ModelSpec:
        spec = load_model_spec(self.model)
        if self.op == "gpt_chunk":
            spec = spec.with_num_layers(self.num_layers)
        return spec

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(
            num_gpus=self.world_size,
            tp=self.tp,
            cp=self.cp,
            ep=self.ep,
            etp=self.etp,
            sequence_parallel=self.sequence_parallel,
            cp_comm_type=self.cp_comm_type,
        )

    def workload(self) -> Workload:
        dp = self.parallel().dp
        return Workload(
            seq_length=self.seq_length,
            micro_batch_size=self.micro_batch_size,
            global_batch_size=self.micro_batch_size * dp,
            precision=self.dtype,
            fp8_recipe=self.fp8_recipe,
        )

    def layer_index(self, spec: ModelSpec) -> int:
        """The decoder layer whose shape the op takes: first MoE layer for moe, first dense layer for mlp."""
        want_moe = self.op == "moe" or (self.op == "decoder" and spec.is_moe)
        for i in range(spec.num_layers):
            if spec.is_moe_layer(i) == want_moe:
                return i
        return 0


def check_case(case: Case) -> None:
    """Raise ConfigError if the model cannot be split as the case asks (heads, groups, experts), or is one whose
    layers the testbench does not build (gated DeltaNet, Mamba: the GPU machine has neither flash-linear-attention
    nor mamba_ssm)."""
    spec = case.model_spec()
    if spec.hybrid_layer_pattern or spec.has_linear_attention:
        raise ConfigError("model", f"{case.model}: the testbench builds softmax-attention GPT layers only")
    if spec.num_attention_heads % case.tp or (spec.num_query_groups % case.tp and not spec.multi_latent_attention):
        raise ConfigError("tp", f"{case.model}: heads/query groups not divisible by tp={case.tp}")
    if case.op == "moe" and not spec.is_moe:
        raise ConfigError("ops", f"{case.model} has no MoE layers (op 'moe')")
    if case.ep > 1:
        if not spec.is_moe:
            raise ConfigError("ep", f"{case.model} is not an MoE model")
        if spec.num_moe_experts % case.ep:
            raise ConfigError("ep", f"{spec.num_moe_experts} experts not divisible by ep={case.ep}")
        if case.tp > 1 and not case.sequence_parallel:
            raise ConfigError("sequence_parallel", "must be on with ep > 1 and tp > 1")


def expand_cases(
    models: list[str],
    ops: list[str],
    seq_lengths: list[int],
    micro_batch_sizes: list[int] = (1,),
    tps: list[int] = (1,),
    cps: list[int] = (1,),
    eps: list[int] = (1,),
    sequence_parallel: bool | None = None,
    use_te: bool = True,
    num_layers: int = 2,
    max_world_size: int | None = None,
) -> tuple[list[Case], list[tuple[dict[str, Any], str]]]:
    """The grid of cases, and the combinations skipped with the reason why.

    Combinations that cannot apply (ep > 1 for a dense model or a non-MoE op, heads not divisible by tp,
    world size above `max_world_size`) are skipped, not errors.
    """
    cases: list[Case] = []
    skipped: list[tuple[dict[str, Any], str]] = []
    for model in models:
        for op in ops:
            for tp in tps:
                for cp in cps:
                    for ep in eps:
                        for seq in seq_lengths:
                            for mbs in micro_batch_sizes:
                                raw = dict(
                                    model=model,
                                    op=op,
                                    seq_length=seq,
                                    micro_batch_size=mbs,
                                    tp=tp,
                                    cp=cp,
                                    ep=ep,
                                    sequence_parallel=sequence_parallel,
                                    use_te=use_te,
                                    num_layers=num_layers,
                                )
                                try:
                                    if ep > 1 and op not in ("moe", "decoder", "gpt_chunk"):
                                        raise ConfigError("ep", f"op {op} has no experts")
                                    case = Case(**raw)
                                    check_case(case)
                                    if max_world_size is not None and case.world_size > max_world_size:
                                        raise ConfigError("world_size", f"{case.world_size} > {max_world_size} GPUs")
                                except ConfigError as exc:
                                    skipped.append((raw, str(exc)))
                                    continue
                                cases.append(case)
    seen: set[str] = set()
    unique = []
    for c in cases:
        if c.case_id not in seen:
            seen.add(c.case_id)
            unique.append(c)
    return unique, skipped


def load_case_file(path: str | Path) -> list[Case]:
    """Cases from a JSON file: a list of case objects, or {"cases": [...]}."""
    p = Path(path)
    if p.suffix != ".json":
        raise ConfigError(str(p), "a case file must be JSON (a list of case objects)")
    from ..files import CONFIG_LIMIT_BYTES, read_json_bounded

    data: Any = read_json_bounded(p, "case_file", CONFIG_LIMIT_BYTES)
    if isinstance(data, dict):
        data = data.get("cases")
    if not isinstance(data, list) or not all(isinstance(c, dict) for c in data):
        raise ConfigError(str(p), "must hold a list of case objects (or {'cases': [...]})")
    cases = []
    for i, raw in enumerate(data):
        try:
            case = Case.from_dict(raw)
            check_case(case)
        except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"cases[{i}]", f"{p}: malformed case ({' '.join(str(exc).split())})") from exc
        cases.append(case)
    return cases


def group_by_world_size(cases: list[Case]) -> dict[int, list[Case]]:
    groups: dict[int, list[Case]] = {}
    for c in cases:
        groups.setdefault(c.world_size, []).append(c)
    return dict(sorted(groups.items()))
