"""Read a verl launch: the `key=value` Hydra overrides of `python -m verl.trainer.main_ppo ...` (a file of lines, a
whole command with backslashes and quotes, or stdin), or a yaml mapping of the same keys.

Key names come from `export.verl.VERL_KEYS` / `MCORE_LAYOUT_KEYS`, the table the verl exporter writes with, so
a launch `mat rlhf` writes reads back to the same values. Defaults are verl 0.9.1's
(`verl/trainer/config/_generated_ppo_megatron_trainer.yaml`), with its interpolations (`ref.*` and
`rollout.log_prob_*` follow the actor's, `critic.*` batches follow the actor's).

What is refused (ConfigError, one line): a shell variable (`$VAR`, `${VAR}`: mat runs no shell), `--config-name`
/ `--config-path` (the composed file is not read), an unknown key in a part of the config that decides speed or
memory (any `*.megatron.*` key, batch / token-length / offload / parallel-size keys), with the nearest known key.
Other keys (paths, learning rates, loggers, reward settings) do not change the step's time or memory and are
accepted silently.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..export.verl import MCORE_LAYOUT_KEYS, VERL_KEYS
from ..files import CONFIG_LIMIT_BYTES, YamlLimitError, load_yaml_bounded, read_stdin_bounded, read_text_bounded

FIELD = "verl_args"

# verl 0.9.1 defaults (verl/trainer/config/_generated_ppo_megatron_trainer.yaml), by VERL_KEYS name. A value
# "=name" is verl's interpolation of another key (oc.select), resolved by `VerlLaunch.get`.
VERL_DEFAULTS: dict[str, Any] = {
    "train_batch_size": 1024,
    "max_prompt_length": 512,
    "max_response_length": 512,
    "rollout_n": 1,
    "actor_mini_batch": 256,
    "actor_epochs": 1,
    "actor_dynamic_bsz": False,
    "actor_max_token_len": 16384,
    "actor_micro_batch": None,
    "rollout_log_prob_dynamic_bsz": "=actor_dynamic_bsz",
    "rollout_log_prob_max_token_len": "=actor_max_token_len",
    "rollout_log_prob_micro_batch": None,
    "ref_log_prob_dynamic_bsz": "=actor_dynamic_bsz",
    "ref_log_prob_max_token_len": "=actor_max_token_len",
    "ref_log_prob_micro_batch": None,
    "actor_param_offload": False,
    "actor_optimizer_offload": False,
    "actor_grad_offload": False,
    "ref_param_offload": "=actor_param_offload",
    "critic_param_offload": False,
    "critic_optimizer_offload": False,
    "actor_distributed_optimizer": True,
    "actor_dtype": "bfloat16",
    "critic_enable": None,
    "critic_mini_batch": "=actor_mini_batch",
    "critic_epochs": "=actor_epochs",
    "critic_dynamic_bsz": "=actor_dynamic_bsz",
    "critic_max_token_len": 32768,
    "critic_forward_max_token_len": "=critic_max_token_len",
    "critic_micro_batch": None,
    "critic_forward_micro_batch": "=critic_micro_batch",
    "critic_model_path": "~/models/deepseek-llm-7b-chat",  # a literal in verl, not the actor's path
    "rollout_name": None,
    "rollout_tp": 2,
    "rollout_memory_utilization": 0.5,
    "rollout_free_cache_engine": True,
    "adv_estimator": "gae",
    "use_kl_in_reward": False,
    "use_kl_loss": False,
    "model_path": None,
    "mtp_enable": False,  # MtpConfig (verl/workers/config/model.py)
    "mtp_enable_train": False,
    "n_gpus_per_node": 8,
    "nnodes": 1,
    "model_engine": "megatron",
}
# McoreEngineConfig defaults (verl/trainer/config/engine/megatron.yaml, 0.9.1)
LAYOUT_DEFAULTS: dict[str, Any] = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "context_parallel_size": 1,
    "sequence_parallel": True,
    "expert_model_parallel_size": 1,
    "expert_tensor_parallel_size": None,
}
# keys of verl's override_transformer_config / override_ddp_config the step model reads
TRANSFORMER_READ = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
                    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_token_dispatcher_type",
                    "moe_flex_dispatcher_backend", "moe_enable_deepep")  # fmt: skip
DDP_READ = ("grad_reduce_in_fp32", "overlap_grad_reduce")
# override_transformer_config keys the cost model does not cover: refused rather than silently mispredicted (fp8
# parameters change what the weight sync to the rollout moves)
TRANSFORMER_REFUSED = ("fp8_param",)
# the fp8 GEMMs the cost model prices: megatron-core TransformerConfig fp8 formats and fp8_recipe values
FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("delayed", "tensorwise", "blockwise")

# A key matters to speed or memory when it sits in a megatron engine section, or its last name has one of these.
_MATTERS = (
    "batch",
    "token_len",
    "dynamic_bsz",
    "offload",
    "parallel",
    "prompt_length",
    "response_length",
    "epoch",
    "memory_utilization",
)
# verl keys with one of those words that do not change a training step's time or memory
_NEUTRAL = frozenset(
    {
        "data.val_batch_size",
        "trainer.total_epochs",
        "trainer.total_training_steps",
        "data.dataloader_num_workers",
    }
)
_PASS_THROUGH = ("override_transformer_config", "override_ddp_config", "override_optimizer_config")
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def _known_keys() -> set[str]:
    keys = set(VERL_KEYS.values())
    for role in ("actor_megatron", "ref_megatron", "critic_megatron"):
        keys |= {f"{VERL_KEYS[role]}.{k}" for k in MCORE_LAYOUT_KEYS}
    keys |= {f"{VERL_KEYS['critic_megatron']}.use_distributed_optimizer"}
    return keys


KNOWN_KEYS = frozenset(_known_keys())
_SECTIONS = tuple(VERL_KEYS[r] + "." for r in ("actor_megatron", "ref_megatron", "critic_megatron"))
# McoreEngineConfig fields that do not change the step's time or memory (checkpointing, seeds, model conversion)
_MEGATRON_NEUTRAL = (
    "seed",
    "use_dist_checkpointing",
    "dist_checkpointing_path",
    "dist_checkpointing_prefix",
    "dist_ckpt_optim_fully_reshardable",
    "distrib_optim_fully_reshardable_mem_efficient",
    "use_mbridge",
    "vanilla_mbridge",
    "override_mcore_model_config",
    "dtype",
    "use_remove_padding",
)


def matters(key: str) -> bool:
    """Whether a key can change the step's time or memory (and so must be one `mat rlhf` knows)."""
    if any(key.startswith(s) for s in _SECTIONS):
        rest = key.split(".megatron.", 1)[1]
        return rest.split(".")[0] not in _PASS_THROUGH and rest not in _MEGATRON_NEUTRAL
    if key in _NEUTRAL:
        return False
    leaf = key.rsplit(".", 1)[-1]
    return any(word in leaf for word in _MATTERS)


