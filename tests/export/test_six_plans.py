"""Six plans as `mat plan` makes them (Llama-3.1-8B / 70B / 405B, DeepSeek-V3, Qwen3-30B-A3B, and a packed
forward pass of Qwen3-8B as verl's log-prob passes run it), each exported and read back:

- Megatron-LM: `megatron_lm_args.txt` through bash (`eval "... $(cat file)"`) into the Megatron-LM flag parser and
  the tool's importer: the plan's layout, and for fixed-length plans its workload and step time (a packed pass
  has no Megatron-LM flags for its lengths);
- verl (with verl 0.9.1 installed): the override lines composed with verl's Hydra config, `validate_config`, and
  the actor / ref engine configs the workers build, holding the plan's layout and micro-batching;
- Megatron-Bridge (with Bridge 0.3.1 installed): the yaml through Bridge's override loader and
  `runtime_config_update` (ConfigContainer.validate), holding the plan's layout.

Run with the frameworks as CI does: `.ci/frameworks-venv/bin/python -m pytest -q -s -n 0 tests/export/test_six_plans.py`
prints one row per plan and check."""

from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest

from megatron_autotuner.costmodel.estimate import estimate
from megatron_autotuner.export import export_all
from megatron_autotuner.export.bridge import bridge_overrides
from megatron_autotuner.export.verl import MCORE_LAYOUT_KEYS, verl_override_lines
from megatron_autotuner.rlhf import read_verl_text
from megatron_autotuner.search.plan import plan
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.lengths import SequenceLengths
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch, specs_to_megatron_args

from .test_framework_exports import READ_FINAL, run_bridge_check
from .verl_checks import engine_worker_configs

H100 = get_gpu_spec("H100-SXM")
PACKED = SequenceLengths.from_mean_max((512.0, 1024), (1536.0, 4096))
# name -> (model, GPUs, sequence length, global batch, mode, lengths)
PLANS = {
    "Llama-3.1-8B": ("Llama-3.1-8B", 8, 8192, 128, "train", None),
    "Llama-3.1-70B": ("Llama-3.1-70B", 64, 8192, 128, "train", None),
    "Llama-3.1-405B": ("Llama-3.1-405B", 1024, 8192, 1536, "train", None),
    "DeepSeek-V3": ("DeepSeek-V3", 1024, 4096, 8192, "train", None),
    "Qwen3-30B-A3B": ("Qwen3-30B-A3B", 16, 4096, 256, "train", None),
    "Qwen3-8B packed forward": ("Qwen3-8B", 8, PACKED.max_tokens, 512, "forward", PACKED),
}


@pytest.fixture(scope="module")
def plans():
    """name -> (the best candidate's Estimate, the plan's cost options, the exports)."""
    out = {}
    for name, (model, gpus, seq, gbs, mode, lengths) in PLANS.items():
        result = plan(load_model_spec(model), H100, gpus, seq, gbs, mode=mode, lengths=lengths)
        best = result.best.estimate
        files = export_all(best.model, best.parallel, best.workload, options=result.options)
        out[name] = (best, result.options, files)
    return out


def _row(name: str, check: str, best, held: str) -> None:
    p = best.parallel
    layout = f"tp{p.tp} pp{p.pp} vpp{p.vpp or 1} cp{p.cp} ep{p.ep} etp{p.etp} dp{p.dp}"
    print(f"| {name} | {layout} | {best.step_time_s:.3f} s | {check} | {held} |")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_lm_reads_back_the_plan(plans, name, tmp_path):
    best, options, files = plans[name]
    path = tmp_path / "megatron_lm_args.txt"
    path.write_text(files["megatron_lm_args.txt"])
    argv = subprocess.run(
        ["bash", "-c", 'eval "set -- $(cat "$1")"; printf "%s\\0" "$@"', "_", str(path)],
        capture_output=True, text=True, check=True,
    ).stdout.split("\0")[:-1]  # fmt: skip
    w = best.workload
    imported = launch_to_specs(
        read_launch(shlex.join(argv)),
        num_gpus=best.parallel.num_gpus, mode=w.mode, max_token_len=w.max_token_len,
    )  # fmt: skip
    assert imported.parallel == best.parallel and imported.model.replace(name=best.model.name) == best.model
    if w.lengths is not None:  # Megatron-LM has no flags for variable lengths: the layout is what reads back
        _row(name, "Megatron-LM flags", best, "layout, model")
        return
    assert imported.workload == w
    again = estimate(imported.model, imported.parallel, imported.workload, H100, options)
    assert again.step_time_s == pytest.approx(best.step_time_s, rel=1e-12)
    _row(name, "Megatron-LM flags", best, "layout, model, workload, step time")


