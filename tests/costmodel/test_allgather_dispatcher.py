"""megatron-core's allgather dispatcher, Megatron-LM's default --moe-token-dispatcher-type (MoEAllGatherTokenDispatcher,
megatron/core/transformer/moe/token_dispatcher.py @ Megatron-LM d98e8a6): every token gathered over the etp x ep group
with its router probabilities and routing map, the combine reduce-scattered in fp32. Hand-computed bytes, the layer's
time as those collectives, and the flag read, written and run as itself."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_autotuner.costmodel.collectives import collective_time_s
from megatron_autotuner.costmodel.layer import LayerContext, allgather_dispatch_s, layer_cost
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export import megatron_lm_args
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.hardware import ClusterSpec
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch
from megatron_autotuner.specs.parallel import ParallelConfig, Workload
from megatron_autotuner.theory.comm import stage_comm_volumes
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.runner import config_overrides
from tests.evidence import runs_with_prediction_before

MIXTRAL = load_model_spec("Mixtral-8x7B")  # h 4096, 8 experts, top-2
MIB = 2**20
CLUSTER = ClusterSpec(get_gpu_spec("H200"), 8)
CTX = LayerContext(cluster=CLUSTER, ep=2, tokens=4096.0, seq_length=4096, moe_permute_fusion=True)


def _ep_volumes(dispatcher: str) -> list[tuple[str, float, int, str]]:
    parallel = ParallelConfig(num_gpus=2, ep=2, moe_dispatcher=dispatcher)
    volumes = stage_comm_volumes(
        MIXTRAL, parallel, Workload(seq_length=4096, micro_batch_size=1, global_batch_size=8), 0
    )
    return [(v.collective, v.message_bytes / MIB, v.calls, v.phase) for v in volumes if v.dimension == "ep"]


def test_every_token_moves_over_the_expert_group_by_hand():
    """ep 2, 4096 tokens a rank: 8192 gathered rows. Forward: all-gather 8192 x (4096 x 2 bytes + 8 experts x (4 + 1))
    = 64.31 MiB, reduce-scatter 8192 x 4096 x 4 = 128 MiB; backward: reduce-scatter of the bf16 hidden and fp32
    probability gradients (64.25 MiB), all-gather of the fp32 combine gradient (128 MiB). 32 MoE layers x 4
    micro-batches = 128 calls each. The alltoall dispatcher moves the 8192 routed copies (64 MiB) 4 times a layer."""
    gathered = _ep_volumes("allgather")
    assert [(c, round(mib, 2), n, ph) for c, mib, n, ph in gathered] == [
        ("all_gather", 64.31, 128, "fwd"),
        ("reduce_scatter", 128.0, 128, "fwd"),
        ("reduce_scatter", 64.25, 128, "bwd"),
        ("all_gather", 128.0, 128, "bwd"),
    ]
    assert _ep_volumes("alltoall") == [("all_to_all", 64.0, 512, "fwd+bwd")]


def test_the_layer_pays_those_collectives_whatever_the_top_k_or_load():
    hidden, fp32, probs = 8192 * 4096 * 2, 8192 * 4096 * 4, 8192 * 8 * 4
    fwd, bwd = allgather_dispatch_s(MIXTRAL, CTX)
    assert fwd == pytest.approx(
        collective_time_s("all_gather", 2, hidden + probs + 8192 * 8, CLUSTER, 1)
        + collective_time_s("reduce_scatter", 2, fp32, CLUSTER, 1)
    )
    assert bwd == pytest.approx(
        collective_time_s("reduce_scatter", 2, hidden, CLUSTER, 1)
        + collective_time_s("reduce_scatter", 2, probs, CLUSTER, 1)
        + collective_time_s("all_gather", 2, fp32, CLUSTER, 1)
    )
    assert allgather_dispatch_s(MIXTRAL, replace(CTX, expert_load=1.5)) == (fwd, bwd)
    assert allgather_dispatch_s(MIXTRAL, replace(CTX, ep=1)) == (0.0, 0.0)  # a group of one moves nothing
    layer = layer_cost(MIXTRAL, 0, replace(CTX, moe_dispatcher="allgather"))
    assert layer.fwd.parts["ep"] == pytest.approx(fwd) and layer.bwd.parts["ep"] == pytest.approx(bwd)


def test_megatron_lm_default_is_read_as_allgather_and_written_back():
    flags = (
        "--num-layers 2 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096"
    )
    flags += " --num-experts 8 --moe-router-topk 2 --ffn-hidden-size 14336 --swiglu --expert-model-parallel-size 2"
    flags += " --micro-batch-size 1 --global-batch-size 8 --bf16"
    for extra, want in (("", "allgather"), (" --moe-token-dispatcher-type allgather", "allgather"),
                        (" --moe-token-dispatcher-type alltoall", "alltoall")):  # fmt: skip
        imported = launch_to_specs(read_launch(flags + extra), num_gpus=2)
        assert imported.parallel.moe_dispatcher == want
        assert not any("dispatcher" in note for note in imported.not_modelled)
        written = " ".join(megatron_lm_args(imported.model, imported.parallel, imported.workload))
        # Megatron-LM's default is written by leaving the flag out
        assert ("--moe-token-dispatcher-type" in written) == (want != "allgather")
        assert launch_to_specs(read_launch(written), num_gpus=2).parallel.moe_dispatcher == want


def test_the_overlap_needs_the_alltoall_or_flex_dispatcher():
    with pytest.raises(ConfigError, match="moe_a2a_overlap: needs the alltoall or flex dispatcher"):
        ParallelConfig(num_gpus=2, ep=2, moe_dispatcher="allgather", moe_a2a_overlap=True)


def test_validate_runs_the_allgather_dispatcher_as_itself():
    base = Layout(model="Mixtral-8x7B", num_layers=2, num_gpus=2, ep=2, seq_length=4096, global_batch_size=8)
    gathered = base.replace(moe_token_dispatcher="allgather")
    assert gathered.parallel().moe_dispatcher == "allgather" and "allgather" in gathered.label
    assert gathered.layout_id != base.layout_id
    assert Layout.from_dict(base.to_dict()).layout_id == base.layout_id
    assert config_overrides(gathered, use_te=False, device="cpu")["moe_token_dispatcher_type"] == "allgather"
    with pytest.raises(ConfigError, match="moe_token_dispatcher: must be one of alltoall, allgather"):
        base.replace(moe_token_dispatcher="deepep").check()


def test_bridge_gets_the_allgather_dispatcher_named():
    """Megatron-Bridge's MoE providers default to alltoall (e.g. gemma4_provider.py, glm_45v_provider.py @
    Megatron-Bridge 067f987), so its overrides name allgather where Megatron-LM's flags may leave it out."""
    from megatron_autotuner.export import bridge_overrides

    parallel = ParallelConfig(num_gpus=2, ep=2, moe_dispatcher="allgather")
    model = bridge_overrides(MIXTRAL, parallel, Workload(4096, 1, 8))["model"]
    assert model["moe_token_dispatcher_type"] == "allgather" and "moe_flex_dispatcher_backend" not in model


