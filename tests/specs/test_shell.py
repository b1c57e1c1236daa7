"""The static bash reader (`specs.shell`): each construct launch scripts use, read as bash runs it, without running
anything; what it cannot know is assumed and noted."""

from __future__ import annotations

import time

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.launch_script import read_launch_text
from megatron_autotuner.specs.shell import MAX_STEPS, read_shell


def words(text: str, **kw) -> list[tuple[str, ...]]:
    return [c.words for c in read_shell(text, **kw).commands]


def test_nested_defaults_and_assignment_forms():
    r = read_shell("A=${X:-${Y:-3}}\nB=${Z:=7}\nC=${B:+set}\nD=${U-}\nE=${A}0\n: ${F:=9}\nG=${NOPE:?must}\n")
    expected = {"A": "3", "B": "7", "Z": "7", "C": "set", "D": "", "E": "30", "F": "9", "G": ""}
    assert {k: r.variables[k] for k in expected} == expected
    assert any("NOPE is not set (bash would stop here)" in n for n in r.notes)
    assert read_shell("A=${X:-${Y:-3}}", env={"Y": "5"}).variables["A"] == "5"


def test_arrays_built_with_plus_equals_and_expanded_per_item():
    r = read_shell(
        'ARGS=(\n  --num-layers 2   # a comment\n  "--name" "a b"\n)\nARGS+=(--seq-length 8)\n'
        'if true; then ARGS+=("--x y"); fi\nA2[3]=z\nrun.py "${ARGS[@]}" ${#ARGS[@]} "${ARGS[*]}"\n'
    )
    assert r.arrays["A2"] == ("", "", "", "z")
    (cmd,) = r.commands
    assert cmd.words[:8] == ("run.py", "--num-layers", "2", "--name", "a b", "--seq-length", "8", "--x y")
    assert cmd.words[8] == "7" and cmd.words[9] == "--num-layers 2 --name a b --seq-length 8 --x y"


def test_arithmetic_with_variables_ternary_and_bash_division():
    r = read_shell("G=8\nN=${N:-2}\nW=$((G*N))\nH=$(( (W > 10) ? W / 3 : 0 ))\nM=$(( -7 / 2 ))\n((K = W - 1))\n")
    assert (r.variables["W"], r.variables["H"], r.variables["M"], r.variables["K"]) == ("16", "5", "-3", "15")
    bad = read_shell("X=$(( 1 / 0 ))\nY=$(( 2 ** 99999 ))\n")
    assert bad.variables["X"] == bad.variables["Y"] == "0" and len(bad.notes) == 2


def test_if_elif_case_take_the_branch_the_defaults_select():
    text = (
        'PREC=${PREC:-fp8}\nif [ "$PREC" == "bf16" ]; then P=--bf16\nelif [[ $PREC = fp* && -n $PREC ]]; then '
        "P=--fp8\nelse P=none; fi\ncase $PREC in\n  bf16) Q=1 ;;\n  fp8|fp16) Q=2 ;;\n  *) Q=3 ;;\nesac\n"
        '[ -z "$UNSET" ] && R=empty || R=full\n'
    )
    r = read_shell(text)
    assert (r.variables["P"], r.variables["Q"], r.variables["R"]) == ("--fp8", "2", "empty")
    assert read_shell(text, env={"PREC": "bf16"}).variables["P"] == "--bf16"


def test_unknown_values_pick_the_first_branch_with_a_note():
    """A value only the user knows ($2, never set here): the first listed choice, said in a note; a usage-error
    `else` / `*)` branch is not a choice."""
    text = (
        "SIZE=$2\nif [ $SIZE = 7B ]; then L=32; elif [ $SIZE = 13B ]; then L=40; fi\n"
        'case $3 in a) M=1;; b) M=2;; *) echo "usage"; exit 1;; esac\n'
    )
    r = read_shell(text)
    assert (r.variables["L"], r.variables["M"]) == ("32", "1")
    assert any("read the first" in n for n in r.notes)


