"""`infer` probed as a careless user or an attacker would (issue 35): limits that were ignored,
workload files that overflowed, hung or grew without bound, flags refused with the wrong
diagnosis or a traceback, the output folder's lock, and the units of the serving tables. Bad
input is one line naming the flag and what is allowed, exit code 2 (helpers.assert_user_error),
and nothing written."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import assert_user_error, held_elsewhere, run_cli

from autoconfig import api
from autoconfig.base.checks import MAX_TEXT_BYTES
from autoconfig.columns.build import serving_inputs
from autoconfig.cost.kv_cache import kv_capacity
from autoconfig.cost.serving_sim import Limits, Trace, poisson_arrivals, simulate
from autoconfig.cost.serving_step import step_model, take
from autoconfig.report.serving import row_cells
from autoconfig.serve.workload import MAX_REQUESTS, Lengths, Workload, chat
from autoconfig.spec import catalog

# A quick continuous-batching run: a small model, few requests, no disaggregated pools.
QUICK = ["infer", "--model", "llama3-8b", "--gpus", "1", "--requests", "20"]
COLOCATED = [*QUICK, "--no-disaggregation"]


def _csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- 1. a throughput floor holds for every deployment ------------------------------------------


def test_min_throughput_holds_for_disaggregated_pools_too() -> None:
    """1e14 output tokens/s is out of reach: nothing meets it, disaggregated pools included
    (they used to pass without the check: '6 meet the limits')."""
    result = run_cli(
        "infer",
        "--model",
        "llama3-8b",
        "--gpus",
        "2",
        "--requests",
        "40",
        "--min-throughput",
        "1e14",
    )
    assert result.returncode == 1, result.stdout
    assert "0 meet the limits" in result.stdout
    assert "throughput" in result.stdout and "tokens/s total" in result.stdout
    served = api.infer("llama3-8b", gpus=2, requests=40, min_throughput=1e14)
    pools = served.table[served.table["mode"] == "disaggregated"]
    assert len(pools) and not pools["meets"].any()
    assert pools["pruned"].str.contains("throughput").all()


# -- 2. workload lengths and counts are bounded --------------------------------------------------


@pytest.mark.parametrize("cell", ["1e20", "16777217", "-5", "2.5", "nan"])
def test_workload_length_out_of_range_is_refused_naming_its_row(tmp_path, cell: str) -> None:
    path = _csv(tmp_path / "w.csv", f"input_len,output_len\n100,10\n{cell},10\n")
    result = run_cli(*COLOCATED, "--workload", str(path))
    assert_user_error(result, "workload", "row 3", "input_len", "1..16,777,216")


def test_workload_request_beyond_the_context_is_refused_naming_its_row(tmp_path) -> None:
    path = _csv(tmp_path / "w.csv", "input_len,output_len\n100,10\n131000,200\n")
    result = run_cli(*COLOCATED, "--workload", str(path))
    assert_user_error(result, "workload", "row 3", "131,200", "131,072")


def test_workload_lengths_never_wrap_to_a_negative_mean(tmp_path) -> None:
    path = _csv(tmp_path / "w.csv", "input_len,output_len\n1e20,10\n100,10\n")
    with pytest.raises(Exception, match="input_len") as refused:
        api.infer("llama3-8b", gpus=1, workload=str(path), requests=20)
    assert "negative" not in str(refused.value)


def test_timed_workload_rows_are_bounded(tmp_path) -> None:
    rows = "".join(f"10,5,{i}\n" for i in range(MAX_REQUESTS + 1))
    path = _csv(tmp_path / "trace.csv", "input_len,output_len,arrival_s\n" + rows)
    result = run_cli(*COLOCATED, "--workload", str(path))
    assert_user_error(result, "workload", f"{MAX_REQUESTS + 1:,} rows", f"{MAX_REQUESTS:,}")


# -- 3. a flag out of range is named, not the GPU count -------------------------------------------


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--max-num-batched-tokens", "16777216"], "max-num-batched-tokens"),
        (["--kv-cache-fraction", "1e-9"], "kv-cache-fraction"),
        (
            [
                "--batching",
                "static",
                "--input-len",
                "100",
                "--output-len",
                "10",
                "--batch",
                "16777216",
            ],
            "batch",
        ),
    ],
)
def test_flag_that_leaves_no_memory_is_named_with_its_range(flags: list[str], field: str) -> None:
    result = run_cli(*COLOCATED, *flags)
    assert_user_error(result, f"{field}:")
    line = result.stderr.strip()
    assert "gpus:" not in line and "does not fit on" not in line
    assert re.search(r"allowed.*(\d|above)", line), line


@pytest.mark.parametrize(
    ("flag", "extra"),
    [
        ("--max-num-batched-tokens", []),
        ("--batch", ["--batching", "static", "--input-len", "100", "--output-len", "10"]),
    ],
)
def test_the_stated_largest_value_is_the_largest_that_fits(flag: str, extra: list[str]) -> None:
    """The range the refusal states is exact: its top runs, one more is refused."""
    refused = run_cli(*COLOCATED, *extra, flag, "16777216")
    top = int(re.search(r"at most ([\d,]+)", refused.stderr).group(1).replace(",", ""))
    assert run_cli(*COLOCATED, *extra, flag, str(top)).returncode in (0, 1)
    assert_user_error(run_cli(*COLOCATED, *extra, flag, str(top + 1)), flag.lstrip("-"))


def test_the_stated_kv_share_fits() -> None:
    refused = run_cli(*COLOCATED, "--kv-cache-fraction", "1e-9")
    least = re.search(r"at least ([\d.e-]+)", refused.stderr).group(1)
    assert run_cli(*COLOCATED, "--kv-cache-fraction", least).returncode in (0, 1)


# -- 4. the default workload fits the model's context ----------------------------------------


def test_default_chat_workload_is_scaled_to_a_short_context_and_says_so() -> None:
    result = run_cli(
        "infer", "--model", "gpt3-126m", "--gpus", "1", "--requests", "20", "--no-disaggregation"
    )
    assert result.returncode in (0, 1), result.stderr
    assert "scaled by 0.80 to fit gpt3-126m's context of 2,048 tokens" in result.stdout
    served = api.infer("gpt3-126m", gpus=1, requests=20, disaggregation=False)
    assert served.request.workload.longest <= 2048
    assert served.request.input_len == round(served.request.workload.input.mean)


def test_a_given_length_keeps_and_the_assumed_one_is_cut() -> None:
    result = run_cli(
        "infer",
        "--model",
        "gpt3-126m",
        "--gpus",
        "1",
        "--requests",
        "20",
        "--no-disaggregation",
        "--input-len",
        "2000",
    )
    assert result.returncode in (0, 1), result.stderr
    assert "outputs cut to 48 tokens" in result.stdout


def test_given_lengths_beyond_the_context_are_still_refused() -> None:
    result = run_cli(
        "infer", "--model", "gpt3-126m", "--gpus", "1", "--input-len", "2000", "--output-len", "100"
    )
    assert_user_error(result, "input-len", "2100", "2048")


def test_within_cuts_only_the_assumed_lengths() -> None:
    scaled = chat().within(1024, "m")
    assert scaled.longest <= 1024 and scaled.input.assumed and "scaled" in scaled.source
    given = Workload(Lengths(3000, 3000), chat().output)
    assert given.within(2048, "m").input == Lengths(3000, 3000)  # never changed


# -- 5. only regular files are read, of a stated size ------------------------------------------


def test_workload_folder_is_refused(tmp_path) -> None:
    assert_user_error(run_cli(*COLOCATED, "--workload", str(tmp_path)), "workload", "folder")


def test_workload_device_is_refused_without_reading_it() -> None:
    assert_user_error(run_cli(*COLOCATED, "--workload", "/dev/zero"), "workload", "regular")


def test_workload_fifo_is_refused_without_blocking(tmp_path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    done: list = []
    worker = threading.Thread(
        target=lambda: done.append(run_cli(*COLOCATED, "--workload", str(fifo)))
    )
    worker.start()
    worker.join(30)
    if worker.is_alive():  # blocked on open(): give it a writer so the thread can end
        os.close(os.open(fifo, os.O_WRONLY))
        worker.join(30)
        pytest.fail("reading a FIFO --workload blocked")
    assert_user_error(done[0], "workload", "regular")


def test_workload_larger_than_the_limit_is_refused_stating_it(tmp_path) -> None:
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_TEXT_BYTES + 1)  # sparse: no disk used
    assert_user_error(
        run_cli(*COLOCATED, "--workload", str(big)), "workload", f"{MAX_TEXT_BYTES:,}"
    )


# -- 6. impossible (max-num-seqs, max-num-batched-tokens) pairs ---------------------------------


def test_token_budget_below_every_running_batch_limit_is_refused() -> None:
    result = run_cli(*COLOCATED, "--max-num-batched-tokens", "1")
    assert_user_error(result, "max-num-batched-tokens", "at least 16")


def test_running_batch_limit_above_every_token_budget_is_refused() -> None:
    result = run_cli(*COLOCATED, "--max-num-seqs", "16777216")
    assert_user_error(result, "max-num-seqs", "at most 8,192")


# -- 7. simulated requests are bounded, and cost linear time ------------------------------------


@pytest.mark.parametrize("count", ["16777216", str(MAX_REQUESTS + 1), "19"])
def test_requests_outside_the_limit_are_refused(count: str) -> None:
    assert_user_error(run_cli(*QUICK[:-2], "--requests", count), "requests", f"{MAX_REQUESTS:,}")


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--request-rate", "inf"), ("--request-rate", "1e300"), ("--kv-cache-fraction", "1.5")],
)
def test_rates_and_shares_out_of_range_are_refused(flag: str, value: str) -> None:
    assert_user_error(run_cli(*COLOCATED, flag, value), flag.lstrip("-"), "at most")


def test_api_workload_beyond_the_request_limit_is_refused() -> None:
    load = Workload(Lengths(100, 100), Lengths(10, 10), requests=2**24)
    with pytest.raises(Exception, match=f"requests: must be in 20..{MAX_REQUESTS:,}"):
        api.infer("llama3-8b", gpus=1, workload=load)


def _simulation_seconds(requests: int, rows: int = 40) -> float:
    spec, gpu = catalog.get_model("llama3-8b"), catalog.get_gpu("h100-sxm-80gb")
    frame = pd.DataFrame(
        {
            "tp": [1.0],
            "pp": [1.0],
            "batch_size": 1.0,
            "input_len": 1000.0,
            "output_len": 200.0,
            "replicas": 1.0,
            "precision": "bf16",
            "kv_precision": "bf16",
        }
    )
    s = serving_inputs(spec, (gpu, gpu.cluster), frame)
    cap = kv_capacity(s)
    rng = np.random.default_rng(1)
    trace = Trace(
        poisson_arrivals(requests, 0),
        rng.integers(128, 2049, requests).astype(float),
        rng.integers(64, 513, requests).astype(float),
    )
    full = np.full(rows, 1.0)
    limits = Limits(
        rate=np.linspace(2, 20, rows),
        max_seqs=256 * full,
        max_tokens=8192 * full,
        kv_tokens=cap.tokens[0] * full,
        block_tokens=16 * full,
        static=0 * full,
        prefill_only=0 * full,
        prompt_cached=0 * full,
    )
    start = time.process_time()
    sim = simulate(take(step_model(s), np.zeros(rows, int)), trace, limits)
    assert sim.finished.min() == 1.0
    return time.process_time() - start


def test_simulation_time_grows_linearly_with_the_requests() -> None:
    """Ten times the requests: about ten times the time (every step used to touch every
    request of the trace: 62x measured for 10x the requests)."""
    small, large = _simulation_seconds(200), _simulation_seconds(2000)
    assert large < 20 * small, (small, large)


# -- 8. one run at a time holds --out -----------------------------------------------------------


def test_second_infer_into_a_held_folder_is_refused(tmp_path) -> None:
    out = tmp_path / "serve"
    with held_elsewhere(out):
        result = run_cli(*COLOCATED, "--out", str(out))
    assert_user_error(result, "out", "in use")
    assert result.stdout == ""  # refused before the search, not when writing after it
    assert not (out / "results.csv").exists()


# -- 9. refused instead of silently taken ------------------------------------------------------


@pytest.mark.parametrize("top", ["0", "-1"])
def test_top_below_one_is_refused(top: str) -> None:
    assert_user_error(run_cli(*COLOCATED, "--top", top), "top", "1..")


def test_resume_without_measure_is_refused(tmp_path) -> None:
    result = run_cli(*COLOCATED, "--resume", "--out", str(tmp_path / "runs"))
    assert_user_error(result, "resume", "--measure")
    assert not (tmp_path / "runs").exists()


def test_empty_out_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert_user_error(run_cli(*COLOCATED, "--out", ""), "out", "empty")
    assert list(tmp_path.iterdir()) == []


# -- 10. every column says its unit, per replica or in total ----------------------------------

UNITS = ("ms", "req/s", "tok/s", "GiB", "seqs", "tokens")
NAMES = {"#", "deployment", "precision", "tp", "pp", "replicas", "Pareto"}


@pytest.mark.parametrize("batching", ["continuous", "static"])
def test_every_serving_column_says_its_unit(batching: str) -> None:
    lengths = {"input_len": 100, "output_len": 10} if batching == "static" else {"requests": 20}
    served = api.infer("llama3-8b", gpus=2, batching=batching, **lengths)
    percentile = served.request.percentile if batching == "continuous" else None
    heads = list(row_cells(served.table.iloc[0], percentile))
    for head in heads:
        assert head in NAMES or any(unit in head for unit in UNITS), head
    rates = [h for h in heads if "req/s" in h and "/GPU" not in h]
    assert all("total" in h or "per replica" in h for h in rates), rates


def test_measured_points_say_their_rate_is_per_replica(monkeypatch) -> None:
    from autoconfig.measure.serving import build
    from autoconfig.trainer.serve_loop import LOAD_ENV

    monkeypatch.delenv(LOAD_ENV, raising=False)
    served = api.infer(
        "tiny-llama",
        gpus=2,
        gpu="cpu-gloo",
        requests=20,
        precision="fp32",
        input_len="16:64",
        output_len="8:16",
    )
    try:
        labels = build(served, "tiny-llama", 3, {}).table["label"]
    finally:
        os.environ.pop(LOAD_ENV, None)
    assert len(labels) and labels.str.contains(r"req/s per replica").all()