def test_two_gpu_run_peaks_hold_and_the_dispatchers_rank_within_the_regret_bar():
    """Mixtral-8x7B, 2 layers, ep 2 on 2x H200, predicted before each lease. benchmarks/results/moe_allgather_h200_x2:
    both peaks within 1%, but the allgather step ran 248 ms (profiled) against alltoall's 272 ms (its layers'
    host times recorded): two runs timed differently. Round 5 (moe_r5_h200_x2/disp, another host) ran both
    dispatchers alike, twice: unprofiled 231.6 vs 234.4 ms, profiled 240.2 vs 235.8 ms, every step within 10% of the
    model (-3.4..-6.8%) and every peak within 1.5%. The model's pick (alltoall, 1.2% ahead) is 1.2% behind unprofiled:
    within #40's 3% regret."""
    first = {}
    for row, pred in runs_with_prediction_before("moe_allgather_h200_x2"):
        measured = row["measured"]
        assert abs(pred["peak_memory_gib"] / measured["peak_gib"] - 1) < 0.01, row["label"]
        first[row["layout"].get("moe_token_dispatcher", "alltoall")] = measured["step_time_s"]
    assert first["allgather"] < 0.93 * first["alltoall"]  # the first lease's pair, timed differently: 8.7% apart
    alike = {}
    for row, pred in runs_with_prediction_before("moe_r5_h200_x2/disp", "../predicted_default_disp.json"):
        measured = row["measured"]
        assert abs(pred["step_time_s"] / measured["step_time_s"] - 1) < 0.10, row["label"]
        assert abs(pred["peak_memory_gib"] / measured["peak_gib"] - 1) < 0.015, row["label"]
        key = (row["layout"].get("moe_token_dispatcher", "alltoall"), bool(row["layout"].get("profile")))
        alike[key] = (pred["step_time_s"], measured["step_time_s"])
    assert alike[("alltoall", False)][0] < alike[("allgather", False)][0]  # the model's pick: alltoall
    regret = alike[("alltoall", False)][1] / alike[("allgather", False)][1] - 1
    assert 0 < regret < 0.03