def _value(text: str) -> Any:
    """A Hydra override value: yaml scalars and lists (true, 8, null, [a,b]); anything else stays text."""
    try:
        return load_yaml_bounded(text) if text != "" else ""
    except (yaml.YAMLError, YamlLimitError):
        return text


def _layout_value(dotted: str, key: str, value: Any) -> Any:
    """A McoreEngineConfig parallel size as given: an integer >= 1 (or null where verl's default is null: vpp, etp);
    sequence_parallel as given. A size of 1e308, .inf or 5,000 digits reached int() in the step model (#39)."""
    if key == "sequence_parallel" or (value is None and LAYOUT_DEFAULTS[key] is None):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(dotted, f"must be an integer >= 1, got {'null' if value is None else repr(value)}")
    return value


def _unknown_key_note(key: str) -> str | None:
    """A note for a key `mat rlhf` does not read although it can change speed or memory (None for the others)."""
    if key in KNOWN_KEYS or not matters(key):
        return None
    known = _KNOWN_UNMODELLED.get(key)
    if known:
        return f"{key}: {known}"
    near = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.6)
    hint = f" (nearest known key: {near[0]})" if near else ""
    return f"{key}: not a verl key mat rlhf reads{hint}; predicted without it"


# keys of verl's Megatron trainer that can change the step, which the cost model does not price: what it assumes
_KNOWN_UNMODELLED = {
    "trainer.balance_batch": "not modelled: sequences are assumed balanced over the data-parallel ranks",
    "actor_rollout_ref.rollout.max_num_batched_tokens": "not modelled: the rollout engine's own batching",
    "actor_rollout_ref.rollout.expert_parallel_size": "not modelled: the rollout engine's layout is its own",
    "actor_rollout_ref.rollout.data_parallel_size": "not modelled: the rollout engine's layout is its own",
    "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_cpu_offload": (
        "not modelled: the optimizer step is priced on the GPU"
    ),
    "actor_rollout_ref.actor.optim.override_optimizer_config.optimizer_offload_fraction": (
        "not modelled: the optimizer step is priced on the GPU"
    ),
}
# the modules and scripts that run verl's trainer
_ENTRY = re.compile(r"(^|[./])(main_ppo|main_dapo|main_grpo|main_[a-z_]*ppo[a-z_]*)(\.py)?$")


