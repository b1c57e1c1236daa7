"""A colocated verl step as phases (weight sync, rollout, old / ref log-prob, critic, actor update) with the CPU
offload around them: per-phase time and peak memory, the one layout colocated actor and ref share, verl overrides.

    from megatron_autotuner.rlhf import read_verl_file, launch_inputs, evaluate_step, search_step
"""

from .launch import LaunchInputs, launch_inputs, launch_lengths, model_from_launch
from .offload import ModelStateBytes, during_rollout, host_copy_gbps, model_state_bytes
from .phases import Batching, Phase, weight_sync
from .step import StepChoice, StepResult, StepSpec, evaluate_step, search_step, step_report
from .verl_args import VerlLaunch, read_verl_file, read_verl_text

__all__ = [
    "Batching",
    "LaunchInputs",
    "ModelStateBytes",
    "Phase",
    "StepChoice",
    "StepResult",
    "StepSpec",
    "VerlLaunch",
    "during_rollout",
    "evaluate_step",
    "host_copy_gbps",
    "launch_inputs",
    "launch_lengths",
    "model_from_launch",
    "model_state_bytes",
    "read_verl_file",
    "read_verl_text",
    "search_step",
    "step_report",
    "weight_sync",
]