def test_srun_sh_c_with_a_command_string_and_launcher_gpu_count():
    text = (
        "GPUS_PER_NODE=8\nNNODES=${NNODES:-2}\nMODEL=(--num-layers 4 --hidden-size 64)\n"
        'cmd="torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py ${MODEL[@]} $@"\n'
        'srun -N $NNODES bash -c "$cmd" 2>&1 | tee log.txt\n'
    )
    command = read_launch_text(text, lambda flag: flag.startswith("--num") or flag == "--hidden-size")
    assert command.script == "pretrain_gpt.py" and command.num_gpus == 16
    assert command.tokens == ("--num-layers", "4", "--hidden-size", "64")


def test_fragment_gives_the_flags_its_arrays_and_strings_hold():
    text = 'MODEL_ARGS=(--num-layers 4)\nEXTRA="--hidden-size 64 --ffn-hidden-size 256"\n'
    command = read_launch_text(text, lambda flag: flag.startswith("--"))
    assert command.script is None and command.tokens == (
        "--num-layers",
        "4",
        "--hidden-size",
        "64",
        "--ffn-hidden-size",
        "256",
    )
    assert any("no training command" in n for n in command.notes)


def test_source_next_to_the_script_functions_loops_and_printf(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.sh").write_text("L=${L:-6}\nlayers() { echo $(( $1 * 2 )); }\n")
    script = tmp_path / "run.sh"
    script.write_text(
        'DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" &>/dev/null && pwd)"\nsource "${DIR}/models/m.sh"\n'
        "N=$(layers $L)\narr=()\nfor ((i=0; i<4; i++)); do if (( i < 1 )); then arr+=(0); else arr+=(1); fi; done\n"
        'printf -v FREQ "[%s]" "$(IFS=,; echo "${arr[*]}")"\nfor x in a b c; do S+=$x; done\n'
        'cat <<EOF > cfg.json\n{ "not": "a command" }\nEOF\nsource missing.sh\n'
    )
    r = read_shell(script.read_text(), script=script)
    assert r.variables["DIR"] == str(tmp_path) and r.variables["N"] == "12"
    assert r.variables["FREQ"] == "[0,1,1,1]" and r.variables["S"] == "abc"
    assert [c.words[0] for c in r.commands] == ["cat"]
    assert any("source missing.sh: not found" in n for n in r.notes)


def test_positional_parameters_are_empty_and_substitutions_unknown():
    r = read_shell('A=$1\nB="$@"\nC=$(python -c "print(8)")\nD=$(basename /x/y.sh .sh)\nE=$#\n', script="/s/run.sh")
    assert (r.variables["A"], r.variables["B"], r.variables["C"], r.variables["D"], r.variables["E"]) == (
        "", "", "", "y", "0",
    )  # fmt: skip
    assert any('$(python -c "print(8)")' in n for n in r.notes)


def test_odd_endings_and_redirections():
    assert words("run.py --a 1 \\") == [("run.py", "--a", "1", "\\")]
    assert words("run.py --a 1 >log 2>&1 </dev/null &") == [("run.py", "--a", "1")]
    # a prefix assignment is for the command; its own words expand before it (bash): $Y is unset there
    assert words("X=1; Y=2 run.py --y $Y --x $X\n") == [("run.py", "--y", "--x", "1")]


def test_bounded_on_hostile_input():
    start = time.process_time()  # CPU time: the tests run two at a time
    looping = read_shell("while true; do for x in 1 2 3 4 5 6 7 8 9 10; do : ; done; done")
    assert any("stopped after" in n for n in looping.notes)
    with pytest.raises(ConfigError):
        read_shell("f() { f; }\nf\n")
    with pytest.raises(ConfigError, match="grows past"):
        read_shell('A=x\nfor i in $(seq 1 10); do :; done\nwhile true; do A="$A$A"; done')
    assert time.process_time() - start < 10 and MAX_STEPS >= 100_000


@pytest.mark.parametrize(
    "text",
    ["A='unterminated", "if true; then X=1", "case $x in a) ;;", "echo $(("],
)
def test_unreadable_scripts_are_one_line_errors(text):
    with pytest.raises(ConfigError) as info:
        read_shell(text)
    assert "\n" not in str(info.value)
