"""`mat rlhf`: a colocated verl PPO / GRPO step as phases, the best shared actor / ref layout, verl overrides."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace

from ..argspec.argtypes import (
    margin_fraction,
    non_empty_path,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from ..argspec.common import add_launch_reading_arguments, launch_variables
from ..costmodel import DEFAULT_MEMORY_MARGIN, load_calibration
from ..costmodel.estimate import run_settings
from ..export import megatron_args
from ..export.verl import override_lines, verl_nodes, verl_step_overrides
from ..files import ensure_output_dir, write_text_atomic
from ..rlhf import (
    evaluate_step,
    launch_inputs,
    model_from_launch,
    read_verl_file,
    search_step,
    step_report,
)
from ..rlhf.phases import pass_workload
from ..rlhf.step import StepResult
from .estimate_cmd import run_settings_line
from .layout_args import gpu_from_args
from .output import console, make_table, print_json
from .progress_bar import progress_bar

EXAMPLES = """examples:
  mat rlhf --verl-args examples/verl_grpo_qwen3_8b_h100_8gpu.sh --gpu H100-SXM --num-gpus 8
  mat rlhf --verl-args examples/verl_grpo_qwen3_8b_h100_8gpu.sh --gpu H100-SXM --rollout-s 240 --json
  mat rlhf --verl-args examples/verl_grpo_qwen3_8b_h100_8gpu.sh --gpu H200 --mean-response-len 2500 --top-k 3"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rlhf",
        help="a colocated verl step as phases: time and memory, the best shared layout, verl overrides",
        description="Predict one step of a colocated verl PPO / GRPO run (Megatron engine) from its launch: weight "
        "sync, rollout, old / ref log-prob, critic, actor update, with the CPU offload around them; search the "
        "one parallel layout colocated actor and ref share (and the offload) for the fastest whole step that fits "
        "every phase, and print the verl overrides that run it. No GPU needed.",
        epilog=EXAMPLES,
    )
    p.add_argument(
        "--verl-args",
        metavar="FILE",
        type=non_empty_path,
        required=True,
        help="the verl launch (- for stdin): your launch script as it is (read, never run), a whole "
        "`python3 -m verl.trainer.main_ppo ...` command, key=value override lines, or a yaml of the same keys",
    )
    add_launch_reading_arguments(p, strict=False)
    p.add_argument("--gpu", required=True, help="GPU preset (mat hardware) or a name in --hardware-file")
    p.add_argument(
        "--hardware-file",
        type=non_empty_path,
        help="yaml with extra or overridden GPU definitions, e.g. host_link_gbps (default: the shipped presets only)",
    )
    p.add_argument(
        "--num-gpus",
        type=positive_int,
        help="GPUs of the run (default: the launch's trainer.n_gpus_per_node x trainer.nnodes, verl's 8 x 1)",
    )
    p.add_argument(
        "--model",
        help="preset, HF config.json path or cached HF id (default: the launch's actor_rollout_ref.model.path)",
    )
    p.add_argument(
        "--rollout-s",
        type=non_negative_float,
        help="seconds the rollout engine generates per step (default: not modelled, left out of the total)",
    )
    p.add_argument(
        "--mean-prompt-len",
        type=positive_float,
        help="mean prompt tokens; lengths are drawn around it up to data.max_prompt_length and packed as verl "
        "packs them (default: data.max_prompt_length, every prompt at its longest: an upper bound on time)",
    )
    p.add_argument(
        "--mean-response-len",
        type=positive_float,
        help="mean response tokens, up to data.max_response_length (default: data.max_response_length, every "
        "response at its longest: an upper bound on time)",
    )
    p.add_argument(
        "--image-tokens",
        type=non_negative_int,
        help="a vision-language model's image tokens per prompt, one image each, part of the prompt's length "
        "(default: the whole mean prompt, an upper bound on the vision tower's work)",
    )
    p.add_argument(
        "--calibration",
        type=non_empty_path,
        help="calibration JSON (mat profile --calibration-out); its host-copy table, when it has one, replaces "
        "the GPU's host-link spec peak (default: built-in efficiencies and the spec peak)",
    )
    p.add_argument(
        "--memory-margin",
        type=margin_fraction,
        default=DEFAULT_MEMORY_MARGIN,
        help="fraction of HBM kept free when judging whether a phase fits, in [0, 1)",
    )
    p.add_argument(
        "--top-k",
        type=positive_int,
        default=6,
        help="actor layouts (ranked by search.plan, each with the token budget it chose) whose whole step is evaluated",
    )
    p.add_argument("--output-dir", type=non_empty_path, help="also write rlhf.json and verl_overrides.txt there")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def overrides_for(result: StepResult, options, nodes: tuple[int, int] | None) -> list[str]:
    """verl override lines of a step result: the layout's Megatron-LM arguments through export.verl, and `nodes`
    (trainer.n_gpus_per_node, trainer.nnodes) where the step was planned for other GPUs than the launch's."""
    spec, c = result.spec, result.choice
    w = pass_workload(c.actor_batching, c.parallel, spec.lengths, spec.mini_batch_sequences, "train", c.recompute, True)
    args = megatron_args(spec.model, c.parallel, w, options)
    lp = c.old_log_prob_batching
    # fixed-size micro-batches: each log-prob pass's own size (the search may give them more than the actor's)
    fixed = not (lp.dynamic or w.max_token_len)
    fixed_log_prob = (lp.micro_batch_size, c.ref_log_prob_batching.micro_batch_size) if fixed else None
    tree = verl_step_overrides(
        args,
        max_token_len=w.max_token_len,
        log_prob_max_token_len=(lp.max_token_len_per_gpu * c.parallel.cp) if (lp.dynamic and w.max_token_len) else None,
        log_prob_micro_batch_sizes=fixed_log_prob,
        param_offload=c.param_offload,
        optimizer_offload=c.optimizer_offload,
        ref_param_offload=c.ref_param_offload if spec.use_reference else None,
        nodes=nodes,
    )
    return override_lines(tree)


