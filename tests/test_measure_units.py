"""Measured search without launching anything: the sampler stays on untried candidates, the
analytical top-k go first, resume checks, the ranking and the calibration fit."""

from __future__ import annotations

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.measure import calibrate, summary
from autoconfig.measure.candidates import build
from autoconfig.measure.result import MeasuredSearch
from autoconfig.measure.runner import memory_verdict
from autoconfig.measure.sampler import CandidateSampler, distributions
from autoconfig.measure.study import enqueue_top, open_storage, open_study
from autoconfig.spec import catalog, layout
from autoconfig.trainer.metrics import RunMetrics

OVERRIDES = {"steps": 3, "warmup": 1, "device": "cpu", "gpu": "cpu-gloo"}


@pytest.fixture(scope="module")
def candidates():
    ranked = api.search("tiny-llama", 4, "cpu-gloo", gbs=16)
    return build(ranked, "tiny-llama", 1000, OVERRIDES)


def _study(candidates, kind: str, url: str = "sqlite:///:memory:") -> optuna.Study:
    sampler = CandidateSampler(candidates.table, kind, seed=1, startup=3)
    return open_study(open_storage(url), {"model": "tiny-llama"}, False, sampler, "memory")


def _fake_measure(row: pd.Series) -> float:
    # A made-up truth that disagrees with the model: pipelines and big micro-batches win.
    return float(row["pred_tokens_per_s_per_gpu"] * (1 + 0.3 * row["pp"]) * (1 + 0.1 * row["mbs"]))


def test_candidates_are_feasible_and_checked_by_the_trainer(candidates) -> None:
    table = candidates.table
    assert table["key"].is_unique
    assert table["analytical_rank"].tolist() == list(range(1, len(table) + 1))
    # ZeRO-1 with tp > 1 runs now (the sharded optimizer shards DTensor parameters). With a
    # small gbs the search still proposes pipelines with fewer micro-batches than stages,
    # which the trainer's 1F1B schedule refuses: the only refusal left here.
    zero1_tp = (table["zero"] == 1) & (table["tp"] > 1)
    assert zero1_tp.any() and (table.loc[zero1_tp & (table["pp"] == 1), "refused"] == "").all()
    refused = table.loc[table["refused"] != "", "refused"]
    assert refused.str.contains("micro-batches per step but pp").all()
    assert (table["refused"] == "").sum() > 100


@pytest.mark.parametrize("kind", ["tpe", "random", "grid", "model", "gp"])
def test_sampler_never_repeats_and_stays_on_runnable_candidates(candidates, kind) -> None:
    study = _study(candidates, kind)
    queued = enqueue_top(study, candidates, 3)
    space = distributions(candidates.table)
    runnable = set(candidates.runnable()["key"])
    seen = []
    trials = 12 if kind != "gp" else 6
    for _ in range(trials):
        trial = study.ask(space)
        key = layout.key(trial.params)
        seen.append(key)
        study.tell(trial, _fake_measure(candidates.by_key(key)))
    assert len(set(seen)) == len(seen)
    assert set(seen) <= runnable
    assert seen[:3] == queued  # the analytical top-k are measured first
    assert queued == candidates.runnable().sort_values("analytical_rank")["key"].head(3).tolist()
    if kind == "grid":
        order = candidates.runnable().sort_values("grid_order")["key"].tolist()
        rest = [k for k in order if k not in queued]
        assert seen[3:] == rest[: trials - 3]


def test_resume_refuses_another_search_and_changes_nothing(tmp_path, candidates) -> None:
    url = f"sqlite:///{tmp_path / 'study.db'}"
    sampler = CandidateSampler(candidates.table, "tpe")
    study = open_study(open_storage(url), {"model": "tiny-llama", "gpus": 4}, False, sampler, "x")
    enqueue_top(study, candidates, 2)
    before = len(study.get_trials())
    with pytest.raises(UserError, match="already holds"):
        open_study(open_storage(url), {"model": "tiny-llama", "gpus": 4}, False, sampler, "x")
    with pytest.raises(UserError, match=r"another setting: gpus 4 \(now 8\)"):
        open_study(open_storage(url), {"model": "tiny-llama", "gpus": 8}, True, sampler, "x")
    with pytest.raises(UserError, match="no measured search"):
        open_study(open_storage(f"sqlite:///{tmp_path / 'other.db'}"), {}, True, sampler, "y")
    again = open_study(open_storage(url), {"model": "tiny-llama", "gpus": 4}, True, sampler, "x")
    assert len(again.get_trials()) == before


