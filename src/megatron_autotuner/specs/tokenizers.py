"""The model a path names, and the vocabulary a tokenizer gives, for launches that leave them to files.

Megatron-LM reads the vocabulary from the tokenizer (`--tokenizer-model` / `--tokenizer-type`) and verl the whole
model from a local folder (`actor_rollout_ref.model.path=/data/models/Qwen/Qwen2.5-3B-Instruct`). Neither file is
here, so the tool reads the names: a shipped preset named by the path's last parts, else a tokenizer family's
vocabulary from the table below (each the `vocab_size` of the family's HF config.json).
"""

from __future__ import annotations

import re

from .loader import preset_names

# (pattern on the lower-cased name, vocabulary size, family): first match wins
TOKENIZER_VOCAB: tuple[tuple[str, int, str], ...] = (
    (r"gpt2|gpt-2", 50257, "GPT-2 BPE"),  # openai-community/gpt2 config.json
    (r"llama-?3|llama3|meta-llama-3", 128256, "Llama 3"),  # meta-llama/Llama-3.1-8B config.json
    (r"llama-?2|llama2", 32000, "Llama 2"),  # meta-llama/Llama-2-7b-hf config.json
    (r"mixtral|mistral-7b", 32000, "Mistral / Mixtral"),  # mistralai/Mixtral-8x7B-v0.1 config.json
    (r"qwen", 151936, "Qwen2 / Qwen2.5 / Qwen3"),  # Qwen/Qwen3-8B config.json (Qwen2.5-7B: 152064)
    (r"deepseek-?v3|deepseek-?r1", 129280, "DeepSeek-V3"),  # deepseek-ai/DeepSeek-V3 config.json
    (r"deepseek-?v2", 102400, "DeepSeek-V2"),  # deepseek-ai/DeepSeek-V2-Lite config.json
    (r"moonlight|kimi", 163840, "Moonlight / Kimi-K2"),  # moonshotai/Moonlight-16B-A3B config.json
    (r"glm-?4", 151552, "GLM-4"),  # zai-org/GLM-4.5 config.json
    (r"gpt-?oss", 201088, "gpt-oss"),  # openai/gpt-oss-20b config.json
    (r"gemma", 256000, "Gemma"),  # google/gemma-7b config.json
    (r"nemotron", 256000, "Nemotron"),  # nvidia/Nemotron-4-340B-Base config
)
# when nothing names the tokenizer: the most common vocabulary of current launches (Llama 3's), stated in a note
FALLBACK_VOCAB = 128256


# name parts that mark a fine-tune of the same architecture (Qwen2.5-Math-7B is Qwen2.5-7B's shape)
VARIANT_WORDS = ("math", "coder", "instruct", "chat", "base", "it", "distill")


# short names launches use for a preset's model (verl's DeepSeek-V3 recipes: `<path_to_dsv3_config>`)
ALIASES = {"dsv3": "DeepSeek-V3", "ds-v3": "DeepSeek-V3", "deepseekv3": "DeepSeek-V3"}


def preset_named_by(path: str) -> str | None:
    """The shipped preset a path's last parts name (`/data/models/Qwen/Qwen3-8B-Instruct` -> Qwen3-8B): the
    longest preset name that a last part starts with, case-insensitively, also with a fine-tune's variant words
    (`VARIANT_WORDS`) left out; None when none does."""
    parts = [p for p in re.split(r"[/\\]", path.strip().rstrip("/")) if p][-2:]
    parts += ["-".join(w for w in p.split("-") if w.lower() not in VARIANT_WORDS) for p in parts]
    for alias, name in ALIASES.items():
        if any(re.search(rf"(^|[^a-z0-9]){re.escape(alias)}([^a-z0-9]|$)", p.lower()) for p in parts):
            return name
    best = None
    for name in preset_names():
        low = name.lower()
        for part in reversed(parts):
            p = part.lower()
            if (p == low or p.startswith(low + "-") or p.startswith(low + "_")) and (
                best is None or len(name) > len(best)
            ):
                best = name
    return best


def tokenizer_vocab(names: list[str]) -> tuple[int, str] | None:
    """(vocabulary size, what it was read from) for the first of `names` (tokenizer type, tokenizer model path)
    that a preset or a family names; None when none does."""
    from .loader import load_model_spec

    for name in names:
        if not name:
            continue
        preset = preset_named_by(name)
        if preset:
            return load_model_spec(preset).vocab_size, f"the {preset} preset, which {name!r} names"
        low = name.lower()
        for pattern, vocab, family in TOKENIZER_VOCAB:
            if re.search(pattern, low):
                return vocab, f"the {family} tokenizer family, which {name!r} names"
    return None
