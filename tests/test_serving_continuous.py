"""Continuous batching: the mixed-iteration time against the static model, paged K/V capacity
by hand, the max-load steady state, and the scheduler simulation against both."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autoconfig.columns.build import serving_inputs
from autoconfig.cost.inference import serve_time
from autoconfig.cost.kv_cache import kv_capacity
from autoconfig.cost.max_load import BOUNDS, max_load
from autoconfig.cost.serving_sim import Limits, Trace, poisson_arrivals, simulate
from autoconfig.cost.serving_step import step_model, take
from autoconfig.serve.disaggregate import _split
from autoconfig.spec import catalog
from autoconfig.spec.vocab import GIB


def inputs(model: str = "llama3-70b", gpu: str = "h100-sxm-80gb", **cols):
    spec, g = catalog.get_model(model), catalog.get_gpu(gpu)
    base = {
        "tp": 4.0,
        "pp": 1.0,
        "batch_size": 1.0,
        "input_len": 1000.0,
        "output_len": 200.0,
        "replicas": 1.0,
        "precision": "fp8",
        "kv_precision": "fp8",
    }
    n = max((len(v) for v in cols.values() if isinstance(v, list)), default=1)
    frame = pd.DataFrame({**base, **cols}, index=range(n))
    return serving_inputs(spec, (g, g.cluster), frame)


def limits(n: int, cap, **overrides) -> Limits:
    base = dict(
        rate=np.ones(n),
        max_seqs=np.full(n, 256.0),
        max_tokens=np.full(n, 8192.0),
        kv_tokens=np.broadcast_to(cap.tokens[:n], (n,)).astype(float),
        block_tokens=np.full(n, 16.0),
        static=np.zeros(n),
        prefill_only=np.zeros(n),
        prompt_cached=np.zeros(n),
    )
    base.update({k: np.asarray(v, float) for k, v in overrides.items()})
    return Limits(**base)


def test_a_decode_iteration_is_the_static_models_decode_step() -> None:
    """One decoding sequence at the static model's mean context costs what the static
    model's decode step costs: both read the same op list, and add the engine's host work
    for the step and its one sequence."""
    s = inputs(tp=[1.0, 4.0, 8.0], precision="bf16", kv_precision="bf16")
    step = step_model(s)
    context = 1000.0 + 200.0 / 2
    one = step.stage(1.0, 0.0, 0.0, context, 1.0)
    static = serve_time(s).decode_stage.total + s.iteration_s + s.sequence_s
    assert one == pytest.approx(static, rel=0.02)


def test_kv_capacity_by_hand() -> None:
    """llama3-70b, tp 8, fp8 K/V: one token is K and V of one of 8 K/V heads of 128 over 80
    layers, 1 byte each = 20,480 bytes per GPU; the cache is the kv fraction of what the
    weights, one full iteration and the reserve leave, in whole 16-token blocks."""
    s = inputs(tp=8.0)
    cap = kv_capacity(s)
    assert cap.token_bytes[0] == pytest.approx(2 * 1 * 128 * 80 * 1)
    gpu = catalog.get_gpu("h100-sxm-80gb")
    free = gpu.memory_gib * GIB - cap.weights - cap.activations - cap.reserved
    expected = np.floor(0.9 * free / 20480 / 16) * 16
    assert cap.tokens[0] == pytest.approx(expected[0])
    # fp8 weights of a 70B model on 8 GPUs: about 70.6e9 / 8 bytes
    assert cap.weights[0] / 1e9 == pytest.approx(70.6 / 8, rel=0.03)


def test_max_load_bounds_and_batch_growth() -> None:
    seqs = [8.0, 64.0, 256.0, 4096.0]
    s = inputs(max_seqs=seqs)
    load = max_load(s, step_model(s), kv_capacity(s))
    bounds = [BOUNDS[int(b)] for b in load.bound]
    assert bounds[0] == "max-num-seqs" and bounds[-1] == "kv-cache"
    assert load.running[-1] < 4096  # the cache, not the limit, holds the batch
    tput = load.output_tokens_per_s
    assert (np.diff(tput) >= -1e-9).all()  # a bigger batch never serves less
    assert (np.diff(load.tpot_s) >= -1e-12).all()  # but each token comes later


def test_simulated_max_load_matches_the_steady_state() -> None:
    """All requests at once (an offline benchmark): the simulated throughput is the
    analytic steady state's within a few percent (ramp-up and drain are the difference)."""
    s = inputs(tp=[4.0, 8.0, 2.0], max_seqs=[256.0, 256.0, 128.0])
    step, cap = step_model(s), kv_capacity(s)
    load = max_load(s, step, cap)
    r = 1500
    trace = Trace(np.zeros(r), np.full(r, 1000.0), np.full(r, 200.0))
    sim = simulate(step, trace, limits(3, cap, max_seqs=[256.0, 256.0, 128.0]))
    assert (sim.finished == 1.0).all()
    simulated = r * 200.0 / sim.makespan
    assert simulated == pytest.approx(load.output_tokens_per_s, rel=0.06)