def test_unopenable_storage_is_one_line(tmp_path) -> None:
    with pytest.raises(UserError, match="storage: cannot open"):
        open_storage(f"sqlite:///{tmp_path}/missing/dir/study.db")


def test_ranking_puts_measured_figures_beside_predictions(candidates) -> None:
    rows = candidates.runnable().head(3)
    trials = pd.DataFrame(
        [
            {"trial": 0, "key": rows["key"].iloc[0], "class": "ok", "reason": "",
             "measured_tokens_per_s_per_gpu": rows["pred_tokens_per_s_per_gpu"].iloc[0] / 2},
            {"trial": 1, "key": rows["key"].iloc[1], "class": "ok", "reason": "",
             "measured_tokens_per_s_per_gpu": rows["pred_tokens_per_s_per_gpu"].iloc[1]},
            {"trial": 2, "key": rows["key"].iloc[2], "class": "oom", "reason": "too big",
             "measured_tokens_per_s_per_gpu": None},
        ]
    )  # fmt: skip
    ranked = summary.ranking(candidates, trials)
    measured = ranked[ranked["ranked_by"] == "measured"]
    assert len(measured) == 2
    assert measured["error_pct"].round(1).tolist() == [0.0, 100.0]
    assert MeasuredSearch(trials, ranked).scale == pytest.approx(0.75)  # median of 0.5 and 1.0
    oom = ranked[ranked["key"] == rows["key"].iloc[2]].iloc[0]
    assert oom["ranked_by"] == "oom" and oom["rank"] == len(ranked)  # failures go last
    unmeasured = ranked[ranked["ranked_by"] == "predicted"]
    np.testing.assert_allclose(unmeasured["score"], unmeasured["pred_tokens_per_s_per_gpu"] * 0.75)


def test_calibration_recovers_constants_it_was_not_given(tmp_path, candidates) -> None:
    """'Measurements' made by the cost model under other attention efficiency and collective
    latency than cpu-gloo's: the fit, started from cpu-gloo, must bring the error near zero."""
    truth = {"attention": 0.25, "intra_node_latency_us": 400.0}
    keys = candidates.runnable()["key"].iloc[::8].head(16)  # varied layouts
    trials = [calibrate.Trial(i, candidates.config(k), 1.0) for i, k in enumerate(keys)]
    measured = calibrate.predictions(trials, truth)
    trials = [calibrate.Trial(t.number, t.config, m) for t, m in zip(trials, measured, strict=True)]
    result = calibrate.fit_trials(trials)
    assert np.median(np.abs(result.before / measured - 1)) > 0.05
    assert np.median(np.abs(result.after / measured - 1)) < 0.001
    profile = result.profile(tmp_path)
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(profile))
    loaded = catalog.get_gpu(str(path))  # a profile by path, as --profile takes it
    assert loaded.name == "cpu-gloo-calibrated"
    assert "16 measured trials" in loaded.efficiency.provenance
    assert api.search("tiny-llama", 4, str(path), gbs=16).feasible > 0


def _study_of(candidates, truth: dict[str, float], keys, noise: float, seed: int = 0):
    """Trials whose 'measurements' the cost model makes under other constants, with noise."""
    trials = [calibrate.Trial(i, candidates.config(k), 1.0) for i, k in enumerate(keys)]
    measured = calibrate.predictions(trials, truth)
    measured *= np.exp(np.random.default_rng(seed).normal(0.0, noise, len(trials)))
    return [calibrate.Trial(t.number, t.config, m) for t, m in zip(trials, measured, strict=True)]


def test_calibration_on_half_a_study_predicts_the_other_half_better(candidates) -> None:
    truth = {"gemm": 0.2, "intra_node_latency_us": 300.0, "step_overhead_ms": 60.0}
    keys = candidates.runnable()["key"].iloc[::5].head(16)
    trials = _study_of(candidates, truth, keys, noise=0.03)
    fitted, other = trials[::2], trials[1::2]
    result = calibrate.fit_trials(fitted)
    assert not result.refused and result.heldout_after < result.heldout_before
    measured = np.array([t.measured for t in other])
    before = np.median(np.abs(calibrate.predictions(other) / measured - 1))
    after = np.median(np.abs(calibrate.predictions(other, result.constants) / measured - 1))
    assert before > 0.1 and after < before / 2
    assert any(line.startswith("intra_node_latency_us 50 -> ") for line in result.moves())


