"""The phases of one colocated verl PPO / GRPO step, each with its time and peak memory per GPU.

Order (verl/trainer/ppo/ray_trainer.py fit, verl 0.9.1): weight sync to the rollout engine -> rollout generation
-> old log-prob (actor, forward) -> ref log-prob (forward, with a KL loss or KL reward) -> critic values (PPO) ->
critic update (PPO) -> actor update. All run one after another on the same GPUs, so the step time is their sum.

Batches (verl's megatron actor, verl/workers/actor/megatron_actor.py; the engine workers the same): a step holds
train_batch_size prompts x rollout.n responses = S sequences; the actor update runs ppo_epochs x
(train_batch_size / ppo_mini_batch_size) optimizer steps of ppo_mini_batch_size x n sequences each; the log-prob
passes run forward over all S sequences. With dynamic batching a micro-batch packs up to `*_max_token_len_per_gpu`
x CP tokens (verl multiplies by CP, see `export.verl._token_budget`) and verl never splits a sequence
(verl/utils/seqlen_balancing.py rearrange_micro_batches asserts max_token_len >= the longest sequence).

Each pass is `costmodel.estimate` of a Workload (`pass_workload`): with dynamic batching the step's sequences are
drawn from `specs.lengths.SequenceLengths` and packed as verl packs them (time from the packed tokens, sum s^2 and
padding; memory from the largest micro-batch); with fixed micro-batches time at the mean length and memory at the
longest. Then the state other engines leave resident on the GPU is added to the peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..costmodel.collectives import collective_time_s
from ..costmodel.compute import memory_bound_time_s
from ..costmodel.estimate import CostOptions, Estimate, estimate
from ..errors import ConfigError
from ..specs.hardware import ClusterSpec, GPUSpec
from ..specs.lengths import SequenceLengths
from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, RecomputeConfig, Workload
from ..theory.memory import BF16_BYTES, GIB
from ..theory.params import ParameterCounts, stage_parameters
from .offload import Transition

MIB = 2**20


@dataclass(frozen=True)
class Batching:
    """One pass's micro-batching as verl configures it: a per-GPU token budget (dynamic batching; verl's value,
    before its multiplication by CP) or a fixed number of sequences per micro-batch."""

    max_token_len_per_gpu: int | None = None
    micro_batch_size: int | None = None
    key: str = ""  # the verl key that set it, for error messages

    def __post_init__(self) -> None:
        if (self.max_token_len_per_gpu is None) == (self.micro_batch_size is None):
            raise ConfigError(self.key or "batching", "needs exactly one of a token budget or a micro-batch size")

    @property
    def dynamic(self) -> bool:
        return self.max_token_len_per_gpu is not None


def pass_workload(
    batching: Batching,
    parallel: ParallelConfig,
    lengths: SequenceLengths,
    sequences: int,
    mode: str,
    recompute: RecomputeConfig,
    for_memory: bool,
    numerics: tuple[str, str] = ("bf16", "delayed"),
) -> Workload:
    """The Workload of one pass over `sequences` sequences.

    Dynamic batching: the sequences are `lengths` (`specs.lengths.SequenceLengths`), packed into micro-batches of
    max_token_len = verl's per-GPU budget x CP as verl packs them, so one Workload prices both time (the packed
    tokens, sum s^2, padding) and memory (the largest micro-batch); `for_memory` does not matter.
    Fixed micro-batches (`micro_batch_size`): `Workload.lengths` needs a token budget, so every sequence is taken
    at the mean length (`for_memory` False: time) or at the longest (True: memory). `numerics`: (precision,
    fp8 recipe) of the engine's GEMMs (override_transformer_config fp8 / fp8_recipe)."""
    precision, recipe = numerics
    recompute = recompute if mode == "train" else RecomputeConfig()
    if batching.dynamic:
        budget = int(batching.max_token_len_per_gpu) * parallel.cp
        if budget < lengths.max_tokens:
            raise ConfigError(
                batching.key,
                f"{batching.max_token_len_per_gpu} x cp {parallel.cp} = {budget} tokens is below the longest "
                f"sequence ({lengths.max_tokens} = max prompt + max response): verl asserts max_token_len >= the "
                "longest sequence (seqlen_balancing.py rearrange_micro_batches)",
            )
        return Workload(
            lengths.max_tokens, 1, sequences, recompute, precision, mode, budget, fp8_recipe=recipe, lengths=lengths,
            image_tokens_per_sequence=lengths.image_tokens,
        )  # fmt: skip
    seq = lengths.max_tokens if for_memory else max(1, round(lengths.mean_tokens))
    return Workload(
        seq, int(batching.micro_batch_size), sequences, recompute, precision, mode, fp8_recipe=recipe,
        image_tokens_per_sequence=lengths.image_tokens,
    )  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """One phase of the step: seconds, peak GiB per GPU (the pass's own peak plus what other engines keep
    resident), and whether that fits the GPU (`usable_gib`)."""

    name: str
    time_s: float | None
    peak_memory_gib: float
    usable_gib: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return self.peak_memory_gib <= self.usable_gib

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "time_s": self.time_s,
            "peak_memory_gib": self.peak_memory_gib,
            "usable_gib": self.usable_gib,
            "fits": self.fits,
            **self.detail,
        }


