"""The training command of a launch script: which of the commands `shell.read_shell` found runs training, its
flags, environment and GPU count.

The training command is the one that runs a `*.py` script (also inside `sh -c` / `bash -c`, `srun`, `mpirun`,
`torchrun`, `deepspeed`, `python -m torch.distributed.run`) with the most flags that `is_flag` knows; a fragment
that runs nothing (a model's flags kept in arrays or strings, as slime and Megatron-LM's model configs keep them)
gives the union of the flags its arrays and strings hold, in the order they were set.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from .shell import ShellCommand, ShellReading, read_shell

SHELLS = ("bash", "sh", "zsh", "dash")
# launcher options that give the GPU count: (processes per node, nodes), per launcher
PER_NODE = ("nproc-per-node", "nproc_per_node", "num-gpus", "num_gpus", "ntasks-per-node", "gpus-per-node")
NODES = ("nnodes", "num-nodes", "num_nodes", "nodes", "N")


@dataclass(frozen=True)
class TrainingCommand:
    """The flags after the training script, the environment it runs with, the GPU count its launcher gives (None
    when it gives none), the script run (None for a fragment), and what the reader had to assume."""

    tokens: tuple[str, ...]
    env: dict[str, str]
    num_gpus: int | None
    script: str | None
    notes: tuple[str, ...]


def inner_commands(command: ShellCommand, reading: ShellReading) -> list[tuple[list[str], ShellCommand]]:
    """(launcher prefix words, command) pairs: the command itself, and for `... bash -c "STRING"` the commands
    of STRING, read with the script's variables, behind the words before the shell."""
    words = list(command.words)
    for k, word in enumerate(words[:-2]):
        if word.rsplit("/", 1)[-1] in SHELLS and "-c" in words[k + 1 : k + 3]:
            string = words[words.index("-c", k + 1) + 1]
            inner = read_shell(string, env={**reading.variables, **dict(command.assignments)})
            return [(words[:k], c) for c in inner.commands]
    return [([], command)]


def _gpu_count(prefix: list[str]) -> int | None:
    """Processes per node x nodes from the launcher words before the script, when both are numbers (nodes 1
    when only the per-node count is given)."""
    values: dict[str, str] = {}
    for i, tok in enumerate(prefix):
        if not tok.startswith("-"):
            continue
        name, eq, inline = tok.lstrip("-").partition("=")
        if name in PER_NODE + NODES:
            values.setdefault(name, inline if eq else (prefix[i + 1] if i + 1 < len(prefix) else ""))
    per_node = next((values[k] for k in PER_NODE if k in values), None)
    nodes = next((values[k] for k in NODES if k in values), "1")
    try:
        return int(per_node) * int(nodes) if per_node is not None else None
    except ValueError:
        return None


def training_command(reading: ShellReading, is_flag: Callable[[str], bool]) -> TrainingCommand:
    """The training command of a read script (see the module's docstring)."""
    best: tuple[int, int] | None = None
    chosen: TrainingCommand | None = None
    exported = {k: v for k, v in reading.variables.items() if k in reading.exported}
    for order, command in enumerate(reading.commands):
        for prefix, inner in inner_commands(command, reading):
            words = prefix + list(inner.words)
            scripts = [i for i, w in enumerate(words) if w.endswith(".py")]
            if not scripts:
                continue
            tokens = words[scripts[0] + 1 :]
            score = (sum(1 for t in tokens if is_flag(t.split("=", 1)[0])), order)
            if best is None or score > best:
                best = score
                env = {**exported, **dict(command.assignments), **dict(inner.assignments)}
                chosen = TrainingCommand(
                    tuple(tokens), env, _gpu_count(words[: scripts[0]]), words[scripts[0]], reading.notes
                )
    if chosen is not None and best is not None and best[0] > 0:
        return chosen
    return _fragment(reading, is_flag, exported)


def _fragment(reading: ShellReading, is_flag: Callable[[str], bool], env: dict[str, str]) -> TrainingCommand:
    """The flags a script's arrays and string variables hold, when it runs no training command."""
    tokens: list[str] = []
    for items in reading.arrays.values():
        if any(is_flag(t.split("=", 1)[0]) for t in items):
            tokens += items
    for value in reading.variables.values():
        words = value.split()
        if any(is_flag(w.split("=", 1)[0]) for w in words):
            tokens += words
    bare = [w for c in reading.commands for w in c.words if c.words and c.words[0].startswith("--")]
    tokens += bare
    note = "no training command (*.py) found: read the flags its arrays and strings hold"
    return TrainingCommand(tuple(tokens), env, None, None, (*reading.notes, note) if tokens else reading.notes)


def functional_test_case(text: str, variables: dict[str, str] | None = None) -> TrainingCommand | None:
    """Megatron-LM's functional-test case (tests/functional_tests/test_cases/**/model_config.yaml): its
    `MODEL_ARGS` mapping (`--flag: value`, `true` for a switch given, `false` for one left out) and `ENV_VARS`,
    `${VAR}` read as the shell reads them; None when the text is not such a file."""
    import yaml

    from ..files import YamlLimitError, load_yaml_bounded

    try:
        data = load_yaml_bounded(text)
    except (yaml.YAMLError, YamlLimitError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("MODEL_ARGS"), dict):
        return None
    env = {str(k): str(v) for k, v in (data.get("ENV_VARS") or {}).items()}
    reading = read_shell(
        "\n".join(f"V{k}={shlex.quote(str(v))}" for k, v in enumerate(data["MODEL_ARGS"].values())),
        env={**env, **(variables or {})},
    )
    tokens: list[str] = []
    for k, (flag, value) in enumerate(data["MODEL_ARGS"].items()):
        if value is True:
            tokens.append(str(flag))
        elif value is not False and value is not None:
            tokens += [str(flag), _expanded(reading, k, str(value))]
    return TrainingCommand(tuple(tokens), env, None, None, reading.notes)


def _expanded(reading: ShellReading, k: int, raw: str) -> str:
    return reading.variables.get(f"V{k}", raw)


def read_launch_text(
    text: str, is_flag: Callable[[str], bool], variables: dict[str, str] | None = None, script: str | None = None
) -> TrainingCommand:
    """A launch given as text: a bash script, a `torchrun ... pretrain_gpt.py` command, bare flags, or a
    Megatron-LM functional-test case (yaml)."""
    if "MODEL_ARGS:" in text:
        case = functional_test_case(text, variables)
        if case is not None:
            return case
    reading = read_shell(text, env=variables, script=script)
    return training_command(reading, is_flag)


def parse_var(text: str) -> tuple[str, str]:
    """`NAME=VALUE` of `--var`."""
    name, eq, value = text.partition("=")
    if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    return name, value