def unfit_phase(phase, keys: dict[str, str]) -> str:
    """A phase that does not fit, its peak per GPU and the verl key that sets it (`rlhf.launch.phase_keys`)."""
    key = keys.get(phase.name)
    return f"{phase.name} {phase.peak_memory_gib:.0f} GiB" + (f" ({key})" if key else "")


def run(args: argparse.Namespace) -> int:
    gpu = gpu_from_args(args)
    launch = read_verl_file(args.verl_args, launch_variables(args))
    model, model_note = model_from_launch(launch, args.model)
    calibration = load_calibration(args.calibration) if args.calibration else None
    out_dir = ensure_output_dir(args.output_dir) if args.output_dir else None
    inputs = launch_inputs(
        launch, model, args.num_gpus, args.rollout_s, None, calibration, args.memory_margin,
        mean_prompt_len=args.mean_prompt_len, mean_response_len=args.mean_response_len, image_tokens=args.image_tokens,
    )  # fmt: skip
    # planned for other GPUs than the launch runs on (--num-gpus, or a count fitted to its layout): the overrides say so
    num_gpus = inputs.spec.num_gpus
    nodes = verl_nodes(num_gpus, gpu.gpus_per_node) if num_gpus != launch.num_gpus else None
    user = evaluate_step(inputs.spec, inputs.choice, gpu, inputs.options)
    user = replace(user, notes=user.notes + inputs.notes + ((model_note,) if model_note else ()))
    # the overrides mat writes turn grad-reduce overlap on (export.verl writes override_ddp_config)
    search_options = replace(inputs.options, overlap_grad_reduce=True)
    with progress_bar() as progress:
        ranked = search_step(inputs.spec, inputs.choice, gpu, search_options, args.top_k, progress)
    # the launch's phases that do not fit, each with the verl key that sets it (both outputs below name them)
    bad = ", ".join(unfit_phase(ph, inputs.phase_keys) for ph in user.phases if not ph.fits)
    if not ranked and not user.fits:
        user = replace(
            user,
            notes=user.notes
            + (
                f"no layout of {model.name} on {inputs.spec.num_gpus} x {gpu.name} is predicted to fit every phase; "
                f"the launch's own needs per GPU: {bad} (with the lengths assumed above: give the real means)",
            ),
        )
    lines = overrides_for(ranked[0], search_options, nodes) if ranked else None
    report = step_report(user, ranked, lines)
    # what the predictions assume beyond the layout: the launch's as verl runs it, the overrides' with grad-reduce
    # overlap on; verl never runs TE userbuffers (`search_step`)
    report["run_settings"] = {
        "launch": run_settings(model, inputs.options, False),
        "overrides": run_settings(model, search_options, False) if ranked else None,
    }
    if out_dir is not None:
        write_text_atomic(out_dir / "rlhf.json", json.dumps(report, indent=2, default=str) + "\n")
        if lines:
            write_text_atomic(out_dir / "verl_overrides.txt", " \\\n".join(shlex.quote(x) for x in lines) + "\n")
    if args.json:
        print_json(report)
        return 0
    out = console()
    s = inputs.spec
    out.print(
        f"[bold]{model.name}[/bold] verl step on {s.num_gpus} x {gpu.name}: {s.train_batch_size} prompts x "
        f"n={s.rollout_n} = {s.sequences} sequences, "
        f"prompt <= {s.lengths.prompt.max_tokens} / response <= {s.lengths.response.max_tokens} tokens"
    )
    for note in user.notes:
        out.print(f"note: {note}")
    for whose, settings in report["run_settings"].items():
        if settings is not None:
            out.print(f"run settings assumed for the {whose}: {run_settings_line(settings)}")
    shown = [("your launch", user)] + ([("best", ranked[0])] if ranked else [])
    for title, r in shown:
        rows = [[ph.name, ph.time_s if ph.time_s is not None else "-", ph.peak_memory_gib, "yes" if ph.fits else "NO"]
                for ph in r.phases]  # fmt: skip
        rows.append(["total", r.total_s, r.peak_memory_gib, "yes" if r.fits else "NO"])
        out.print(make_table(f"{title}: {r.choice.label()}", ["phase", "seconds", "peak GiB/GPU", "fits"], rows))
    if ranked:
        best = ranked[0]
        if user.fits:
            out.print(f"predicted gain over your launch: {user.total_s / best.total_s - 1:+.1%} per step")
        else:
            out.print(f"your launch does not fit ({bad}); the best layout does")
        out.print("verl overrides (append to python3 -m verl.trainer.main_ppo ...):")
        sys.stdout.write(" \\\n".join(shlex.quote(x) for x in lines) + "\n")  # plain: no wrapping
    return 0
