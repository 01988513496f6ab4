"""`estimate`, `plan` and the ranking's display, probed as a new user met them: the change that
makes a layout fit, the layout rules and flags estimate used to ignore, plan's progress, the
counts it shows, plan.html offline and on a sane axis, plan --out checked and locked before the
searches, a ranking monotone in the quantity it names, and one way to show MFU and memory."""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import assert_user_error, held_elsewhere, run_cli
from rich.console import Console

from autoconfig.layout_search import plan as planning
from autoconfig.layout_search import rank
from autoconfig.report import plan_view

ESTIMATE = ["estimate", "--model", "llama3-70b"]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _estimated(tmp_path: Path, *flags: str) -> tuple[int, pd.Series]:
    """Exit code and the one-row CSV `estimate --out` writes for `flags`."""
    out = tmp_path / f"est{len(list(tmp_path.iterdir()))}.csv"
    result = run_cli(*ESTIMATE, *flags, "--out", str(out))
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, pd.read_csv(out).iloc[0]


# -- 1. the smallest tp/pp/cp change that fits ------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "doublings"),
    [(["--gpus", "32", "--tp", "8"], 1), (["--gpus", "64", "--tp", "2", "--seq-len", "8192"], 3)],
)
def test_a_layout_that_does_not_fit_gets_the_fewest_tp_pp_cp_doublings_that_fit(
    tmp_path: Path, flags: list[str], doublings: int
) -> None:
    result = run_cli(*ESTIMATE, *flags)
    assert result.returncode == 1, result.stderr
    assert "ZeRO-3" in result.stdout  # the memory-only changes stay beside it
    line = next(s for s in result.stdout.splitlines() if "the fewest that fit on" in s)
    found = re.search(r"\((\d+) doublings?, the fewest", line)
    assert found and int(found.group(1)) == doublings, line
    moves = {k: int(v) for k, _, v in re.findall(r"\b(tp|pp|cp) (\d+) -> (\d+)", line)}
    proposed = [f for k, v in moves.items() for f in (f"--{k}", str(v))]
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    seq = ["--seq-len", given["--seq-len"]] if "--seq-len" in given else []
    base = {"--tp": "1", "--pp": "1", "--cp": "1"} | {k: v for k, v in given.items() if k in
                                                       ("--tp", "--pp", "--cp")}  # fmt: skip
    kept = [f for k, v in base.items() if k[2:] not in moves for f in (k, v)]
    code, row = _estimated(tmp_path, "--gpus", given["--gpus"], *seq, *proposed, *kept)
    # the cost model, asked about the proposed layout, says it fits with the peak the line gives
    assert code == 0 and bool(row["pred_fits"])
    assert f"{row['pred_peak_mem_gib']:.1f} GiB (fits)" in line
    # and no change with fewer doublings fits (every one the layout rules allow)
    start = {k[2:]: int(v) for k, v in base.items()}
    for steps in itertools.product(range(doublings), repeat=3):
        if not 0 < sum(steps) < doublings:
            continue
        layout = {k: start[k] * 2**s for k, s in zip(("tp", "pp", "cp"), steps, strict=True)}
        try_flags = [f for k, v in layout.items() for f in (f"--{k}", str(v))]
        probe = run_cli(*ESTIMATE, "--gpus", given["--gpus"], *seq, *try_flags)
        assert probe.returncode in (1, 2), (layout, probe.stdout[-300:])


def test_a_layout_without_dp_to_trade_says_so() -> None:
    result = run_cli(*ESTIMATE, "--gpus", "1")
    assert result.returncode == 1
    assert "no tp, pp or cp change keeps 1 GPU: dp is 1" in result.stdout


# -- 2. the layout rules search and train apply ------------------------------------------------


def test_estimate_refuses_uneven_interleaving_with_trains_line() -> None:
    flags = ["--model", "llama3-70b", "--gpus", "32", "--tp", "8", "--pp", "2", "--vp", "3"]
    estimate = run_cli("estimate", *flags)
    assert_user_error(estimate, "pp: pp*vp = 6 must divide the 80 layers")
    train = run_cli("train", *flags, "--device", "cpu", "--steps", "3")
    assert train.returncode == 2 and train.stderr == estimate.stderr


def test_estimate_refuses_more_recomputed_layers_than_a_stage_holds() -> None:
    flags = ["--gpus", "8", "--tp", "8", "--recompute", "full", "--recompute-layers", "1000"]
    assert_user_error(run_cli(*ESTIMATE, *flags), "recompute_layers", "at most 80")
    assert run_cli(*ESTIMATE, *flags[:-1], "80").returncode in (0, 1)


