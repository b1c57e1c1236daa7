"""mat rlhf: the offload model, the verl launch reader, the step's phases, the shared-layout search and the
overrides it writes (checked with verl's own config code when verl imports)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from megatron_autotuner.cli import main
from megatron_autotuner.costmodel.estimate import estimate
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export.bridge import MegatronArgs
from megatron_autotuner.export.verl import MCORE_LAYOUT_KEYS, VERL_KEYS
from megatron_autotuner.rlhf import (
    Batching,
    evaluate_step,
    launch_inputs,
    launch_lengths,
    model_from_launch,
    read_verl_file,
    read_verl_text,
    search_step,
)
from megatron_autotuner.rlhf.launch import PHASE_BATCH_KEYS, PHASE_MEMORY_KEYS
from megatron_autotuner.rlhf.offload import (
    during_rollout,
    host_copy_gbps,
    load_state,
    model_state_bytes,
    offload_state,
)
from megatron_autotuner.rlhf.phases import pass_cost, pass_workload
from megatron_autotuner.rlhf.verl_args import VERL_DEFAULTS
from megatron_autotuner.search.space import token_budget_choices
from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.lengths import SequenceLengths
from megatron_autotuner.theory.memory import memory_per_stage

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "verl_grpo_qwen3_8b_h100_8gpu.sh"
H100 = get_gpu_spec("H100-SXM")


@pytest.fixture(scope="module")
def qwen8b():
    return load_model_spec("Qwen3-8B")


@pytest.fixture(scope="module")
def example_inputs(qwen8b):
    launch = read_verl_file(str(EXAMPLE))
    return launch, launch_inputs(launch, qwen8b, 8, None)


# ---------------------------------------------------------------------------------------------------------------
# offload


@pytest.mark.parametrize("dist_opt", [True, False])
def test_offload_bytes_are_theorys_per_rank_bytes(qwen8b, dist_opt):
    p = ParallelConfig(8, tp=2, pp=2, use_distributed_optimizer=dist_opt)
    w = Workload(4096, 1, 64)
    state = model_state_bytes(qwen8b, p, w)
    stages = memory_per_stage(qwen8b, p, w, padded_vocab_size=qwen8b.padded_vocab_size(2))
    top = max(stages, key=lambda s: s.model_state_bytes)
    assert state.params_bytes == top.weights_bytes
    assert state.grads_bytes == top.gradients_bytes
    assert state.optimizer_bytes == top.optimizer_bytes
    # bf16 params, fp32 main grads, 12 bytes of Adam state per parameter of the shard
    n = top.parameters.total
    assert state.params_bytes == 2 * n and state.grads_bytes == 4 * n
    # verl moves the distributed optimizer's fp32 master shard + moments; without it the moments only
    assert state.optimizer_moved_bytes == pytest.approx(state.optimizer_bytes * (1.0 if dist_opt else 2 / 3))
    freed = during_rollout(state, param_offload=True, optimizer_offload=True)
    assert freed.freed_bytes == pytest.approx(state.params_bytes + state.grads_bytes + state.optimizer_moved_bytes)
    assert during_rollout(state, param_offload=False, optimizer_offload=False).freed_bytes == 0


def test_copy_time_scales_with_bandwidth(qwen8b):
    state = model_state_bytes(qwen8b, ParallelConfig(8, tp=2), Workload(4096, 1, 64))
    slow = offload_state("x", state, H100, None, params=True, optimizer=True)
    fast = offload_state(
        "x", state, replace(H100, host_link_gbps=2 * H100.host_link_gbps), None, params=True, optimizer=True
    )
    assert slow.time_s == pytest.approx(2 * fast.time_s)
    assert slow.time_s == pytest.approx(
        (state.params_bytes + state.optimizer_moved_bytes) / (H100.host_link_gbps * 1e9)
    )
    # loading also re-allocates and zeroes the grad buffer on the GPU (no host copy of gradients)
    load = load_state("x", state, H100, None, params=True, grads=True, optimizer=False)
    assert load.moved_bytes == state.params_bytes and load.memset_bytes == state.grads_bytes


def test_measured_host_copy_table_replaces_the_spec_peak():
    class Cal:
        source = "unit-test table"

        def host_copy_gbps(self, direction, pinned, nbytes):
            return {("h2d", True): 50.0, ("d2h", True): 45.0}.get((direction, pinned))

    assert host_copy_gbps(H100, Cal(), "h2d", True, 2**30)[0] == 50.0
    gbps, source = host_copy_gbps(H100, Cal(), "d2h", False, 2**30)  # not measured: the spec peak
    assert gbps == H100.host_link_gbps and "spec peak" in source
    with pytest.raises(ConfigError, match="host_link_gbps"):
        host_copy_gbps(replace(H100, host_link_gbps=None), None, "h2d", True, 1)


# ---------------------------------------------------------------------------------------------------------------
# the launch reader


def test_example_launch_reads(example_inputs, qwen8b):
    launch, inputs = example_inputs
    assert launch.get("rollout_n") == 8 and launch.get("train_batch_size") == 256
    assert launch.layout("actor")["tensor_model_parallel_size"] == 2
    assert launch.layout("ref") == launch.layout("actor")  # ref interpolates the actor's
    assert launch.use_reference and not launch.use_critic  # grpo + KL loss
    s = inputs.spec
    assert s.sequences == 2048 and s.lengths.max_tokens == 1024 + 4096
    # only the maxima are known: the means are assumed equal to them, and the notes say so
    assert s.lengths == SequenceLengths.from_mean_max((1024.0, 1024), (4096.0, 4096))
    assert s.tokens_per_step == 2048 * 5120
    assert any("assumed = the maximum" in n and "--mean-prompt-len / --mean-response-len" in n for n in inputs.notes)
    assert inputs.choice.param_offload and inputs.choice.optimizer_offload
    model, note = model_from_launch(launch, None)
    assert model.name == qwen8b.name and "Qwen/Qwen3-8B" in note


def test_lines_and_yaml_read_the_same():
    lines = "data.train_batch_size=128\nactor_rollout_ref.actor.megatron.tensor_model_parallel_size=4\n"
    nested = yaml.safe_dump(
        {
            "data": {"train_batch_size": 128},
            "actor_rollout_ref": {"actor": {"megatron": {"tensor_model_parallel_size": 4}}},
        }
    )
    assert read_verl_text(lines).values == read_verl_text(nested).values


@pytest.mark.parametrize(
    "text,field,rule",
    [
        ("python3 -m verl.trainer.main_ppo --config-name=my_cfg a.b=1", "--config-name", "my_cfg"),
        ("python3 -m verl.trainer.main_ppo --config-name ppo_trainer a.b=1", "--config-name", "ppo_trainer"),
        ("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=4", "ref.megatron", "share one parallel layout"),
        ("actor_rollout_ref.actor.megatron.override_transformer_config.fp8=e5m2", "fp8", "must be one of e4m3"),
    ],
)
def test_bad_launches_are_one_config_error(text, field, rule):
    with pytest.raises(ConfigError) as err:
        read_verl_text(text)
    assert field in err.value.field and rule in str(err.value)


@pytest.mark.parametrize(
    "text,note",
    [
        (
            "actor_rollout_ref.actor.ppo_mini_batchsize=4",
            "actor_rollout_ref.actor.ppo_mini_batchsize: not a verl key mat rlhf reads (nearest known key: "
            "actor_rollout_ref.actor.ppo_mini_batch_size); predicted without it",
        ),
        (
            "actor_rollout_ref.actor.megatron.tensor_parallel_size=2",
            "(nearest known key: actor_rollout_ref.actor.megatron",
        ),
        ("trainer.balance_batch=True", "trainer.balance_batch: not modelled: sequences are assumed balanced"),
        (
            "python3 -m verl.trainer.main_ppo data.max_response_length=$RESP data.train_batch_size=8 $@",
            "data.max_response_length: empty (a variable not set here?), verl's default used",
        ),
        ("python3 -m verl.trainer.main_ppo --config-name dapo_megatron_trainer", "read with ppo_megatron_trainer's"),
    ],
)
def test_what_mat_rlhf_does_not_read_is_a_note(text, note):
    """Keys it does not know, keys it knows but does not price, values a variable left empty, configs built on
    ppo_megatron_trainer: read on, each with a note (real launches carry them; a refusal would answer nothing)."""
    launch = read_verl_text(text + " data.train_batch_size=8")
    assert any(note in n for n in launch.notes), launch.notes


def test_a_verl_script_is_read_as_bash_runs_it(tmp_path):
    script = tmp_path / "run.sh"
    script.write_text(
        "set -x\nTP=${TP:-4}\nMODEL=/data/models/Qwen/Qwen3-8B-Instruct\nDATA=(data.train_batch_size=$((16*4)))\n"
        "ray job submit --address=x -- python3 -m verl.trainer.main_ppo --config-path=config \\\n"
        '    --config-name=ppo_megatron_trainer "${DATA[@]}" actor_rollout_ref.model.path=$MODEL \\\n'
        "    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP trainer.project_name=$PROJECT $@\n"
    )
    launch = read_verl_file(str(script))
    assert launch.get("train_batch_size") == 64 and launch.layout("actor")["tensor_model_parallel_size"] == 4
    assert launch.get("model_path") == "/data/models/Qwen/Qwen3-8B-Instruct"
    assert read_verl_file(str(script), {"TP": "2"}).layout("actor")["tensor_model_parallel_size"] == 2


def test_keys_that_do_not_matter_are_accepted():
    launch = read_verl_text(
        "actor_rollout_ref.actor.optim.lr=3e-6 trainer.project_name=x reward.reward_manager.name=naive "
        "actor_rollout_ref.actor.megatron.seed=7 data.train_files=/a.parquet"
    )
    assert launch.get("train_batch_size") == VERL_DEFAULTS["train_batch_size"]


def test_a_whole_command_with_backslashes_and_quotes():
    text = (
        "CUDA_DEVICE_MAX_CONNECTIONS=1 python3 -m verl.trainer.main_ppo --config-path=config \\\n"
        "    --config-name='ppo_megatron_trainer.yaml' \\\n"
        '    trainer.logger=\'["console","wandb"]\' \\\n'
        "    data.max_prompt_length=2048 2>&1 | tee log.txt\n"
    )
    launch = read_verl_text(text)
    assert launch.get("max_prompt_length") == 2048 and launch.values["trainer.logger"] == ["console", "wandb"]


def test_reader_and_writer_share_one_key_table():
    args = {"tensor_model_parallel_size": 2, "bf16": True, "micro_batch_size": 1}
    assert tuple(MegatronArgs(args).parallel_sizes()) == MCORE_LAYOUT_KEYS
    assert set(VERL_DEFAULTS) == set(VERL_KEYS) - {"actor_megatron", "ref_megatron", "critic_megatron"} - {
        "actor_transformer_overrides",
        "actor_ddp_overrides",
        "actor_optimizer_overrides",
    }


# ---------------------------------------------------------------------------------------------------------------
# the step


def test_step_total_is_the_sum_of_its_phases(example_inputs):
    _, inputs = example_inputs
    r = evaluate_step(inputs.spec, inputs.choice, H100, inputs.options)
    names = [p.name for p in r.phases]
    assert names == ["weight sync", "rollout", "old log-prob", "ref log-prob", "actor update"]
    assert r.total_s == pytest.approx(sum(p.time_s for p in r.phases if p.time_s is not None))
    assert not r.includes_rollout
    given = evaluate_step(replace(inputs.spec, rollout_s=100.0), inputs.choice, H100, inputs.options)
    assert given.total_s == pytest.approx(r.total_s + 100.0)


def test_offload_trades_time_for_rollout_memory(example_inputs):
    _, inputs = example_inputs
    on = evaluate_step(inputs.spec, inputs.choice, H100, inputs.options)
    off_choice = replace(inputs.choice, param_offload=False, optimizer_offload=False, ref_param_offload=False)
    off = evaluate_step(inputs.spec, off_choice, H100, inputs.options)
    rollout = {r.choice.param_offload: next(p for p in r.phases if p.name == "rollout") for r in (on, off)}
    assert rollout[True].peak_memory_gib < rollout[False].peak_memory_gib
    assert on.total_s > off.total_s


def test_mean_lengths_shorten_the_step(example_inputs, qwen8b):
    launch, inputs = example_inputs
    short = launch_inputs(launch, qwen8b, 8, None, mean_prompt_len=512.0, mean_response_len=1500.0)
    assert short.spec.lengths == SequenceLengths.from_mean_max((512.0, 1024), (1500.0, 4096))
    assert not any("assumed" in n for n in short.notes)
    assert (
        evaluate_step(short.spec, short.choice, H100, short.options).total_s
        < evaluate_step(inputs.spec, inputs.choice, H100, inputs.options).total_s
    )


def test_launch_lengths_name_the_assumed_mean_and_reject_a_mean_above_the_max(example_inputs):
    launch, _ = example_inputs
    lengths, note = launch_lengths(launch, None, 2500.0)
    assert (lengths.prompt.mean_tokens, lengths.response.mean_tokens) == (1024.0, 2500.0)
    assert "mean prompt length assumed = the maximum" in note and "--mean-prompt-len" in note
    assert "response" not in note.split("tokens")[0]
    with pytest.raises(ConfigError, match="^mean_response_len: .*above max 4096.*data.max_response_length"):
        launch_lengths(launch, None, 5000.0)


def test_dynamic_passes_are_packed_workloads_of_the_lengths(example_inputs):
    """With dynamic batching a pass is one Workload of the step's lengths, packed into max_token_len = the
    per-GPU budget x CP (time and memory from the same packing); fixed micro-batches have no lengths."""
    _, inputs = example_inputs
    s = inputs.spec
    lengths = SequenceLengths.from_mean_max((512.0, 1024), (1500.0, 4096))
    p = ParallelConfig(8, tp=2, cp=2, sequence_parallel=True)
    dyn = Batching(max_token_len_per_gpu=5120, key="k")
    w = pass_workload(dyn, p, lengths, s.sequences, "forward", RecomputeConfig("full"), False)
    assert w.lengths is lengths and w.max_token_len == 10240 and w.seq_length == 5120
    assert w.recompute == RecomputeConfig()  # a forward pass keeps nothing for a backward
    assert pass_workload(dyn, p, lengths, s.sequences, "forward", RecomputeConfig(), True) == w
    with pytest.raises(ConfigError, match="^k: .*below the longest sequence"):
        pass_workload(Batching(max_token_len_per_gpu=2048, key="k"), p, lengths, 64, "train", RecomputeConfig(), True)
    fixed = Batching(micro_batch_size=2, key="m")
    timed = pass_workload(fixed, p, lengths, 64, "train", RecomputeConfig(), False)
    peak = pass_workload(fixed, p, lengths, 64, "train", RecomputeConfig(), True)
    assert timed.lengths is None and (timed.seq_length, peak.seq_length) == (2012, 5120)


def test_a_pass_is_priced_once_per_inputs(example_inputs):
    """pass_cost is memoised: the same inputs give the very same estimates, equal to pricing the pass afresh
    (costmodel.estimate of the pass's Workload), and other inputs another."""
    _, inputs = example_inputs
    s, c = inputs.spec, inputs.choice
    args = (s.model, c.parallel, c.old_log_prob_batching, s.lengths, s.sequences, "forward", RecomputeConfig(), H100,
            inputs.options)  # fmt: skip
    first = pass_cost(*args)
    assert pass_cost(*args) is first
    w = pass_workload(c.old_log_prob_batching, c.parallel, s.lengths, s.sequences, "forward", RecomputeConfig(), False)
    fresh = estimate(s.model, c.parallel, w, H100, inputs.options)
    assert (first[0].step_time_s, first[1].peak_memory_gib) == (fresh.step_time_s, fresh.peak_memory_gib)
    other = pass_cost(*args[:4], s.sequences // 2, *args[5:])
    assert other[0].step_time_s < first[0].step_time_s


def test_search_keeps_one_shared_layout_and_fits_every_phase(example_inputs):
    _, inputs = example_inputs
    ranked = search_step(inputs.spec, inputs.choice, H100, replace(inputs.options, overlap_grad_reduce=True), 3)
    assert ranked and all(r.fits for r in ranked)
    assert [r.total_s for r in ranked] == sorted(r.total_s for r in ranked)
    budgets = token_budget_choices(inputs.spec.lengths.max_tokens)
    for r in ranked:  # actor update, old and ref log-prob are costed on the one layout
        c = r.choice
        assert c.parallel.num_gpus == 8 and not c.parallel.tp_comm_overlap
        # the actor's token budget is the one search.plan chose for the layout, with its reason
        assert c.actor_batching.max_token_len_per_gpu * c.parallel.cp in budgets
        assert any(n.startswith("actor max_token_len ") for n in r.notes)
        # the log-prob passes' own budget comes from the same candidates, one for both passes
        old, ref = c.old_log_prob_batching, c.ref_log_prob_batching
        assert old.max_token_len_per_gpu == ref.max_token_len_per_gpu
        assert old.max_token_len_per_gpu * c.parallel.cp in budgets


# a fresh interpreter (no warm caches) plans the example step as `mat rlhf` does and prints the seconds it took
_TIMED_PLAN = """
import sys, time
from dataclasses import replace
from megatron_autotuner.rlhf import evaluate_step, launch_inputs, read_verl_file, search_step
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
start = time.process_time()
inputs = launch_inputs(read_verl_file(sys.argv[1]), load_model_spec("Qwen3-8B"), 8, None,
                       mean_response_len=float(sys.argv[2]) if sys.argv[2] != "-" else None)
gpu = get_gpu_spec("H100-SXM")
evaluate_step(inputs.spec, inputs.choice, gpu, inputs.options)
ranked = search_step(inputs.spec, inputs.choice, gpu, replace(inputs.options, overlap_grad_reduce=True), 6)
assert ranked
print(time.process_time() - start)
"""


@pytest.mark.parametrize("mean_response_len", ["-", "2500"])
def test_the_qwen3_8b_grpo_example_plans_in_seconds(mean_response_len):
    """Issue #26: the launch's own step plus the search over the top 6 layouts (mat rlhf's default) took 12-15 s,
    and over a minute with a mean response length, before packing was memoised and Karmarkar-Karp made sparse;
    about 2 s each now on a 2-core laptop. The bound is on the CPU seconds of the planning process (what wall
    time is on an idle machine; other processes on a shared one stretch the wall clock, not this): 10 s is
    generous and still catches a return to the old cost."""
    import megatron_autotuner

    env = dict(os.environ, PYTHONPATH=str(Path(megatron_autotuner.__file__).resolve().parents[1]))
    run = subprocess.run(
        [sys.executable, "-c", _TIMED_PLAN, str(EXAMPLE), mean_response_len],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    seconds = float(run.stdout.strip().splitlines()[-1])
    assert seconds < 10.0, f"planning the example step took {seconds:.1f} CPU seconds"


# ---------------------------------------------------------------------------------------------------------------
# CLI


def test_cli_json_and_overrides(tmp_path, capsys):
    assert main(["rlhf", "--verl-args", str(EXAMPLE), "--gpu", "H100-SXM", "--num-gpus", "8", "--top-k", "2",
                 "--json", "--output-dir", str(tmp_path / "out")]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["launch"]["fits"] and report["best"]["fits"]
    assert report["predicted_gain"] == pytest.approx(report["launch"]["total_s"] / report["best"]["total_s"] - 1)
    lines = report["verl_overrides"]
    assert any(x.startswith("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=") for x in lines)
    assert (tmp_path / "out" / "rlhf.json").exists() and (tmp_path / "out" / "verl_overrides.txt").exists()
    # what mat writes reads back with the same reader, to the same layout for actor and ref
    back = read_verl_text("\n".join(x.lstrip("+") for x in lines))
    assert back.layout("actor") == back.layout("ref")
    assert back.layout("actor")["tensor_model_parallel_size"] == report["best"]["parallel"]["tp"]


# a PPO launch whose critic (tp 2, not searched) takes verl's default token budget, 32768 per GPU
_PPO_CRITIC_DEFAULT_BUDGET = """algorithm.adv_estimator=gae
data.train_batch_size=256
data.max_prompt_length=2048
data.max_response_length=6144
actor_rollout_ref.actor.ppo_mini_batch_size=64
actor_rollout_ref.actor.use_dynamic_bsz=true
actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192
actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2
actor_rollout_ref.rollout.gpu_memory_utilization=0.5
critic.use_dynamic_bsz=true
critic.megatron.tensor_model_parallel_size=2
"""


def test_a_step_no_layout_fits_names_each_phase_and_the_verl_key_that_sets_it(tmp_path, capsys):
    """'no layout fits every phase' says, for each phase of the launch that does not fit, the verl key that sets its
    memory, its value and whether the launch gave it or took verl's default (here the critic's token budget, which
    the launch never set), so the user knows what to change; the text's 'does not fit' line names them too."""
    f = tmp_path / "ppo.txt"
    f.write_text(_PPO_CRITIC_DEFAULT_BUDGET)
    args = ["rlhf", "--verl-args", str(f), "--gpu", "H100-SXM", "--model", "Qwen3-8B", "--top-k", "2"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["best"] is None
    # every phase but the weight sync (set by the layout and offload the search varies) has its key
    named = set(PHASE_BATCH_KEYS) | set(PHASE_MEMORY_KEYS) | {"weight sync"}
    assert {ph["name"] for ph in report["launch"]["phases"]} <= named
    (note,) = [n for n in report["launch"]["notes"] if "fit every phase" in n]
    critic = next(ph for ph in report["launch"]["phases"] if ph["name"] == "critic update")
    assert not critic["fits"]
    assert (
        f"critic update {critic['peak_memory_gib']:.0f} GiB (critic.ppo_max_token_len_per_gpu=32768, verl's "
        "default)" in note
    )
    assert (
        "critic values" in note
        and "critic.forward_max_token_len_per_gpu=32768, not set: follows critic.ppo_max_token_len_per_gpu" in note
    )
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192, given" in note
    assert "actor_rollout_ref.rollout.gpu_memory_utilization=0.5, given" in note
    assert main(args) == 0
    assert "critic.ppo_max_token_len_per_gpu=32768, verl's default" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "text,expect",
    [
        (
            "actor_rollout_ref.actor.use_dynamic_bsz=true\nactor_rollout_ref.actor.ppo_mini_batch_size=3\n",
            "does not divide data.train_batch_size",
        ),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=8\n", "ppo_micro_batch_size_per_gpu: is required"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys, text, expect):
    f = tmp_path / "launch.txt"
    f.write_text(text)
    assert main(["rlhf", "--verl-args", str(f), "--gpu", "H100-SXM", "--model", "Qwen3-8B"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mat: error: ") and "\n" not in err and expect in err


# ---------------------------------------------------------------------------------------------------------------
# verl's own code


@pytest.fixture(scope="module")
def verl_config_dir():
    pytest.importorskip("verl.utils.config", exc_type=ImportError)
    pytest.importorskip("hydra")
    import verl

    return os.path.join(os.path.dirname(verl.__file__), "trainer", "config")


def test_defaults_are_verls(verl_config_dir):
    data = yaml.safe_load(Path(verl_config_dir, "_generated_ppo_megatron_trainer.yaml").read_text())
    for name, default in VERL_DEFAULTS.items():
        node = data
        for key in VERL_KEYS[name].split("."):
            if not isinstance(node, dict) or key not in node:
                node = KeyError
                break
            node = node[key]
        if node is KeyError:
            continue  # grad_offload (b178a3c only), model_engine (a Hydra group), ...
        if isinstance(default, str) and default.startswith("="):
            assert isinstance(node, str) and "${" in node, name  # verl interpolates it too
        elif name in ("rollout_name", "model_path"):
            continue  # required in verl ('???') or a placeholder path: a launch gives them
        elif default is None and isinstance(node, str):
            assert node.endswith(",null}"), name  # an interpolation of a deprecated key, null by default
        elif name not in ("rollout_name", "model_path"):
            assert node == default, name


def test_mat_rlhf_overrides_pass_verl_validation(verl_config_dir, capsys):
    import hydra
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    assert main(["rlhf", "--verl-args", str(EXAMPLE), "--gpu", "H100-SXM", "--top-k", "2", "--json"]) == 0
    lines = json.loads(capsys.readouterr().out)["verl_overrides"]
    launch = read_verl_file(str(EXAMPLE))
    run = [f"{k}={json.dumps(v) if isinstance(v, list) else v}" for k, v in launch.values.items()
           if k not in ("model_engine",)]  # fmt: skip
    run = [x.replace("=True", "=true").replace("=False", "=false") for x in run]
    with hydra.initialize_config_dir(config_dir=verl_config_dir, version_base=None):
        cfg = hydra.compose("ppo_trainer", overrides=["model_engine=megatron", *run, *lines])
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    for key in MCORE_LAYOUT_KEYS:
        assert cfg.actor_rollout_ref.ref.megatron[key] == getattr(actor.megatron, key), key
    assert actor.megatron.param_offload is True


def test_verl_builds_mtp_layers_only_when_the_launch_enables_them():
    """verl 0.9.1 zeroes num_nextn_predict_layers unless actor_rollout_ref.model.mtp.enable=true (HFModelConfig,
    check_mtp_config): DeepSeek-V3's MTP layer is left out of a launch that does not enable it, with a note."""
    path = "actor_rollout_ref.model.path=deepseek-ai/DeepSeek-V3\n"
    model, note = model_from_launch(read_verl_text(path), None)
    assert model.mtp_num_layers == 0 and "MTP layer(s) left out" in note
    enabled = read_verl_text(
        path + "actor_rollout_ref.model.mtp.enable=true\nactor_rollout_ref.model.mtp.enable_train=true\n"
    )
    model, note = model_from_launch(enabled, None)
    assert model.mtp_num_layers == 1 and "MTP" not in (note or "")
    held = read_verl_text(path + "actor_rollout_ref.model.mtp.enable=true\n")
    assert "not trained" in model_from_launch(held, None)[1]
    with pytest.raises(ConfigError, match="has no MTP layers"):
        model_from_launch(
            read_verl_text("actor_rollout_ref.model.path=Qwen/Qwen3-8B\nactor_rollout_ref.model.mtp.enable=true\n"),
            None,
        )


def test_fp8_actor_passes_are_priced_in_fp8():
    """verl's actor override_transformer_config fp8 / fp8_recipe (verl-recipe's DAPO fp8 launch: e4m3, blockwise)
    price the actor update and the log-prob passes with fp8 GEMMs; fp8 parameters and unmodelled recipes are
    refused."""
    from megatron_autotuner.rlhf.step import evaluate_step
    from megatron_autotuner.specs import get_gpu_spec

    otc = "+actor_rollout_ref.actor.megatron.override_transformer_config"
    base = (
        "actor_rollout_ref.model.path=Qwen/Qwen3-8B\ntrainer.n_gpus_per_node=8\n"
        "actor_rollout_ref.actor.use_dynamic_bsz=true\nactor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true\n"
    )
    fp8 = read_verl_text(base + f'{otc}.fp8="e4m3"\n{otc}.fp8_recipe="blockwise"\n')
    assert fp8.actor_numerics() == ("fp8", "blockwise")
    gpu = get_gpu_spec("H100-SXM")
    steps = {}
    for name, launch in (("fp8", fp8), ("bf16", read_verl_text(base))):
        model, _ = model_from_launch(launch, None)
        inputs = launch_inputs(launch, model, 8, None)
        assert inputs.spec.actor_numerics[0] == name
        steps[name] = {
            ph.name: ph.time_s for ph in evaluate_step(inputs.spec, inputs.choice, gpu, inputs.options).phases
        }
    assert steps["fp8"]["actor update"] < steps["bf16"]["actor update"]
    assert steps["fp8"]["old log-prob"] < steps["bf16"]["old log-prob"]
    with pytest.raises(ConfigError, match="fp8_recipe: 'mxfp8' is not modelled"):
        read_verl_text(base + f"{otc}.fp8=e4m3\n{otc}.fp8_recipe=mxfp8\n")
    with pytest.raises(ConfigError, match="fp8 parameters are not modelled"):
        read_verl_text(base + f"{otc}.fp8=e4m3\n{otc}.fp8_param=true\n")


def test_rlhf_says_what_its_steps_assume_beyond_the_layout(capsys):
    """The launch's step and the overrides' step are priced with different run settings (the overrides turn
    grad-reduce overlap on; verl runs no TE userbuffers): both in the JSON and printed, as `mat plan` does."""
    assert main(["rlhf", "--verl-args", str(EXAMPLE), "--gpu", "H100-SXM", "--json", "--top-k", "1"]) == 0
    settings = json.loads(capsys.readouterr().out)["run_settings"]
    assert settings["launch"]["overlap_grad_reduce"] is False and settings["overrides"]["overlap_grad_reduce"] is True
    assert not settings["launch"]["tp_comm_overlap"] and not settings["overrides"]["tp_comm_overlap"]
    assert main(["rlhf", "--verl-args", str(EXAMPLE), "--gpu", "H100-SXM", "--top-k", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "run settings assumed for the launch: " in out and "run settings assumed for the overrides: " in out