def _is_entry(word: str) -> bool:
    return bool(_ENTRY.search(word))


def _override_words(
    text: str, source: str, variables: dict[str, str] | None, script: str | None, args: list[str] | None = None
):
    """(words after verl's entry module, notes): the script read statically (`specs.shell`); a file of bare
    override lines gives its words as they stand."""
    from ..specs.launch_script import inner_commands
    from ..specs.shell import read_shell

    reading = read_shell(text, env=variables, script=script, args=args)
    best: tuple[int, list[str]] | None = None
    for command in reading.commands:
        for prefix, inner in inner_commands(command, reading):
            words = prefix + list(inner.words)
            entries = [i for i, w in enumerate(words) if _is_entry(w)]
            if entries:
                rest = words[entries[0] + 1 :]
                score = sum("=" in w for w in rest)
                if best is None or score >= best[0]:
                    best = (score, rest)
    if best is not None:
        return best[1], list(reading.notes)
    bare = [w for c in reading.commands for w in c.words if "=" in w or w.startswith("--config")]
    return bare, list(reading.notes)


def _joined_config_options(words: list[str]) -> list[str]:
    """`--config-name NAME` (two words) as `--config-name=NAME`."""
    out: list[str] = []
    skip = False
    for k, word in enumerate(words):
        if skip:
            skip = False
        elif word in ("--config-name", "--config-path") and k + 1 < len(words):
            out.append(f"{word}={words[k + 1]}")
            skip = True
        else:
            out.append(word)
    return out