def test_interleaving_that_divides_only_counting_the_ends_is_answered() -> None:
    # Llama 3 405B: 126 layers + the embedding and the head = 128 = 16 stages x 8 chunks
    flags = ["--model", "llama3-405b", "--gpus", "2048", "--tp", "8", "--pp", "16", "--vp", "8"]
    assert run_cli("estimate", *flags).returncode in (0, 1)


def test_cp_with_few_tokens_per_rank_is_estimated_and_says_the_search_leaves_it_out() -> None:
    """Decided: the search leaves cp with under min_tokens_per_cp_rank tokens per rank out as a
    policy, but such a layout runs (train takes it), so estimate answers it and says why search
    and --compare do not list it."""
    result = run_cli(*ESTIMATE, "--gpus", "64", "--tp", "8", "--cp", "8", "--seq-len", "1024")
    assert result.returncode in (0, 1), result.stderr
    assert "the search leaves this layout out: cp 8 leaves 128 tokens per rank" in result.stderr


# -- 3. flags estimate used to ignore ----------------------------------------------------------


def test_runs_with_layout_flags_is_refused(tmp_path: Path) -> None:
    runs = tmp_path / "runs.csv"
    runs.write_text(
        "layers,hidden,heads,vocab,seq_len,gpu,num_gpus,tp,pp,gbs\n"
        "32,4096,32,128256,8192,h100-sxm-80gb,8,2,1,64\n"
    )
    result = run_cli("estimate", "--runs", str(runs), "--model", "llama3-70b", "--gpus", "8")
    assert_user_error(result, "runs:", "--model", "--gpus")
    out = tmp_path / "pred.csv"
    assert run_cli("estimate", "--runs", str(runs), "--out", str(out)).returncode == 0
    assert len(pd.read_csv(out)) == 1


def test_out_without_runs_writes_the_single_estimate(tmp_path: Path) -> None:
    code, row = _estimated(tmp_path, "--gpus", "64", "--tp", "8", "--pp", "2")
    assert code == 0 and row["tp"] == 8 and row["pp"] == 2 and row["num_gpus"] == 64
    assert row["pred_tokens_per_s_per_gpu"] > 0 and bool(row["pred_fits"])
    # a layout that does not fit is written too, before the exit code says so
    code, row = _estimated(tmp_path, "--gpus", "8")
    assert code == 1 and not bool(row["pred_fits"])
    helped = re.sub(r"[\s│]+", " ", run_cli("estimate", "--help").stdout)
    assert "without, this estimate as one row" in helped


# -- 4. plan's progress ------------------------------------------------------------------------


def test_plan_tells_progress_of_every_count_it_searches() -> None:
    heard: list[tuple[str, int, bool]] = []
    found = planning.plan(
        "llama3-8b",
        planning.Goal(tokens=1e11, max_days=30),
        progress=lambda gpu, n, p: heard.append((gpu, n, p is None)),
    )
    counts = [p.gpus for p in found.points]
    assert len(heard) == 2 * len(counts) > 2
    assert [n for _, n, before in heard if before] == [n for _, n, before in heard if not before]
    assert sorted(n for _, n, before in heard if before) == counts
    assert heard[0] == ("h100-sxm-80gb", 1, True) and heard[1][2] is False


def test_the_progress_lines_go_to_a_terminal_only() -> None:
    pipe = Console(file=io.StringIO(), force_terminal=False)
    with plan_view.progress("llama3-8b", pipe) as tell:
        assert tell is None
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=120)
    with plan_view.progress("llama3-8b", terminal) as tell:
        assert tell is not None
        found = planning.plan("llama3-8b", planning.Goal(tokens=1e11, max_days=30), progress=tell)
    text = screen.getvalue()
    for p in found.points:  # a line for each count, with its days or why it has none
        assert (
            f"  {p.gpus:,} x h100-sxm-80gb: " + (f"{p.days:,.1f} days" if p.ok else p.reason)
            in text
        )
    assert "searching 1 x h100-sxm-80gb" in text  # the status line


# -- 5. counts no one would run ----------------------------------------------------------------


def _point(gpus: int, tokens_per_s: float, mfu: float) -> planning.Point:
    """A count whose best layout runs at `tokens_per_s` per GPU and `mfu`."""
    from autoconfig import api

    best = api.search("llama3-8b", 8).best.copy()
    best["pred_tokens_per_s_per_gpu"], best["pred_mfu"] = tokens_per_s, mfu
    return planning.Point("h100-sxm-80gb", gpus, None, 700.0, best, "", 1e12)