@pytest.mark.parametrize("name", list(PLANS))
def test_verl_validates_and_reads_back_the_plan(plans, name, verl_env):
    best, options, _files = plans[name]
    p, w = best.parallel, best.workload
    args = specs_to_megatron_args(best.model, p, w, options)
    lines = verl_override_lines(args, mode=w.mode, max_token_len=w.max_token_len)
    nodes = max(1, p.num_gpus // 8)
    # a GRPO run with a KL loss (the reference model runs) whose batches divide over the plan's data-parallel size
    base = [
        "model_engine=megatron", "algorithm.adv_estimator=grpo", "critic.enable=false",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.rollout.name=vllm",
        f"trainer.n_gpus_per_node={min(8, p.num_gpus)}", f"trainer.nnodes={nodes}",
        f"data.train_batch_size={w.global_batch_size}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={w.global_batch_size}",
    ]  # fmt: skip
    if w.mode == "forward" and w.max_token_len is None:
        base.append("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    compose, validate, to_dataclass = verl_env
    cfg = compose(lines, base=base)
    validate(cfg)
    actor, ref = engine_worker_configs(cfg, to_dataclass)
    read = read_verl_text("\n".join(lines)).layout("ref" if w.mode == "forward" else "actor")
    for key in MCORE_LAYOUT_KEYS:
        value = getattr((ref if w.mode == "forward" else actor).megatron, key)
        assert value == read[key], key
    assert (actor.megatron.tensor_model_parallel_size, actor.megatron.pipeline_model_parallel_size) == (p.tp, p.pp)
    assert (actor.megatron.context_parallel_size, actor.megatron.expert_model_parallel_size) == (p.cp, p.ep)
    assert actor.megatron.virtual_pipeline_model_parallel_size == p.vpp
    if w.max_token_len is not None:
        assert ref.ppo_max_token_len_per_gpu * p.cp == w.max_token_len
    _row(
        name,
        "verl overrides",
        best,
        "validate_config, actor + ref layout" + (", token budget" if w.max_token_len else ""),
    )


@pytest.fixture(scope="module")
def bridge_loaded(plans, tmp_path_factory):
    cases = []
    for name, (best, options, files) in plans.items():
        args = specs_to_megatron_args(best.model, best.parallel, best.workload, options)
        overrides = bridge_overrides(args)
        read = {s: [k for k in v if k != "_target_"] for s, v in overrides.items() if isinstance(v, dict)}
        provider = "deepseek" if best.model.multi_latent_attention else "gpt"
        cases.append({"name": name, "yaml_text": files["bridge_overrides.yaml"], "base": "recipe-common",
                      "provider": provider, "world_size": best.parallel.num_gpus, "read": read,
                      "read_final": READ_FINAL})  # fmt: skip
    return run_bridge_check(cases, tmp_path_factory.mktemp("bridge-six"))


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_bridge_loads_validates_and_keeps_the_plan(plans, name, bridge_loaded):
    best, _options, _files = plans[name]
    result = bridge_loaded[name]
    assert "error" not in result, result.get("error")
    p, final = best.parallel, result["final"]
    assert final["model.tensor_model_parallel_size"] == p.tp
    assert final["model.pipeline_model_parallel_size"] == p.pp
    assert final["model.virtual_pipeline_model_parallel_size"] == p.vpp
    assert final["model.context_parallel_size"] == p.cp
    assert final["model.expert_model_parallel_size"] == p.ep
    assert final["model.sequence_parallel"] == p.sequence_parallel
    assert result["data_parallel_size"] == p.dp
    assert final["train.micro_batch_size"] == best.workload.micro_batch_size
    _row(name, "Megatron-Bridge yaml", best, "loader + runtime_config_update (validate), layout, DP, micro-batch")