def parse_override_text(
    text: str,
    source: str = FIELD,
    variables: dict[str, str] | None = None,
    script: str | None = None,
    args: list[str] | None = None,
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(dotted key -> value, notes) of a verl launch: a bash script (read statically, `specs.shell`), a whole
    `python -m verl.trainer.main_ppo ...` command, or override lines. Keys that cannot change a step and came out
    empty (a variable not set here: data paths, project names) are dropped silently; a key that can, left empty,
    is dropped with a note (verl's default is used)."""
    words, notes = _override_words(text, source, variables, script, args)
    values: dict[str, Any] = {}
    words = _joined_config_options(words)
    for tok in words:
        if tok.startswith("--config-path"):
            continue  # verl's own config folder (its examples pass --config-path=config)
        if tok.startswith("--config-name"):
            name = (tok.split("=", 1)[1] if "=" in tok else "").removesuffix(".yaml")
            if "megatron" not in name:
                raise ConfigError(
                    "--config-name",
                    f"{name or '(a separate argument)'}: not a Megatron trainer config (mat rlhf reads verl's "
                    "ppo_megatron_trainer and the configs built on it)",
                )
            if name != "ppo_megatron_trainer":
                notes.append(f"--config-name {name}: read with ppo_megatron_trainer's defaults, which it builds on")
            values.setdefault(VERL_KEYS["model_engine"], "megatron")
            continue
        if "=" not in tok:
            continue  # a launcher word between overrides (ray's --, hydra flags)
        key, raw = tok.split("=", 1)
        key = key.lstrip("+~")
        if "@" in key:
            key = key.split("@", 1)[1]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", key):
            continue
        if raw == "" and matters(key):
            notes.append(f"{key}: empty (a variable not set here?), verl's default used")
            continue
        if raw == "":
            continue
        values[key] = _value(raw)
    if not values:
        raise ConfigError(source, "holds no key=value overrides of verl.trainer.main_ppo")
    return values, tuple(dict.fromkeys(notes))


def _flatten(prefix: str, node: Any, out: dict[str, Any]) -> None:
    if isinstance(node, dict) and node:
        for k, v in node.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = node


@dataclass(frozen=True)
class VerlLaunch:
    """A verl launch's overrides (dotted key -> value) with verl's defaults for the rest."""

    values: dict[str, Any]
    source: str = FIELD
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        unknown = tuple(n for n in (_unknown_key_note(k) for k in self.values) if n)
        if unknown:
            object.__setattr__(self, "notes", tuple(dict.fromkeys((*self.notes, *unknown))))
        engine = self.get("model_engine")
        if engine != "megatron":
            raise ConfigError(VERL_KEYS["model_engine"], f"must be megatron for mat rlhf, got {engine!r}")
        otc = self.pass_through("actor_transformer_overrides")
        for key in TRANSFORMER_REFUSED:
            if otc.get(key):
                raise ConfigError(
                    f"{VERL_KEYS['actor_transformer_overrides']}.{key}", "fp8 parameters are not modelled"
                )
        self.actor_numerics()  # refuses fp8 formats and recipes the cost model does not price
        dtype = self.get("actor_dtype")
        if dtype != "bfloat16":
            raise ConfigError(VERL_KEYS["actor_dtype"], f"only bfloat16 is modelled, got {dtype!r}")
        actor, ref = self.layout("actor"), self.layout("ref")
        for key in MCORE_LAYOUT_KEYS:
            if ref[key] != actor[key]:
                raise ConfigError(
                    f"{VERL_KEYS['ref_megatron']}.{key}",
                    f"is {ref[key]!r}, the actor's is {actor[key]!r}: colocated actor and ref share one parallel "
                    "layout (leave the ref's unset: verl interpolates the actor's)",
                )

    def actor_numerics(self) -> tuple[str, str]:
        """(precision, fp8 recipe) of the actor's Megatron passes: fp8 when override_transformer_config.fp8 names a
        format (megatron-core's fp8_recipe default is delayed), else bf16."""
        otc = self.pass_through("actor_transformer_overrides")
        key = VERL_KEYS["actor_transformer_overrides"]
        fp8, recipe = otc.get("fp8"), otc.get("fp8_recipe") or "delayed"
        if not fp8:
            return "bf16", "delayed"
        if fp8 not in FP8_FORMATS:
            raise ConfigError(f"{key}.fp8", f"must be one of {', '.join(FP8_FORMATS)}, got {fp8!r}")
        if recipe not in FP8_RECIPES:
            raise ConfigError(f"{key}.fp8_recipe", f"{recipe!r} is not modelled (modelled: {', '.join(FP8_RECIPES)})")
        return "fp8", recipe

    def get(self, name: str) -> Any:
        """The value of VERL_KEYS[name]: the launch's, else verl's default (interpolations followed)."""
        key = VERL_KEYS[name]
        if key in self.values:
            return self.values[key]
        default = VERL_DEFAULTS[name]
        if isinstance(default, str) and default.startswith("="):
            return self.get(default[1:])
        return default

    def given(self, name: str) -> bool:
        return VERL_KEYS[name] in self.values

    def said(self, name: str) -> str:
        """`key=value` and where the value comes from: `given` by the launch, else `verl's default` or, for a key
        verl interpolates, `not set: follows <the other key>`."""
        key, value = VERL_KEYS[name], self.get(name)
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        if self.given(name):
            return f"{key}={shown}, given"
        default = VERL_DEFAULTS[name]
        if isinstance(default, str) and default.startswith("="):
            return f"{key}={shown}, not set: follows {VERL_KEYS[default[1:]]}"
        return f"{key}={shown}, verl's default"

    def pass_through(self, name: str) -> dict[str, Any]:
        prefix = VERL_KEYS[name] + "."
        return {k[len(prefix) :]: v for k, v in self.values.items() if k.startswith(prefix)}

    def layout(self, role: str) -> dict[str, Any]:
        """McoreEngineConfig parallel sizes of `role` (actor / ref / critic). ref's default to the actor's
        (ref/megatron_ref.yaml interpolates them); critic's to McoreEngineConfig's defaults."""
        out = {}
        for key in MCORE_LAYOUT_KEYS:
            dotted = f"{VERL_KEYS[role + '_megatron']}.{key}"
            if dotted in self.values:
                out[key] = _layout_value(dotted, key, self.values[dotted])
            elif role == "ref":
                out[key] = self.layout("actor")[key]
            else:
                out[key] = LAYOUT_DEFAULTS[key]
        return out

    def integer(self, name: str, minimum: int = 1) -> int | None:
        """An integer key; None only where verl's own default is None (null for a key verl gives a number is an
        error, as verl's config checks find it)."""
        value = self.get(name)
        if value is None and VERL_DEFAULTS[name] is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            shown = "null" if value is None else repr(value)
            raise ConfigError(VERL_KEYS[name], f"must be an integer >= {minimum}, got {shown}")
        return value

    def number(self, name: str) -> float:
        """A real-valued key (an int is read as a float)."""
        value = self.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(VERL_KEYS[name], f"must be a number, got {'null' if value is None else repr(value)}")
        return float(value)

    def flag(self, name: str) -> bool:
        value = self.get(name)
        if not isinstance(value, bool):
            raise ConfigError(VERL_KEYS[name], f"must be true or false, got {value!r}")
        return value

    def check_engine(self) -> None:
        """`mat rlhf` predicts verl's Megatron engine: an actor or critic on FSDP (verl's `strategy` key) is another
        program, refused rather than predicted as Megatron."""
        for role in ("actor_rollout_ref.actor", "critic"):
            strategy = self.values.get(f"{role}.strategy")
            if strategy is not None and strategy != "megatron":
                raise ConfigError(
                    f"{role}.strategy",
                    f"is {strategy!r}: mat rlhf models verl's Megatron engine only (strategy=megatron)",
                )

    @property
    def use_reference(self) -> bool:
        """verl/trainer/ppo/utils.py need_reference_policy: a KL loss or a KL penalty in the reward."""
        return bool(self.get("use_kl_loss")) or bool(self.get("use_kl_in_reward"))

    @property
    def use_critic(self) -> bool:
        """verl/trainer/ppo/utils.py need_critic: critic.enable when set, else adv_estimator == gae."""
        enable = self.get("critic_enable")
        if enable is not None:
            return bool(enable)
        return self.get("adv_estimator") == "gae"

    @property
    def num_gpus(self) -> int:
        return int(self.integer("n_gpus_per_node")) * int(self.integer("nnodes"))


def read_verl_text(
    text: str,
    source: str = FIELD,
    variables: dict[str, str] | None = None,
    script: str | None = None,
    args: list[str] | None = None,
) -> VerlLaunch:
    """A launch from text: a yaml mapping (nested or dotted keys), else override lines / a command."""
    stripped = text.lstrip()
    data = None
    if stripped and not stripped.startswith(("python", "torchrun", "PYTHON")) and "=" not in stripped.split("\n")[0]:
        try:
            data = load_yaml_bounded(text)
        except YamlLimitError as exc:
            raise ConfigError("verl_args", f"the yaml {exc}") from None
        except yaml.YAMLError:
            data = None
    if isinstance(data, dict):
        data.pop("defaults", None)
        data.pop("hydra", None)
        values: dict[str, Any] = {}
        _flatten("", data, values)
        for key, value in values.items():
            if isinstance(value, str) and _VAR.search(value) and not value.startswith("${oc."):
                raise ConfigError(key, f"uses the shell variable ${_VAR.search(value).group(1)}: write the value")
        return VerlLaunch(values, source)
    values, notes = parse_override_text(text, source, variables, script, args)
    return VerlLaunch(values, source, notes)


def read_verl_file(path: str, variables: dict[str, str] | None = None, args: list[str] | None = None) -> VerlLaunch:
    """`read_verl_text` of a file (`-`: stdin), with one-line errors for unreadable or oversized input; a
    script's `source`d helpers are read next to it; `args`: the script's arguments (`$@`: overrides appended)."""
    if path == "-":
        return read_verl_text(read_stdin_bounded(FIELD, CONFIG_LIMIT_BYTES), "<stdin>", variables)
    text = read_text_bounded(path, FIELD, CONFIG_LIMIT_BYTES)
    return read_verl_text(text, str(Path(path)), variables, path, args)


__all__ = [
    "KNOWN_KEYS",
    "VERL_DEFAULTS",
    "VerlLaunch",
    "matters",
    "parse_override_text",
    "read_verl_file",
    "read_verl_text",
]