def test_the_command_line_takes_megatron_lms_dispatcher_flags(capsys, tmp_path):
    """`--moe-token-dispatcher-type` / `--moe-flex-dispatcher-backend` on estimate and validate, as Megatron-LM spells
    them; a backend without flex, a flex dispatcher the runner cannot build and either flag beside --megatron-args are
    refused in one line."""
    import json

    from megatron_autotuner.cli import main

    common = ["--model", "Mixtral-8x7B", "--num-gpus", "2", "--ep", "2", "--seq-len", "4096", "--global-batch-size",
              "8", "--gpu", "H200"]  # fmt: skip
    ep_s = {}
    for flags in ([], ["--moe-token-dispatcher-type", "allgather"], ["--moe-token-dispatcher-type", "flex"]):
        assert main(["estimate", *common, *flags, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        ep_s[out["inputs"]["parallel"]["moe_dispatcher"]] = out["time_breakdown_s"]["exposed_comm"]["ep"]
    assert set(ep_s) == {"alltoall", "allgather", "deepep"} and ep_s["allgather"] > ep_s["alltoall"]
    dry = ["--num-layers", "2", "--dry-run", "--json", "--output-dir", str(tmp_path / "v")]
    assert main(["validate", *common, "--moe-token-dispatcher-type", "allgather", *dry]) == 0
    assert '"moe_token_dispatcher": "allgather"' in capsys.readouterr().out
    refused = (
        (["estimate", *common, "--moe-flex-dispatcher-backend", "hybridep"],
         "mat: error: moe_flex_dispatcher_backend: needs --moe-token-dispatcher-type flex"),
        (["validate", *common, "--moe-token-dispatcher-type", "flex", *dry],
         "mat: error: moe_token_dispatcher: must be one of alltoall, allgather (the runner has no DeepEP / HybridEP), "
         "got 'deepep'"),
        (["estimate", "--megatron-args", "tests/fixtures/launches/deepseek_v3_h100_1024gpu.sh", "--gpu", "H100",
          "--moe-token-dispatcher-type", "alltoall"],
         "mat: error: moe_token_dispatcher_type: --moe-token-dispatcher-type goes in the Megatron-LM launch "
         "(--moe-token-dispatcher-type) when --megatron-args is given"),
    )  # fmt: skip
    for argv, line in refused:
        assert main(argv) == 2
        assert capsys.readouterr().err.strip() == line
