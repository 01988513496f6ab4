"""The questions users ask in one command: `plan` (fewest GPUs for a deadline or budget),
`estimate --compare` (where my layout ranks), and one set of defaults across commands."""

from __future__ import annotations

import math

import pytest
import typer
from helpers import assert_user_error, run_cli

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.cli import register
from autoconfig.layout_search import batch
from autoconfig.layout_search import compare as judge
from autoconfig.layout_search import plan as planning
from autoconfig.spec import defaults, layout


def test_plan_finds_the_fewest_gpus_of_a_brute_force_loop() -> None:
    goal = planning.Goal(tokens=1e12, max_days=20)
    found = planning.plan("llama3-8b", goal, ("h100-sxm-80gb",))
    assert found.chosen is not None
    # brute force: every count the plan may answer (powers of two below a node, whole nodes)
    fewest = None
    for n in [1, 2, 4, *range(8, found.chosen.gpus + 1, 8)]:
        try:
            result = api.search("llama3-8b", n)
        except UserError:
            continue
        if not result.feasible:
            continue
        days = 1e12 / (result.best["pred_tokens_per_s_per_gpu"] * n) / 86400
        if days <= 20:
            fewest = n
            break
    assert found.chosen.gpus == fewest
    assert found.chosen.days <= 20
    best = found.chosen
    assert math.isclose(best.gpu_hours, best.days * 24 * best.gpus)
    assert math.isclose(best.energy_kwh, 700 * best.gpu_hours / 1000)  # H100 SXM board power


def test_plan_picks_the_cheapest_gpu_type() -> None:
    goal = planning.Goal(tokens=2e11, max_days=10)
    found = planning.plan("llama3-8b", goal, ("h100-sxm-80gb", "a100-sxm-80gb"), (4.0, 1.0))
    costs = {g: p.cost_usd for g, p in found.answers.items() if p is not None}
    assert found.chosen is not None and found.chosen.cost_usd == min(costs.values())


def test_the_batch_rule_does_not_grow_with_the_cluster() -> None:
    small = api.search("llama3-405b", 1024).request
    large = api.search("llama3-405b", 16384).request
    assert small.gbs == large.gbs == 2048  # 16M tokens of 8192: Llama 3 405B's batch
    assert "Llama 3" in small.gbs_rule and small.gbs_chosen
    spec = small.model
    assert batch.default_batch(spec, 8192).gbs * 8192 <= batch.CRITICAL_BATCH_TOKENS


def test_estimate_uses_the_same_batch_rule_and_says_so() -> None:
    row = api.estimate("llama3-70b", 64, "h100-sxm-80gb", tp=8, pp=2).iloc[0]
    rule = api.search("llama3-70b", 64).request.gbs
    assert row["gbs"] == rule and "GPT-3" in row["gbs_rule"]
    odd = api.estimate("llama3-70b", 48, "h100-sxm-80gb", tp=8, pp=2).iloc[0]
    assert odd["gbs"] % 3 == 0 and "rounded" in odd["gbs_rule"]


@pytest.mark.parametrize("position", [0, 6, 40])
def test_compare_ranks_a_layout_at_its_place_in_the_search(position: int) -> None:
    result = api.search("llama3-8b", 16, gbs=128)
    row = result.ranked.iloc[position]
    plain = layout.plain(row)
    mine = api.estimate(
        "llama3-8b",
        16,
        "h100-sxm-80gb",
        gbs=128,
        **{k: plain[k] for k in ("tp", "pp", "vp", "cp", "ep", "dp", "sp", "mbs", "zero")},
        recompute=plain["recompute"],
        recompute_layers=plain["recompute_layers"],
    ).iloc[0]
    c = judge.compare(mine, result)
    assert c.in_search and c.rank == position + 1 == int(row["rank"])
    assert math.isclose(
        c.gain,
        result.best["pred_tokens_per_s_per_gpu"] / row["pred_tokens_per_s_per_gpu"] - 1,
    )
    for change in c.changes:  # one searched dimension moves (and the ones that follow it)
        moved = [d for d in judge.PRIMARY if str(layout.plain(change.row)[d]) != str(plain[d])]
        assert len(moved) == 1 and change.gain > 0


