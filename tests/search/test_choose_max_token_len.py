"""mat plan with variable lengths picks max_token_len per layout: the fastest budget that fits, with the reason."""

import re

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.costmodel.estimate import estimate
from megatron_autotuner.search import plan
from megatron_autotuner.search.space import SearchSpace, token_budget_choices
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.lengths import SequenceLengths

MODEL = load_model_spec("Qwen3-8B")
H100 = get_gpu_spec("H100-SXM")
LENGTHS = SequenceLengths.from_mean_max((1024, 2048), (2048, 6144))
SPACE = SearchSpace(tp=(1, 2), pp=(1, 2), cp=(1, 2), vpp=(1,), uneven_pipelines=False)


@pytest.fixture(scope="module")
def chosen():
    return plan(MODEL, H100, 8, LENGTHS.max_tokens, 128, lengths=LENGTHS, space=SPACE)


def test_budget_is_the_fastest_that_fits_and_the_reason_names_the_next(chosen):
    assert chosen.candidates
    usable = H100.hbm_gib * (1 - chosen.options.memory_margin)
    budgets = token_budget_choices(LENGTHS.max_tokens)
    for c in chosen.top(4):
        budget = c.workload.max_token_len
        assert budget in budgets and f"tok{budget}" in c.label
        assert c.max_token_len_reason.startswith(f"{budget}: ")
        timed = {}
        for b in budgets:
            e = estimate(MODEL, c.parallel, c.workload.replace(max_token_len=b), H100, chosen.options)
            timed[b] = e
        fitting = [b for b in budgets if timed[b].fits]
        assert budget in fitting
        assert all(timed[b].step_time_s >= timed[budget].step_time_s for b in fitting)
        larger = [b for b in budgets if b > budget]
        if "largest budget that fits" in c.max_token_len_reason and larger:
            nxt = larger[0]
            assert not timed[nxt].fits
            m = re.search(rf"; {nxt} needs ([0-9.]+) GiB > ([0-9.]+) GiB usable", c.max_token_len_reason)
            assert m, c.max_token_len_reason
            assert float(m.group(1)) == pytest.approx(timed[nxt].peak_memory_gib, abs=0.06)
            assert float(m.group(2)) == pytest.approx(usable, abs=0.06)
    assert chosen.best.to_dict()["max_token_len"] == chosen.best.workload.max_token_len
    assert chosen.best.to_dict()["max_token_len_reason"] == chosen.best.max_token_len_reason


def test_one_budget_per_layout(chosen):
    keys = [(c.parallel, c.workload.recompute.granularity) for c in chosen.candidates]
    assert len(keys) == len(set(keys))


def test_a_given_max_token_len_is_kept():
    r = plan(MODEL, H100, 8, LENGTHS.max_tokens, 128, lengths=LENGTHS, max_token_len=12288, space=SPACE)
    assert {c.workload.max_token_len for c in r.candidates} == {12288}
    assert all(c.max_token_len_reason is None for c in r.candidates)


BASE = ["plan", "--model", "Qwen3-8B", "--gpu", "H100-SXM", "--num-gpus", "8", "--global-batch-size", "64"]


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--prompt-len", "2048:1024", "--response-len", "10:20"], "mat: error: prompt_len: mean 2048 is above max"),
        (["--prompt-len", "0:1024", "--response-len", "10:20"], "mat: error: prompt_len: mean must be >= 1"),
        (["--prompt-len", "512:1024"], "mat: error: response_len: --prompt-len and --response-len go together"),
        (["--prompt-len", "5:10", "--response-len", "5:10", "--seq-len", "20"], "mat: error: seq_len: comes from"),
        (["--prompt-len", "5:10", "--response-len", "5:10", "--max-token-len", "8"], "mat: error: max_token_len:"),
        (["--length-histogram", "{h}"], "mat: error: length_histogram: cannot read {h}: is not UTF-8"),
    ],
)
def test_cli_bad_lengths_are_one_line_errors(tmp_path, capsys, extra, expected):
    h = tmp_path / "h.csv"
    h.write_bytes(b"\xff10,1\n")
    argv = BASE + [x.format(h=h) for x in extra] + ["--output-dir", str(tmp_path / "out"), "--no-chart"]
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(err) == 1 and err[0].startswith(expected.format(h=h)), err
