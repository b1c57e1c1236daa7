"""`mat overlap` bad input: one line naming the field, exit code 2, nothing launched."""

import pytest

from megatron_autotuner.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["overlap", "--model", "Qwen3-8B", "--tp-sizes", "6", "--fake"], "tp_sizes: TP sizes must be powers of two"),
        (["overlap", "--model", "Qwen3-8B", "--tp-sizes", "3", "--fake"], "tp_sizes: TP sizes must be powers of two"),
        (
            ["overlap", "--model", "Qwen3-8B", "--min-num-sm", "20", "--max-num-sm", "4", "--fake"],
            "min_num_sm: need 1 <= min_num_sm <= max_num_sm",
        ),
        (["overlap", "analyze"], "directory: mat overlap analyze needs"),
        (["overlap", "analyze", "no/such/run"], "has no collect/ records"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--output-dir", str(tmp_path / "out")] if argv[1] != "analyze" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "jobs").exists()