def test_jumped_runs_are_exact() -> None:
    """Runs of identical iterations jumped whole give the same times as stepping them."""
    s = inputs(tp=[4.0, 2.0], pp=[1.0, 2.0])
    step, cap = step_model(s), kv_capacity(s)
    rng = np.random.default_rng(3)
    r = 80
    trace = Trace(
        poisson_arrivals(r, 1),
        rng.integers(100, 3000, r).astype(float),
        rng.integers(1, 300, r).astype(float),
    )
    lim = limits(2, cap, rate=[4.0, 3.0], max_tokens=[2048.0, 1024.0], max_seqs=[32.0, 8.0])
    fast = simulate(step, trace, lim)
    slow = simulate(step, trace, lim, jumps=False)
    assert fast.steps < slow.steps
    np.testing.assert_allclose(fast.ttft, slow.ttft, rtol=1e-9)
    np.testing.assert_allclose(fast.latency, slow.latency, rtol=1e-9)


def test_queueing_grows_with_the_rate_and_light_load_is_one_request_alone() -> None:
    s = inputs()
    step, cap = step_model(s), kv_capacity(s)
    load = max_load(s, step, cap)
    r = 200
    trace = Trace(poisson_arrivals(r, 0), np.full(r, 1000.0), np.full(r, 200.0))
    fractions = np.array([0.02, 0.4, 0.8, 1.3])
    rates = fractions * load.requests_per_s[0]
    sim = simulate(take(step, np.zeros(4, int)), trace, limits(4, cap, rate=rates))
    p90 = sim.percentiles(sim.ttft)[:, 1]
    assert (np.diff(p90) > 0).all()
    # At 2% of capacity requests rarely overlap: TTFT is one prefill, TPOT one decode step.
    alone_ttft = step.stage(1000.0, 1000.0 * 1001 / 2, 1000.0, 0.0, 1.0)[0]
    assert np.median(sim.ttft[0]) == pytest.approx(alone_ttft, rel=0.25)
    alone_tpot = step.stage(1.0, 0.0, 0.0, 1100.0, 1.0)[0]
    assert np.median(sim.tpot[0]) == pytest.approx(alone_tpot, rel=0.25)


def test_admission_waits_for_kv_blocks_and_static_batches_wait_for_each_other() -> None:
    s = inputs(tp=[4.0, 4.0, 4.0])
    step, cap = step_model(s), kv_capacity(s)
    r = 12
    trace = Trace(np.zeros(r), np.full(r, 500.0), np.full(r, 100.0))
    two = 2 * 608.0  # two requests of 600 tokens in 16-token blocks
    lim = limits(
        3,
        cap,
        kv_tokens=[two, 100 * two, 100 * two],
        static=[0.0, 0.0, 1.0],
        max_seqs=[256.0, 256.0, 4.0],
    )
    sim = simulate(step, trace, lim)
    first = np.sort(sim.ttft, axis=1)
    # Only two fit at once: first tokens come in pairs, a whole generation apart.
    gaps = np.diff(first[0])
    assert (gaps[0:10:2] < 0.1 * gaps[1:11:2]).all()
    # Static batches of 4: the next batch starts only after the last one finished.
    latency = np.sort(sim.latency[2])
    assert (first[2][4:8] > latency[3]).all()
    # A request larger than the whole cache never finishes, and the row stops.
    tiny = simulate(take(step, np.array([0])), trace, limits(1, cap, kv_tokens=[256.0]))
    assert tiny.finished[0] == 0.0


def test_disaggregated_roles() -> None:
    """A prefill instance hands requests off after their first token; a decode instance
    never computes a prompt."""
    s = inputs(tp=[4.0, 4.0, 4.0])
    step, cap = step_model(s), kv_capacity(s)
    r = 40
    trace = Trace(poisson_arrivals(r, 2), np.full(r, 2000.0), np.full(r, 100.0))
    lim = limits(3, cap, rate=[2.0] * 3, prefill_only=[0, 1, 0], prompt_cached=[0, 0, 1])
    sim = simulate(step, trace, lim)
    np.testing.assert_allclose(sim.latency[1], sim.ttft[1])  # done at the first token
    assert np.nanmedian(sim.ttft[2]) < 0.5 * np.nanmedian(sim.ttft[0])  # no prompt to compute


def test_pool_split_is_the_best_of_every_split_on_any_cluster_size() -> None:
    """The prefill/decode instance counts that maximise min(x g_p, y g_d) on `total` GPUs:
    the bisection agrees with trying every x, and a cluster of 2^40 GPUs takes no longer."""
    rng = np.random.default_rng(7)
    for _ in range(3000):
        total = int(rng.integers(1, 400))
        p_gpus, d_gpus = (float(rng.choice([1, 2, 4, 8])) for _ in range(2))
        g_p, g_d = (float(v) for v in rng.uniform(0.1, 5.0, 2))
        tried = [
            (x, int((total - x * p_gpus) // d_gpus)) for x in range(1, int(total // p_gpus) + 1)
        ]
        tried = [(x, y, min(x * g_p, y * g_d)) for x, y in tried if y >= 1]
        best = max(tried, key=lambda t: t[2], default=None)
        got = _split(total, p_gpus, d_gpus, g_p, g_d)
        if best is None:
            assert got is None
        else:
            assert got is not None and got[2] == pytest.approx(best[2], rel=1e-12)
            assert got[0] * p_gpus + got[1] * d_gpus <= total
    x, y, goodput = _split(2**40, 8.0, 1.0, 3.0, 1.0)
    assert x * 8 + y <= 2**40 and goodput == pytest.approx(3.0 * 2**40 / 11.0, rel=1e-9)