def test_dominated_and_low_mfu_counts_are_left_out_with_the_rule_stated() -> None:
    goal = planning.Goal(tokens=1e12, max_days=10)
    points = [
        _point(8, 1000.0, 0.50),
        _point(16, 990.0, 0.50),
        _point(24, 300.0, 0.15),  # slower in all than 16 GPUs: dominated
        _point(32, 600.0, 0.20),  # faster than fewer GPUs, but under half the median MFU
        planning.Point("h100-sxm-80gb", 40, None, 700.0, None, "no layout uses this many GPUs"),
        _point(48, 950.0, 0.48),
    ]
    plan = planning.Plan(goal, "llama3-8b", 256, "given", points, {"h100-sxm-80gb": points[5]})
    plan.chosen = points[5]
    kept, left = planning.shown(plan)
    assert [p.gpus for p in kept] == [8, 16, 48]
    assert {k: [p.gpus for p in v] for k, v in left.items()} == {
        "dominated": [24],
        "low MFU": [32],
        "no layout": [40],
    }
    console = Console(file=io.StringIO(), width=200)
    console.print(plan_view.plan_view(plan))
    text = console.file.getvalue()
    assert "left out, as no one would run them: slower than a count with no more GPUs (24)" in text
    assert "under 50% of the median MFU of the counts tried (32)" in text
    rows = [line for line in text.splitlines() if "h100-sxm-80gb │" in line]
    assert [int(r.split("│")[2].strip().replace(",", "")) for r in rows] == [8, 16, 48]


@pytest.fixture(scope="module")
def plan70() -> planning.Plan:
    """The README's plan: bisection reaches counts only an odd pipeline split uses."""
    return planning.plan("llama3-70b", planning.Goal(tokens=15e12, max_days=90))


def test_the_plan_shows_no_dominated_or_low_mfu_count(plan70: planning.Plan) -> None:
    kept, left = planning.shown(plan70)
    assert left  # the pp63 and pp15 bisection points of 2,016 and 1,920 GPUs
    ok = [p for p in kept if p.ok]
    for p in ok:
        assert not any(q.days < p.days and q.gpus <= p.gpus for q in ok if q is not p)
    median = np.median([float(p.best["pred_mfu"]) for p in plan70.points if p.ok])
    assert min(float(p.best["pred_mfu"]) for p in ok) >= 0.4 * median
    assert plan70.chosen in kept


# -- 6. plan.html offline, on a sane axis ------------------------------------------------------


