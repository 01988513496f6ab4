"""Measured response lengths (`autoconfig rl --lengths FILE`): the rollout draws from the
file's distribution, its longest response sets the straggler, and bad files are one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.rl.lengths import ResponseLengths, read_response_lengths

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "chat_lengths.csv"


def _write(path: Path, lengths: list[int], column: str = "output_len") -> Path:
    path.write_text(column + "\n" + "\n".join(str(n) for n in lengths) + "\n")
    return path


def test_measured_distribution_keeps_mean_and_longest(tmp_path: Path) -> None:
    drawn = read_response_lengths(_write(tmp_path / "l.csv", [10, 10, 10, 70]))
    assert drawn.mean_tokens == pytest.approx(25.0)
    assert drawn.max_tokens == 70.0
    # four strata: three of 10 tokens and the longest
    assert list(drawn.stratified(4)) == [10.0, 10.0, 10.0, 70.0]
    # many draws: the shares follow the counts
    many = drawn.stratified(1000)
    assert np.mean(many == 70.0) == pytest.approx(0.25, abs=0.002)


def test_the_length_column_reads_too(tmp_path: Path) -> None:
    drawn = read_response_lengths(_write(tmp_path / "l.csv", [5, 15], column="length"))
    assert drawn.mean_tokens == 10.0


def test_a_longer_tail_slows_the_rollout(tmp_path: Path) -> None:
    short = _write(tmp_path / "short.csv", [200] * 99 + [400])
    tail = _write(tmp_path / "tail.csv", [200] * 99 + [4000])
    kw = dict(top=None, placement="colocated")
    fast = api.rl("llama3-8b", 8, "h100-sxm-80gb", lengths=short, **kw)
    slow = api.rl("llama3-8b", 8, "h100-sxm-80gb", lengths=tail, **kw)
    label = fast.steps[0].plan.label()
    a = next(s.rollout.seconds for s in fast.steps if s.plan.label() == label)
    b = next(s.rollout.seconds for s in slow.steps if s.plan.label() == label)
    assert b > 2 * a  # the one 4,000-token response is the straggler every step waits for


def test_the_example_workload_reads_as_responses() -> None:
    plans = api.rl("llama3-8b", 8, "h100-sxm-80gb", top=1, lengths=EXAMPLE)
    assert plans.job.lengths.source == "chat_lengths.csv"
    assert isinstance(plans.job.lengths, ResponseLengths) and plans.job.lengths.lengths


def test_mean_and_file_together_are_refused() -> None:
    with pytest.raises(UserError, match="mean-response-len: the lengths file sets the mean"):
        api.rl("llama3-8b", 8, "h100-sxm-80gb", lengths=EXAMPLE, mean_response_len=300)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("tokens\n5\n", "no 'output_len' or 'length' column"),
        ("output_len\n5\n-3\n", "line 3"),
        ("output_len\n", "no lengths"),
    ],
)
def test_bad_files_are_one_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    done = run("rl", "--model", "llama3-8b", "--gpus", "8", "--lengths", str(path))
    assert_user_error(done, "lengths:", needle)


def test_a_response_above_the_limit_is_refused() -> None:
    done = run(
        "rl", "--model", "llama3-8b", "--gpus", "8", "--lengths", str(EXAMPLE),
        "--max-response-len", "100",
    )  # fmt: skip
    assert_user_error(done, "lengths:", "above max-response-len 100")
