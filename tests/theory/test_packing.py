"""Packed variable-length micro-batches in theory and cost model: attention per sequence (sum s^2), THD alignment
padding, memory of the largest micro-batch, time from the micro-batches of the heaviest rank."""

import math

import pytest

from megatron_autotuner.costmodel.estimate import estimate, packed_microbatch_shape
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.lengths import SequenceLengths
from megatron_autotuner.specs.parallel import num_microbatches, packed_batch, thd_alignment
from megatron_autotuner.theory.flops import attention_flops_per_token, iteration_flops
from megatron_autotuner.theory.memory import ActivationOptions, local_tokens, memory_per_stage

MODEL = load_model_spec("Qwen3-8B").with_num_layers(4)
LENGTHS = SequenceLengths.from_mean_max((700, 2048), (1500, 6144))
H100 = get_gpu_spec("H100-SXM")


def _work(**kw):
    base = dict(seq_length=LENGTHS.max_tokens, global_batch_size=64, max_token_len=16384, lengths=LENGTHS)
    return Workload(**{**base, **kw})


def test_attention_flops_are_per_sequence_not_per_packed_block():
    p = ParallelConfig(num_gpus=2)
    w = _work()
    real = packed_batch(p, w, padded=False)
    f = iteration_flops(MODEL, p, w)
    per_unit = attention_flops_per_token(MODEL, 1)
    assert f.by_operator["core_attention"]["fwd"] == pytest.approx(MODEL.num_layers * per_unit * real.sum_squares)
    assert f.tokens_per_iteration == real.total_tokens == sum(LENGTHS.sample(64))
    # the same tokens as sequences of max_token_len (a padded block) would count far more attention
    block = MODEL.num_layers * attention_flops_per_token(MODEL, 16384) * real.total_tokens
    assert f.by_operator["core_attention"]["fwd"] < block / 3


def test_alignment_padding():
    assert thd_alignment(ParallelConfig(num_gpus=4, tp=4), _work()) == (4, 1)
    assert thd_alignment(ParallelConfig(num_gpus=8, tp=4, cp=2), _work()) == (16, 1)
    assert thd_alignment(ParallelConfig(num_gpus=8, tp=4, cp=2), _work(precision="fp8")) == (16, 2048)
    assert thd_alignment(ParallelConfig(num_gpus=2, tp=2), _work(precision="fp8")) == (16, 256)
    p = ParallelConfig(num_gpus=8, tp=4, cp=2)
    padded, real = packed_batch(p, _work()), packed_batch(p, _work(), padded=False)
    for mb_p, mb_r in zip(padded.micro_batches, real.micro_batches, strict=True):
        assert all(sp % 16 == 0 and 0 <= sp - sr < 16 for sp, sr in zip(mb_p, mb_r, strict=True))
    f = iteration_flops(MODEL, p, _work())
    assert f.padding_flops > 0
    assert f.hardware_flops == pytest.approx(f.model_flops + f.recompute_flops + f.padding_flops)
    assert iteration_flops(MODEL, ParallelConfig(num_gpus=1), _work()).padding_flops == 0


def test_memory_is_that_of_the_largest_micro_batch():
    p = ParallelConfig(num_gpus=4, tp=2, cp=2)
    w = _work()
    largest = packed_batch(p, w).largest_micro_batch_tokens
    assert local_tokens(w, p) == largest // 2
    # pp=1 holds one micro-batch: the same activations as a fixed micro-batch of exactly that many tokens
    fixed = Workload(seq_length=largest, global_batch_size=64, max_token_len=largest)
    a = memory_per_stage(MODEL, p, w)[0].activations_bytes
    b = memory_per_stage(MODEL, p, fixed)[0].activations_bytes
    assert a == pytest.approx(b)
    smaller = memory_per_stage(MODEL, p, _work(max_token_len=8192))[0].activations_bytes
    assert smaller < a


def test_time_sums_the_micro_batches_of_the_heaviest_rank():
    p = ParallelConfig(num_gpus=2)
    w = _work()
    tokens, seq = packed_microbatch_shape(MODEL, p, w)
    packed = packed_batch(p, w)
    per_rank = [sum(sum(mb) for mb in r) for r in packed.ranks]
    assert tokens * packed.num_micro_batches in [pytest.approx(t) for t in per_rank]
    assert seq < w.max_token_len
    e = estimate(MODEL, p, w, H100)
    assert e.time.num_microbatches == num_microbatches(p, w) == packed.num_micro_batches
    assert math.isfinite(e.step_time_s) and e.tokens_per_iteration == packed_batch(p, w, False).total_tokens
    # longer responses: more work, more time
    longer = SequenceLengths.from_mean_max((700, 2048), (3000, 6144))
    assert estimate(MODEL, p, _work(lengths=longer), H100).step_time_s > e.step_time_s


