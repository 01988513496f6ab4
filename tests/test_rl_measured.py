"""The measured CPU RL loop (autoconfig/measure/rl_loop.py): its phases are timed and behave as
their work says, the sync leaves the engine equal to the policy bit for bit, the GRPO loss moves
the policy toward the rewarded tokens, the planner is asked about the same shapes the loop ran,
the fit recovers constants it is given, and `autoconfig rl-measure` refuses bad input with one
line naming the field (exit 2)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from autoconfig.base.errors import UserError
from autoconfig.cli.app import execute
from autoconfig.measure import rl_loop
from autoconfig.measure.rl_loop import PHASES, LoopConfig, RLLoop

# Two layers keep every loop here well under a second on one core.
TINY = LoopConfig(layers=2, prompts=2, samples=4, prompt_len=16, max_response_len=8, steps=2)


def test_phases_positive_and_rollout_grows_with_length() -> None:
    short = rl_loop.run_loop(TINY).phases()
    long = rl_loop.run_loop(replace(TINY, max_response_len=120)).phases()
    for phases in (short, long):
        assert all(phases[p] > 0 for p in PHASES), phases
    # fifteen times the decode iterations: the rollout must take clearly longer
    assert long["rollout_s"] > 2.0 * short["rollout_s"], (short, long)
    # and the update runs over sequences 5.7x as long (136 tokens against 24): a margin no
    # neighbour's load on a shared core erases
    assert long["update_s"] > short["update_s"], (short, long)


def test_sync_makes_the_engine_equal_the_policy_bit_for_bit() -> None:
    loop = RLLoop(TINY)
    tokens, responses = loop.rollout(0)
    seqs = [torch.cat([p, r]) for p, r in zip(tokens, responses, strict=True)]
    old, ref = loop.logprobs(seqs)
    adv = rl_loop.advantages(rl_loop.rewards_of(responses, loop.spec.vocab), TINY.samples)
    loop.update(seqs, old, ref, adv)
    assert not loop.synced(), "the update changed nothing the engine would need"
    loop.sync()
    assert loop.synced()
    engine = dict(loop.engine.named_parameters())
    for name, p in loop.policy.named_parameters():
        assert torch.equal(p.detach(), engine[name]), name
    records = rl_loop.run_loop(TINY).records
    assert all(r.synced for r in records)


def test_responses_have_the_drawn_lengths_and_rewards_are_shares() -> None:
    cfg = replace(TINY, max_response_len=24, mean_response_len=8)
    loop = RLLoop(cfg)
    _, responses = loop.rollout(0)
    assert [len(r) for r in responses] == loop.lengths.tolist()
    assert len(set(loop.lengths.tolist())) > 1  # drawn, not fixed
    assert loop.lengths.max() <= 24
    rewards = rl_loop.rewards_of(responses, loop.spec.vocab)
    assert ((rewards >= 0) & (rewards <= 1)).all()


def test_group_normalised_advantages() -> None:
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.5, 0.2, 0.4, 0.6, 0.8])
    adv = rl_loop.advantages(rewards, 4).view(2, 4)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(adv.std(dim=1, unbiased=False), torch.ones(2), atol=1e-4)
    assert adv[0, 1] > 0 > adv[0, 0]
    same = rl_loop.advantages(torch.full((4,), 0.3), 4)
    assert torch.equal(same, torch.zeros(4))  # one reward for the whole group: no signal


def _advantage_weighted_logprob(loop: RLLoop, seqs, adv) -> float:
    """sum_i A_i log p(response_i): what the policy-gradient term of the GRPO loss climbs."""
    with torch.no_grad():
        logps = [loop._response_logprobs(loop.policy, s, loop.cfg.prompt_len) for s in seqs]
    return float(sum(a * lp.sum() for a, lp in zip(adv, logps, strict=True)))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_grpo_update_climbs_toward_higher_advantage(sign: float) -> None:
    """One update raises the log-probs of the responses rewarded above their group and lowers
    the others' (and, with the advantages negated, the reverse: the sign is the loss's)."""
    loop = RLLoop(replace(TINY, lr=1e-3, kl_coef=0.0))
    tokens, responses = loop.rollout(0)
    seqs = [torch.cat([p, r]) for p, r in zip(tokens, responses, strict=True)]
    old, ref = loop.logprobs(seqs)
    adv = sign * rl_loop.advantages(rl_loop.rewards_of(responses, loop.spec.vocab), 4)
    assert adv.abs().sum() > 0  # the groups' rewards differ
    before = _advantage_weighted_logprob(loop, seqs, adv)
    loop.update(seqs, old, ref, adv)
    assert loop.grad_norm() > 0
    after = _advantage_weighted_logprob(loop, seqs, adv)
    assert after > before, (before, after)


def test_a_few_steps_move_the_reward_the_way_the_loss_says(monkeypatch) -> None:
    """Over eight steps, training toward the reward ends with more rewarded tokens than
    training away from it (the same seeds: the same prompts and sampling draws, so only the
    updates differ)."""
    cfg = replace(TINY, lr=1e-2, prompts=4, samples=4, max_response_len=16, steps=8, warmup=0)
    up = [r.reward for r in rl_loop.run_loop(cfg).records]
    share = rl_loop.rewards_of
    monkeypatch.setattr(rl_loop, "rewards_of", lambda r, vocab: 1.0 - share(r, vocab))
    down = [1.0 - r.reward for r in rl_loop.run_loop(cfg).records]
    assert up[0] == pytest.approx(down[0])  # the first rollout precedes any update
    assert np.mean(up[-2:]) > np.mean(down[-2:]) + 0.03, (up, down)


def test_the_planner_is_asked_about_the_shapes_the_loop_ran(monkeypatch) -> None:
    seen: dict[str, object] = {}
    real_rollouts, real_updates = rl_loop.rollouts, rl_loop.updates

    def rollouts(job, tps, gpus, staleness):
        seen["rollout"] = (job, tps, gpus, staleness)
        return real_rollouts(job, tps, gpus, staleness)

    def updates(job, layouts, gpus):
        seen["update"] = (job, layouts, gpus)
        return real_updates(job, layouts, gpus)

    monkeypatch.setattr(rl_loop, "rollouts", rollouts)
    monkeypatch.setattr(rl_loop, "updates", updates)
    cfg = replace(TINY, max_response_len=24, mean_response_len=8)
    rl_loop.predict(cfg)
    loop = RLLoop(cfg)
    for key in ("rollout", "update"):
        job = seen[key][0]
        assert job.model.layers == 2 and job.model.hidden == loop.spec.hidden
        assert (job.prompts, job.samples, job.prompt_tokens) == (2, 4, 16)
        assert job.sequences == len(loop.lengths)
        assert job.reference is cfg.reference
        # the planner's stratified lengths are the loop's, whole tokens
        planned = np.ceil(job.lengths.stratified(job.sequences))
        assert sorted(planned.tolist()) == sorted(loop.lengths.tolist())
    assert seen["rollout"][1:] == ([1], [1], [0])  # one engine, tp 1, on-policy
    assert seen["update"][2] == 1 and seen["update"][1][0].model_parallel == 1


def test_constants_move_the_predictions() -> None:
    cfg = replace(TINY, max_response_len=32)
    base = rl_loop.predict(cfg)
    faster = rl_loop.predict(cfg, {"peak_tflops": 0.4, "memory_gb_s": 200.0})
    for phase in ("rollout_s", "logprob_s", "update_s"):
        assert faster[phase] < base[phase], phase
    assert rl_loop.predict(cfg, {"sync_fixed_s": 0.0})["sync_s"] < 0.1 < base["sync_s"]


def test_fit_recovers_constants_it_is_given() -> None:
    configs = [
        replace(TINY, max_response_len=8),
        replace(TINY, max_response_len=32, prompts=4),
        replace(TINY, layers=4, max_response_len=16, mean_response_len=6),
    ]
    truth = {
        "peak_tflops": 0.15,
        "memory_gb_s": 40.0,
        "kernel_us": 12.0,
        "step_overhead_ms": 8.0,
        "serve_kernel_us": 30.0,
        "sync_fixed_s": 0.002,
    }
    measured = [rl_loop.predict(c, truth) for c in configs]
    fitted = rl_loop.fit(configs, measured)
    for cfg, meas in zip(configs, measured, strict=True):
        pred = rl_loop.predict(cfg, fitted.values)
        for phase in PHASES:
            assert pred[phase] == pytest.approx(meas[phase], rel=0.02), (cfg.label(), phase)
    for name, (_, _, lo, hi, _) in rl_loop.CONSTANTS.items():
        assert lo * 0.999 <= fitted.values[name] <= hi * 1.001, name


def test_config_strings_and_bad_fields() -> None:
    cfg = rl_loop.parse_config("prompts=2, samples=3, max-response-len=16", "fit", steps=1)
    assert (cfg.prompts, cfg.samples, cfg.max_response_len, cfg.steps) == (2, 3, 16, 1)
    for text, word in (
        ("prompts=0", "prompts"),
        ("color=red", "color"),
        ("prompts", "key=value"),
        ("prompts=two", "prompts"),
        ("mean-response-len=99,max-response-len=16", "mean-response-len"),
        ("max-response-len=5000", "max-response-len"),
        ("model=tiny-moe", "MoE"),
    ):
        with pytest.raises(UserError, match=word) as err:
            rl_loop.parse_config(text, "fit")
        assert str(err.value).startswith("fit: ")


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--fit", "prompts=0"], "fit"),
        (["--held-out", "samples=x"], "held-out"),
        (["--steps", "0"], "steps"),
        (["--threads", "-1"], "threads"),
    ],
)
def test_rl_measure_bad_input_exits_2(flags, field, capsys) -> None:
    assert execute(["rl-measure", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0], err


def test_rl_measure_out_must_be_a_folder(tmp_path, capsys) -> None:
    path = tmp_path / "file.txt"
    path.write_text("x")
    assert execute(["rl-measure", "--out", str(path)]) == 2
    assert "out" in capsys.readouterr().err


def test_rl_measure_writes_the_table(tmp_path, capsys) -> None:
    out = tmp_path / "rl"
    code = execute(
        [
            "rl-measure",
            "--fit",
            "layers=2,prompts=2,samples=2,prompt-len=8,max-response-len=6",
            "--fit",
            "layers=2,prompts=2,samples=4,prompt-len=8,max-response-len=12",
            "--held-out",
            "layers=2,prompts=4,samples=2,prompt-len=8,max-response-len=8",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "held out" in text and "sync_fixed_s" in text
    rows = (out / "rl_phases.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * len(PHASES)
    assert (out / "rl_fit.json").exists()