def test_few_trials_leave_unidentifiable_constants_at_the_prior(tmp_path, candidates) -> None:
    """Two trials of one layout family: at most one constant moves, the rest keep the
    profile's values and say why; with one trial nothing can be checked, so nothing moves."""
    runnable = candidates.runnable()
    keys = runnable[(runnable["tp"] == 1) & (runnable["pp"] == 1)]["key"].head(2)
    trials = _study_of(candidates, {"gemm": 0.5, "step_overhead_ms": 5.0}, keys, noise=0.0)
    result = calibrate.fit_trials(trials)
    assert len(result.constants) <= 1
    assert {"inter_node_bus", "inter_node_latency_us"} <= set(result.held)
    assert len(result.held) >= 6 and all(result.held.values())
    base = catalog.get_gpu("cpu-gloo").efficiency
    eff = result.profile(tmp_path)["efficiency"]
    for name in result.held:
        assert eff[name] == getattr(base, name)
    one = calibrate.fit_trials(trials[:1])
    assert one.constants == {} and one.refused
    assert np.array_equal(one.after, one.before)


def _ranks(tmp_path, messages: dict[int, str]) -> None:
    """rank{r}.json files as failed ranks leave them (a rank absent from `messages` left none)."""
    import json

    for rank, message in messages.items():
        result = {"rank": rank, "status": "error", "message": message}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(result))


def test_a_ranks_own_failure_survives_the_cut_of_a_long_message(tmp_path) -> None:
    """16 ranks: rank 12 failed on its own, rank 3 left nothing, the rest lost their peers
    with long gloo messages. The run's message is cut at 2,000 characters: the cause and the
    lost rank come first, so the crash is not taken for a rank lost from outside."""
    from autoconfig.measure.outcome import Outcome, lost_a_rank, message_parts
    from autoconfig.spec.vocab import FailureClass
    from autoconfig.trainer.assemble import assemble
    from autoconfig.trainer.config import TrainConfig

    peer = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Connection closed by peer " + "x" * 200
    messages = {r: peer for r in range(16) if r not in (3, 12)}
    messages[12] = "ValueError: a bug of this layout"
    _ranks(tmp_path, messages)
    cfg = TrainConfig(model="tiny-llama", dp=16, device="cpu")
    metrics = assemble(cfg, tmp_path, 16)
    parts = message_parts(metrics.message)
    assert parts[0] == "rank 12: ValueError: a bug of this layout"
    assert parts[1].startswith("ranks 3 wrote no result")
    assert not lost_a_rank(Outcome(FailureClass.CRASH, "", metrics))
    # Without rank 12's own failure it is a rank lost from outside.
    _ranks(tmp_path, {12: peer})
    lost = assemble(cfg, tmp_path, 16)
    assert lost_a_rank(Outcome(FailureClass.CRASH, "", lost))
    # A job in which no rank wrote anything (a broken setup, say) is not one.
    for path in tmp_path.glob("rank*.json"):
        path.unlink()
    assert not lost_a_rank(Outcome(FailureClass.CRASH, "", assemble(cfg, tmp_path, 16)))


def test_an_out_of_memory_trial_is_judged_by_the_prediction_of_the_run_as_launched() -> None:
    search_says = {"pred_peak_mem_gib": 55.0, "mem_limit_gib": 79.6}
    # The trainer's own prediction (autocast on GPU) put the run over the limit: the model was
    # right about the run, the search's figure is for another framework's run.
    over = RunMetrics(status="oom", config={}, predicted={"pred_peak_mem_gib": 81.2})
    said = memory_verdict(search_says, over)
    assert "81.20 GiB, over the 79.60 GiB limit" in said and "search's 55.00 GiB" in said
    assert "verdict was wrong" not in said
    under = RunMetrics(status="oom", config={}, predicted={"pred_peak_mem_gib": 61.1})
    assert "said it fits: 61.10 of 79.60 GiB" in memory_verdict(search_says, under)
    # a run that left no prediction: the search's figure stands in
    assert "said it fits: 55.00 of 79.60 GiB" in memory_verdict(search_says, None)
    assert memory_verdict({}, under) == ""
    alone = memory_verdict({"mem_limit_gib": 79.6}, over)  # no search figure to set beside it
    assert alone == " (the cost model put it at 81.20 GiB, over the 79.60 GiB limit)"