def test_compare_and_fix_from_the_command_line() -> None:
    done = run_cli(
        "estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "4", "--pp", "2",
        "--gbs", "128", "--compare",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "your layout ranks #" in done.stdout and "faster" in done.stdout
    fixed = run_cli("search", "--model", "llama3-8b", "--gpus", "16", "--fix", "tp=2,pp=2")
    assert fixed.returncode == 0, fixed.stderr
    assert "tp2 pp2" in fixed.stdout


def test_estimate_that_does_not_fit_exits_1_with_the_change_that_fits() -> None:
    done = run_cli(
        "estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "2",
        "--gbs", "512",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "closest:" in done.stdout and "(fits)" in done.stdout


SHARED = ("gpu", "precision", "zero", "recompute", "sp", "framework", "gbs", "memory_headroom")
# train runs on this machine's devices: its --gpu is the profile MFU is computed against, the
# GPU it detects unless given; its --gbs is a few-step profiling batch, not the training batch.
# infer's --precision is the serving weight formats it tries, not a training precision.
OWN = {("train", "gpu"), ("train", "gbs"), ("infer", "precision")}


def test_every_command_shows_the_same_defaults() -> None:
    group = typer.main.get_command(register())
    shown: dict[str, dict[str, str]] = {}
    for name, command in group.commands.items():
        ctx = command.make_context(name, ["--help"], resilient_parsing=True)
        for param in command.params:
            if param.name in SHARED and (name, param.name) not in OWN:
                record = param.get_help_record(ctx)
                text = record[1] if record else ""
                default = text.split("[default: ")[-1].split("]")[0] if "default:" in text else ""
                shown.setdefault(param.name, {})[name] = default
    assert {"search", "estimate", "plan"} <= set(shown["gpu"])
    assert {"search", "estimate", "plan", "train"} <= set(shown["precision"])
    assert {"estimate", "train"} <= set(shown["zero"]) and set(shown["sp"]) >= {"estimate", "train"}
    for flag, by_command in shown.items():
        values = {v.strip("()").split(" ")[0] for v in by_command.values()}
        assert len(values) == 1, f"--{flag} defaults differ: {by_command}"
    assert shown["gpu"]["search"].startswith(defaults.GPU)
    assert shown["zero"]["train"].split(";")[0] == str(defaults.ZERO)
    train = group.commands["train"]
    flags = {o: p for p in train.params for o in p.opts}
    assert "--gpus" in flags and flags["--nproc"].hidden


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--tokens", "0", "--max-days", "30"], "tokens"),
        (["--tokens", "1e12", "--max-days", "-3"], "max-days"),
        (["--tokens", "1e12", "--budget-usd", "0", "--gpu-hour-usd", "2"], "budget-usd"),
        (["--tokens", "1e12", "--max-days", "30", "--gpu-hour-usd", "-1"], "gpu-hour-usd"),
    ],
)
def test_plan_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    assert_user_error(run_cli("plan", "--model", "llama3-8b", *args), needle)


def test_plan_refuses_goals_and_prices_it_cannot_use() -> None:
    with pytest.raises(UserError, match="tokens"):
        planning.Goal(-1e12, max_days=30)
    with pytest.raises(UserError, match="max-days, --budget-usd"):
        planning.Goal(1e12)
    goal = planning.Goal(1e12, budget_usd=1e6)
    with pytest.raises(UserError, match="budget-usd: needs --gpu-hour-usd"):
        planning.check(goal, ("h100-sxm-80gb",), (), 64)
    with pytest.raises(UserError, match="one per --gpu"):
        planning.check(goal, ("h100-sxm-80gb", "a100-sxm-80gb", "b200-180gb"), (1.0, 2.0), 64)


def test_a_deadline_nothing_meets_shows_the_closest_plan_and_exits_1() -> None:
    done = run_cli(
        "plan", "--model", "llama3-8b", "--tokens", "15e12", "--max-days", "5",
        "--max-gpus", "64",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "nothing meets the goal; closest: 64 x h100-sxm-80gb" in done.stdout
    assert "days over by" in done.stdout