def _browser(page: Path, tmp_path: Path) -> dict:
    """What plotly drew in `page` (headless Chromium, no network): each axis range and the
    traces drawn, read from the plot itself by a probe appended to a copy of the page."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (see .ci/run)")
        pytest.skip("chromium not installed: apt-get install chromium")
    probe = (
        "<script>setTimeout(function () { var gd = document.getElementById('plan');"
        "var L = gd._fullLayout; document.body.setAttribute('data-probe', JSON.stringify("
        "{y: L.yaxis.range, y2: L.yaxis2 ? L.yaxis2.range : null,"
        " traces: gd.querySelectorAll('.scatterlayer .trace').length})); }, 0)</script></body>"
    )
    copy = tmp_path / "probed.html"
    copy.write_text(page.read_text().replace("</body>", probe))
    result = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--host-resolver-rules=MAP * ~NOTFOUND",  # any fetch fails: offline
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            copy.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = re.search(r'data-probe="([^"]*)"', result.stdout)
    assert found, "plotly did not draw the plan (blank page)"
    return json.loads(found.group(1).replace("&quot;", '"'))


def test_plan_html_draws_offline_on_a_sane_log_axis(plan70: planning.Plan, tmp_path) -> None:
    page = plan_view.write_html(plan70, tmp_path / "out")
    text = page.read_text()
    markup = re.sub(r"<script[^>]*>.*?</script>", "<script></script>", text, flags=re.S)
    assert not re.search(r"<script[^>]*\bsrc=", markup)
    assert not re.search(r"(src|href)=[\"']https?://", markup)
    drawn = _browser(page, tmp_path)
    assert drawn["traces"] >= 1
    kept, _ = planning.shown(plan70)
    days = [p.days for p in kept if p.ok] + [90.0]
    low, high = drawn["y"]  # log10 of days
    assert np.log10(min(days)) - 1 < low <= np.log10(min(days))
    assert np.log10(max(days)) <= high < np.log10(max(days)) + 1  # not 10^84


def test_plan_html_budget_line_stays_on_the_cost_axis(tmp_path: Path) -> None:
    plan = planning.plan(
        "llama3-8b", planning.Goal(tokens=1e11, budget_usd=2e5), prices=(2.0,), max_gpus=64
    )
    drawn = _browser(plan_view.write_html(plan, tmp_path / "out"), tmp_path)
    costs = [p.cost_usd for p in planning.shown(plan)[0] if p.ok] + [2e5]
    low, high = drawn["y2"]
    assert np.log10(min(costs)) - 1 < low and high < np.log10(max(costs)) + 1


# -- 7. plan --out checked and locked before planning -----------------------------------------


@pytest.fixture
def no_planning(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("planned before checking --out")

    monkeypatch.setattr(planning, "plan", refuse)


PLAN = ["plan", "--model", "llama3-8b", "--tokens", "1e11", "--max-days", "30"]


def test_plan_out_naming_a_file_is_refused_before_planning(tmp_path: Path, no_planning) -> None:
    file = tmp_path / "taken.txt"
    file.write_text("x")
    assert_user_error(run_cli(*PLAN, "--out", str(file)), "out", "is a file")
    assert_user_error(run_cli(*PLAN, "--out", "/proc/x"), "out", "/proc")


def test_plan_out_held_by_another_run_is_refused_before_planning(
    tmp_path: Path, no_planning
) -> None:
    folder = tmp_path / "held"
    with held_elsewhere(folder):
        assert_user_error(run_cli(*PLAN, "--out", str(folder)), "out", "in use")


# -- 8. the ranking is monotone in what it names -----------------------------------------------


@pytest.fixture(scope="module")
def mixtral() -> pd.DataFrame:
    from autoconfig import api

    return api.search("mixtral-8x7b", 64).ranked


def test_every_layout_above_a_faster_one_names_its_tie_rule(mixtral: pd.DataFrame) -> None:
    low = mixtral[rank.RANK_BY].to_numpy()
    rule = mixtral["tie_break"].to_numpy()
    risk = mixtral["memory_risk"].to_numpy(bool)
    # the fastest row below each one
    below = np.r_[np.maximum.accumulate(low[::-1])[::-1][1:], -np.inf]
    assert (below > low).any()  # this search has ties broken against speed
    # "tie broken by" exactly where a row at least as fast is listed below ...
    assert ((rule != "") == (below >= low)).all()
    for i in np.flatnonzero(rule != ""):
        j = i + 1 + int(np.argmax(low[i + 1 :] >= low[i]))  # the nearest such row
        if rule[i] == rank.MEMORY_RISK_RULE:  # ... within the near-tie rule
            assert not risk[i] and risk[j] and low[i] >= low[j] * (1 - rank.NEAR_TIE)
        else:  # ... or equal speed
            assert rule[i] in dict(rank.TIE_RULES) and low[i] >= low[j] * (1 - rank.EQUAL_SPEED)
    # never more than a near-tie slower than anything below
    assert (low >= below * (1 - rank.NEAR_TIE) - 1e-9).all()


def test_the_table_shows_and_labels_the_quantity_it_ranks_by() -> None:
    result = run_cli("search", "--model", "mixtral-8x7b", "--gpus", "64", "--top", "10")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert f"ranked by '{rank.RANK_COLUMN}'" in text
    from autoconfig import api

    top = api.search("mixtral-8x7b", 64).ranked.head(10)
    for _, row in top.iterrows():
        cells = rank.top_row(row)
        assert cells[rank.RANK_COLUMN] == f"{row[rank.RANK_BY]:,.0f}"
        low, point = cells[rank.RANK_COLUMN], cells["tokens/s/GPU"]
        assert re.search(rf"│\s+{low}\s+│\s+{point}\s+│", result.stdout), (low, point)


def test_compare_places_a_left_out_layout_by_the_ranking_quantity(tmp_path: Path) -> None:
    from autoconfig import api
    from autoconfig.layout_search import compare

    result = api.search("llama3-8b", 16, gbs=128)
    # cp 8 leaves 1,024 of 8,192 tokens per rank: a layout the search does not enumerate
    out = tmp_path / "mine.csv"
    flags = ["--gpus", "16", "--tp", "2", "--cp", "8", "--gbs", "128", "--out", str(out)]
    assert run_cli("estimate", "--model", "llama3-8b", *flags).returncode == 0
    mine = pd.read_csv(out).iloc[0]
    placed = compare.compare(mine, result)
    assert not placed.in_search and placed.rank is not None
    low = placed.mine[rank.RANK_BY]
    assert low < mine["pred_tokens_per_s_per_gpu"]
    assert placed.rank == int((result.ranked[rank.RANK_BY] > low).sum()) + 1


# -- 9. one way to show MFU and memory ---------------------------------------------------------


def test_search_and_estimate_show_memory_against_the_same_limit_and_mfu_in_percent() -> None:
    search = run_cli("search", "--model", "llama3-8b", "--gpus", "8", "--top", "3")
    estimate = run_cli("estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "2")
    assert search.returncode == estimate.returncode == 0
    assert "of 79.6 GiB" in estimate.stdout
    assert re.search(r"\d+\.\d of 79\.6 │", search.stdout) and "/80" not in search.stdout
    assert rank.MEMORY_COLUMN.split()[0] in search.stdout
    mfu = re.findall(r"│\s+(\d+\.\d)%\s+│", search.stdout)
    assert len(mfu) == 3 and all(0 < float(m) < 100 for m in mfu)
    assert re.search(r"MFU\s+\d+\.\d%", estimate.stdout)