def test_workload_rules_and_unchanged_fixed_workloads():
    with pytest.raises(ConfigError, match="need max_token_len"):
        Workload(seq_length=8192, lengths=LENGTHS)
    with pytest.raises(ConfigError, match="below seq_length"):
        _work(max_token_len=4096)
    with pytest.raises(ConfigError, match="longest sequence"):
        Workload(seq_length=4096, max_token_len=8192, lengths=LENGTHS)
    assert "lengths" not in Workload(seq_length=4096).to_dict()
    assert _work().to_dict()["lengths"]["max_tokens"] == 8192
    with pytest.raises(ConfigError, match="fused"):
        memory_per_stage(MODEL, ParallelConfig(num_gpus=1), _work(), ActivationOptions(flash_attention=False))
    with pytest.raises(ConfigError, match="divisible by dp"):
        num_microbatches(ParallelConfig(num_gpus=3), _work())


def _forward_step(monkeypatch, sequences: int, max_token_len: int, exact: bool):
    """Qwen3-8B (36 layers) log-prob pass on 2 GPUs, dp2, of `sequences` GRPO sequences (prompt 512 of 1k, response
    2.5k of 4k), packed exactly (sampling off) or as the cost model packs them."""
    import megatron_autotuner.specs.lengths as lengths_module
    import megatron_autotuner.specs.parallel as parallel_module

    lengths = SequenceLengths.from_mean_max((512, 1024), (2500, 4096))
    work = Workload(seq_length=lengths.max_tokens, global_batch_size=sequences, max_token_len=max_token_len,
                    lengths=lengths, mode="forward")  # fmt: skip
    with monkeypatch.context() as m:
        if exact:
            m.setattr(lengths_module, "SAMPLE_MIN_MICRO_BATCHES", 10**9)
        parallel_module._packed.cache_clear()
        result = estimate(load_model_spec("Qwen3-8B"), ParallelConfig(num_gpus=2), work, H100)
        parallel_module._packed.cache_clear()
    return result


def test_a_sampled_packing_prices_a_log_prob_pass_as_the_exact_one(monkeypatch):
    """4,096 sequences at a 20,480-token budget (310 micro-batches per rank, packed from a sample of one in two):
    the step within 0.5% of the exact packing's (0.002%), and the same peak (both reach the device limit)."""
    exact = _forward_step(monkeypatch, 4096, 20480, exact=True)
    sampled = _forward_step(monkeypatch, 4096, 20480, exact=False)
    assert sampled.step_time_s == pytest.approx(exact.step_time_s, rel=0.005)
    assert sampled.peak_memory_gib == pytest.approx(exact.peak_memory_gib, rel=0.01)


def test_cached_logits_segments_stop_at_the_device(monkeypatch):
    """A long forward-only pass of growing packed micro-batches, replayed without a limit, would keep a new logits
    segment per micro-batch (hundreds of GiB); PyTorch releases its free cached segments when cudaMalloc fails, so
    the pass peaks at the memory the plan allows the GPU and fits."""
    from dataclasses import replace

    from megatron_autotuner.costmodel.estimate import CostOptions
    from megatron_autotuner.theory.memory import MemoryAllowance

    lengths = SequenceLengths.from_mean_max((512, 1024), (2500, 4096))
    work = Workload(seq_length=lengths.max_tokens, global_batch_size=1024, max_token_len=20480, lengths=lengths,
                    mode="forward")  # fmt: skip
    model, parallel = load_model_spec("Qwen3-8B"), ParallelConfig(num_gpus=2)
    # PyTorch's default allocator (expandable segments grow one segment in place instead)
    limited = estimate(model, parallel, work, H100, CostOptions(expandable_segments=False))
    unbounded = estimate(model, parallel, work, H100, CostOptions(allowance=MemoryAllowance(device_bytes=math.inf)))
    usable = H100.hbm_gib * (1 - limited.options.memory_margin)
    assert unbounded.memory_breakdown_gib["allowance"] > H100.hbm_gib and not unbounded.fits
    assert limited.peak_memory_gib == pytest.approx(usable) and limited.fits
    assert replace(limited, peak_memory_gib=0).step_time_s == unbounded.step_time_s  # memory only


def test_a_long_packed_forward_pass_released_its_cached_segments_on_an_h100():
    """1x H100 (benchmarks/release_limit.py, predictions committed before the run): Qwen3-0.6B forward-only over GRPO
    lengths at a 16k budget. 256 sequences: the replay of its logits alone predicted the peak (60.8 vs 61.2 GiB)
    and nothing was released; 512 sequences, whose replay passes the device: the run finished, PyTorch freed 13
    cached segments on the way, and the peak (72.1 GiB) lies under the limit it was predicted at (75.7: usable
    memory), above that less the largest logits request (a fp32 copy, 9.3 GiB): the band the rule allows."""
    import json
    from pathlib import Path

    rows = json.loads(
        (Path(__file__).resolve().parents[2] / "benchmarks/results/release_limit_h100/report.json").read_text()
    )["rows"]
    small, large = sorted(rows, key=lambda r: r["predicted_peak_gib"])
    assert small["segment_frees"] == 0
    assert small["measured_peak_gib"] == pytest.approx(small["predicted_peak_gib"], rel=0.05)
    assert large["status"] == "ok" and large["segment_frees"] > 0
    fp32_logits_gib = 4 * 16384 * 151936 / 2**30
    assert large["predicted_peak_gib"] - fp32_logits_gib < large["measured_peak_gib"] < large["predicted_peak_gib"]
