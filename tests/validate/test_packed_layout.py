"""Packed (THD) validate layouts: checks, micro-batch plan, prediction inputs, the CPU refusal."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.validate.layout import Layout, load_layouts_file

PACKED = dict(
    model="Qwen3-0.6B",
    seq_length=4096,
    global_batch_size=32,
    max_token_len=8192,
    prompt_length=[512, 1024],
    response_length=[1024, 3072],
)


def test_packed_layout_plans_verl_micro_batches():
    lay = Layout(**PACKED)
    plan = lay.packing_plan()
    tokens = sum(plan.lengths)
    assert lay.num_microbatches == plan.num_microbatches >= -(-tokens // 8192)  # verl: at least ceil(tokens / max)
    assert all(mb.tokens <= 8192 for mb in plan.per_rank[0])
    assert lay.workload().max_token_len == 8192
    assert lay.workload().lengths == lay.sequence_lengths()
    # the run packs what the cost model packs
    from megatron_autotuner.specs.parallel import packed_batch

    assert packed_batch(lay.parallel(), lay.workload(), padded=False).ranks[0] == tuple(
        mb.lengths for mb in plan.per_rank[0]
    )
    assert Layout.from_dict(lay.to_dict()) == lay
    assert "packed8192" in lay.label
    # fields added later stay out of the ids of unpacked layouts
    plain = Layout(model="Qwen3-0.6B", seq_length=4096)
    assert "max_token_len" not in json.dumps(plain.layout_id)
    assert Layout(**PACKED).layout_id == lay.layout_id != Layout(**{**PACKED, "length_seed": 1}).layout_id


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"use_te": False}, "use_te"),
        ({"micro_batch_size": 2, "global_batch_size": 64}, "micro_batch_size"),
        ({"max_token_len": 2048}, "max_token_len"),  # below the longest sequence
        ({"response_length": [1024, 4096]}, "seq_length"),  # 1024 + 4096 > 4096
        ({"response_length": [0, 3072]}, "response_len"),
        ({"response_length": None}, "prompt_length"),
        ({"prompt_length": [512]}, "prompt_length"),
    ],
)
def test_bad_packed_layouts_are_one_config_error(changes, field):
    with pytest.raises(ConfigError) as err:
        Layout(**{**PACKED, **changes})
    assert field in str(err.value)
    assert "\n" not in str(err.value)


def test_length_fields_need_packing():
    with pytest.raises(ConfigError, match="max_token_len"):
        Layout(model="Qwen3-0.6B", seq_length=4096, prompt_length=[10, 20], response_length=[10, 20])


def test_packed_layout_needs_sequences_divisible_by_dp():
    with pytest.raises(ConfigError, match="dp=2"):
        Layout(**{**PACKED, "num_gpus": 2, "global_batch_size": 31})


def test_use_te_false_in_a_layouts_file_is_refused(tmp_path):
    path = tmp_path / "layouts.json"
    path.write_text(json.dumps({"layouts": [{**PACKED, "use_te": False}]}))
    with pytest.raises(ConfigError, match="Transformer Engine"):
        load_layouts_file(path)


def test_prediction_names_what_it_was_given_and_what_the_run_packs():
    from megatron_autotuner.validate.predict import predict

    lay = Layout(**PACKED)
    pred = predict(lay, "H100-SXM")
    assert "error" not in pred
    packing = pred["assumed"]["packing"]
    assert packing["workload_max_token_len"] == 8192
    assert packing["run_num_microbatches"] == lay.num_microbatches
    assert packing["workload_lengths"]["max_tokens"] == 4096
    assert packing["run_tokens_per_iteration"] == sum(lay.packing_plan().lengths)


def test_cpu_run_records_the_packed_refusal(tmp_path):
    pytest.importorskip("torch")
    from megatron_autotuner.validate.runner import run_layout

    record = run_layout(Layout(**PACKED), "cpu", tmp_path, rank=0)
    assert record["status"] == "failed"
    assert "Transformer Engine" in record["error"] and "no CUDA device" in record["error"]


@pytest.mark.gpu
def test_packed_training_step_on_gpu(tmp_path):
    """One packed layout of a 2-layer model trains on the GPU and records its micro-batches."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import datetime as dt
    import os

    from megatron_autotuner.validate.runner import run_layout

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl", rank=0, world_size=1, timeout=dt.timedelta(seconds=120))
    lay = Layout(**{**PACKED, "num_layers": 2, "warmup_steps": 1, "steps": 2})
    record = run_layout(lay, "cuda", tmp_path, rank=0)
    assert record["status"] == "ok", record.get("error")
    assert record["packing"]["num_microbatches"] == lay.num_microbatches
    assert record["measured"]["loss"] is not None