@lru_cache(maxsize=512)
def pass_cost(
    model: ModelSpec,
    parallel: ParallelConfig,
    batching: Batching,
    lengths: SequenceLengths,
    sequences: int,
    mode: str,
    recompute: RecomputeConfig,
    gpu: GPUSpec,
    options: CostOptions,
    numerics: tuple[str, str] = ("bf16", "delayed"),
) -> tuple[Estimate, Estimate]:
    """(estimate for time, estimate for memory) of one pass: one packed estimate with dynamic batching, the mean
    and the longest length with fixed micro-batches (`pass_workload`). Memoised on its inputs: a step prices the
    same pass for old and ref log-prob (one budget) and the same actor update for every offload setting and
    log-prob budget the search tries (every input is a frozen dataclass; a calibration hashes by identity)."""
    timed_w = pass_workload(batching, parallel, lengths, sequences, mode, recompute, False, numerics)
    timed = estimate(model, parallel, timed_w, gpu, options)
    peak_w = pass_workload(batching, parallel, lengths, sequences, mode, recompute, True, numerics)
    if peak_w == timed_w:
        return timed, timed
    return timed, estimate(model, parallel, peak_w, gpu, options)


@dataclass(frozen=True)
class WeightSync:
    """verl's weight sync from the Megatron actor to the colocated rollout engine, per GPU.

    verl 0.9.1: ActorRolloutRefWorker.update_weights (verl/workers/engine_workers.py) resumes the rollout's weights,
    calls MegatronEngine.get_per_tensor_param (verl/workers/engine/megatron/transformer_impl.py), which loads the
    parameters (`load_megatron_model_to_gpu(load_grad=False)`) and streams full Hugging Face tensors from
    Megatron-Bridge's `export_hf_weights`: each parameter is broadcast from the pipeline stage that owns it and
    all-gathered over TP (and EP for experts), so every rank sees every full bf16 tensor. vLLM
    (vllm_rollout.py vLLMRollout.update_weights) receives them through BucketedWeightSender: tensors are copied into
    a GPU bucket (rollout.checkpoint_engine.update_weights_bucket_megabytes, 2048 MB by default) whose CUDA IPC handle
    goes over ZMQ to the vLLM worker on the same GPU, which loads its own rollout-TP shard of each tensor; SGLang
    (sglang_rollout.py ServerAdapter.update_weights) sends the same tensors in buckets through
    update_weights_from_tensor. Then the actor's parameters are offloaded (param_offload) and the KV cache resumed.

    Per GPU: PP broadcast of the TP shards, 2 * P / tp bytes (all_gather factor (pp-1)/pp over pp ranks); TP
    all-gather of the full tensors, 2 * P bytes ((tp-1)/tp); EP all-gather of the experts, 2 * P_experts / tp;
    HBM: the bucket copy (read + write 2 * P) and the rollout's shard load (read + write 2 * P / rollout_tp)."""

    total_params: float
    expert_params: float
    bytes_full: float
    rollout_weights_bytes: float
    comm_s: float
    local_copy_s: float

    @property
    def time_s(self) -> float:
        return self.comm_s + self.local_copy_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "bf16_model_gib": self.bytes_full / GIB,
            "rollout_weights_gib": self.rollout_weights_bytes / GIB,
            "gather_s": self.comm_s,
            "local_copy_s": self.local_copy_s,
        }


def model_parameter_counts(model: ModelSpec) -> ParameterCounts:
    """Whole-model parameter counts (one rank holding everything)."""
    return stage_parameters(model, ParallelConfig(num_gpus=1), 0, model.padded_vocab_size(1))


def weight_sync(model: ModelSpec, parallel: ParallelConfig, rollout_tp: int, gpu: GPUSpec) -> WeightSync:
    """`WeightSync` of `model` from the training layout `parallel` to a rollout engine of TP `rollout_tp`."""
    counts = model_parameter_counts(model)
    total, experts = float(counts.total), float(counts.experts)
    full = BF16_BYTES * total
    cluster = ClusterSpec(gpu, parallel.num_gpus)
    comm = collective_time_s("all_gather", parallel.pp, full / parallel.tp, cluster, parallel.tp * parallel.cp)
    comm += collective_time_s("all_gather", parallel.tp, full, cluster, 1)
    if parallel.ep > 1:
        comm += collective_time_s("all_gather", parallel.ep, BF16_BYTES * experts / parallel.etp, cluster, parallel.etp)
    rollout_bytes = full / rollout_tp
    local = memory_bound_time_s(2 * full + 2 * rollout_bytes, gpu, 2)
    return WeightSync(total, experts, full, rollout_bytes, comm, local)


def transition_phase(name: str, transitions: list[Transition], peak_gib: float, usable_gib: float) -> Phase:
    return Phase(
        name,
        sum(t.time_s for t in transitions),
        peak_gib,
        usable_gib,
        {"transfers": [t.to_dict() for t in transitions if t.copies or t.memset_bytes]},
    )


__all__ = [
    "Batching",
    "Phase",
    "WeightSync",
    "model_parameter_counts",
    "pass_cost",
    "pass_workload",
    "transition_phase",
    "weight_sync",
]
