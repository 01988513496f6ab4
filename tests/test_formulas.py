"""Hand-computed cases from the papers the cost model cites."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from helpers import make_inputs

from autoconfig.cost import comm, evaluate, kernel_time
from autoconfig.cost.flops import model_flops_per_token
from autoconfig.cost.kernel_time import NO_KERNELS
from autoconfig.cost.layer import layer_ops, mlp_ops, op_level_sac_bytes
from autoconfig.cost.memory import in_flight, layer_activation_bytes, state_bytes
from autoconfig.cost.timing import _fwd_bwd, _op_time, _op_times, step_time, wave_utilization
from autoconfig.spec import catalog

S, B = 2048, 1
H, A = 12288, 96  # GPT-3 175B


def _korthikanti(tp: int, sp: bool, recompute: int) -> float:
    """Per-layer activation bytes, Korthikanti et al. 2022, Table 2."""
    sbh = S * B * H
    scores = 5 * A * S / H
    if recompute == 2:
        return 2 * sbh / (tp if sp else 1)
    if recompute == 1:
        return 34 * sbh / tp if sp else sbh * (10 + 24 / tp)
    if sp:
        return sbh / tp * (34 + scores)
    return sbh * (10 + 24 / tp + scores / tp)


LAYOUTS = [(1, False), (2, False), (8, False), (2, True), (8, True)]  # (tp, sp)


@pytest.mark.parametrize(("tp", "sp"), LAYOUTS)
@pytest.mark.parametrize("recompute", [0, 1, 2])
def test_gpt_activations_match_korthikanti(tp: int, sp: bool, recompute: int) -> None:
    x = make_inputs("gpt3-175b", tp=tp, sp=float(sp), flash=0.0, dropout=1.0, mbs=B, seq=S)
    plain, selective, full, _ = layer_activation_bytes(x, np.float64(S * B))
    got = (plain, selective, full)[recompute]
    # LayerNorm keeps 8 bytes of fp32 statistics per token per norm, which the paper ignores.
    assert float(got) == pytest.approx(_korthikanti(tp, sp, recompute), rel=1e-3)


def test_flash_attention_removes_the_quadratic_term() -> None:
    unfused = make_inputs("gpt3-175b", flash=0.0, dropout=1.0)
    flash = make_inputs("gpt3-175b", flash=1.0, dropout=1.0)
    plain_unfused = layer_activation_bytes(unfused, np.float64(S))[0]
    plain_flash = layer_activation_bytes(flash, np.float64(S))[0]
    quadratic = 5 * A * S * S
    # flash keeps a 4-byte log-sum-exp per head per token instead of the scores
    assert float(plain_unfused - plain_flash) == pytest.approx(quadratic - 4 * A * S, rel=1e-9)


def test_mixed_precision_adam_is_18_bytes_per_param() -> None:
    # Without ZeRO every rank holds bf16 weights, fp32 gradients and 12 bytes of Adam state.
    w, g, o = state_bytes(make_inputs(zero=0.0), np.float64(1.0), np.float64(64.0))
    assert float(w + g + o) == 18.0


@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_distributed_optimizer_is_6_plus_12_over_d(d: int) -> None:
    w, g, o = state_bytes(make_inputs(zero=1.0), np.float64(1.0), np.float64(d))
    assert float(w + g + o) == pytest.approx(6 + 12 / d)


def test_zero3_shards_everything() -> None:
    w, g, o = state_bytes(make_inputs(zero=3.0), np.float64(1.0), np.float64(8.0))
    assert float(w + g + o) == pytest.approx(18 / 8)


def test_fp8_parameters_halve_the_working_copy() -> None:
    w, _, _ = state_bytes(make_inputs(zero=1.0, param_bytes=1.0), np.float64(1.0), np.float64(8.0))
    assert float(w) == 1.0


@pytest.mark.parametrize(("p", "m", "expected"), [(4, 16, 4), (8, 3, 3), (1, 8, 1)])
def test_one_f_one_b_first_stage_holds_min_m_p(p: int, m: int, expected: int) -> None:
    x = make_inputs("gpt3-175b", pp=p, dp=1, mbs=1, gbs=m)
    assert float(in_flight(x, np.float64(0.0))) == expected


@pytest.mark.parametrize(("p", "v"), [(4, 2), (8, 3), (16, 2)])
def test_interleaved_first_stage_factor(p: int, v: int) -> None:
    x = make_inputs("gpt3-175b", pp=p, vp=v, dp=1, mbs=1, gbs=256)
    assert float(in_flight(x, np.float64(0.0))) == pytest.approx(p * (1 + (p - 1) / (p * v)))


@pytest.mark.parametrize(("p", "v", "m"), [(4, 1, 16), (8, 2, 32), (2, 3, 8)])
def test_bubble_fraction(p: int, v: int, m: int) -> None:
    x = make_inputs("gpt3-175b", pp=p, vp=v, dp=1, mbs=1, gbs=m, tp=8, sp=1.0)
    t = step_time(x)
    busy = t.compute + t.launch + t.tp_comm
    assert float(t.bubble / busy) == pytest.approx((p - 1) / (v * m), rel=1e-9)


@pytest.mark.parametrize("n", [2, 8, 64])
def test_ring_all_reduce_volume(n: int) -> None:
    link = comm.Link(np.float64(100e9), np.float64(0.0))
    nbytes = np.float64(1e9)
    assert float(comm.all_reduce(nbytes, np.float64(n), link)) == pytest.approx(
        2 * (n - 1) / n * 1e9 / 100e9
    )
    assert float(comm.all_gather(nbytes, np.float64(n), link)) == pytest.approx(
        (n - 1) / n * 1e9 / 100e9
    )


def test_tp_group_crossing_a_node_uses_the_network() -> None:
    inside = comm.tp_link(make_inputs(tp=8))
    across = comm.tp_link(make_inputs(tp=16))
    assert float(across.bandwidth) < float(inside.bandwidth)


def test_model_flops_match_narayanan_formula() -> None:
    spec = catalog.get_model("gpt3-175b")
    x = make_inputs("gpt3-175b", tp=8)
    layers, h, s, v = spec.layers, spec.hidden, 2048, spec.vocab
    expected = 72 * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    assert float(model_flops_per_token(x)) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama3-8b", 8.03),
        ("llama2-70b", 68.98),
        ("gpt3-175b", 174.6),
        ("llama3-405b", 405.9),
        ("mixtral-8x7b", 46.7),
    ],
)
def test_catalog_parameter_counts(name: str, billions: float) -> None:
    assert catalog.get_model(name).param_count() / 1e9 == pytest.approx(billions, rel=0.01)


def test_mixtral_active_parameters() -> None:
    assert catalog.get_model("mixtral-8x7b").param_count(active_only=True) / 1e9 == (
        pytest.approx(12.9, rel=0.02)
    )


def test_fits_compares_peak_with_capacity() -> None:
    out = evaluate(make_inputs("gpt3-175b", tp=1, dp=1))
    assert not bool(out["pred_fits"][0])  # 175B on one GPU cannot fit
    assert float(out["pred_peak_mem_gib"][0]) > 175e9 * 18 / 2**30


def test_op_level_checkpointing_keeps_input_attention_and_half_the_matmuls() -> None:
    spec = catalog.get_model("llama3-8b")
    x = make_inputs("llama3-8b", gpu="h100-sxm-80gb", flash=1.0, seq=8192)
    _, _, _, op_level = layer_activation_bytes(x, np.float64(1.0))
    h, q, kv, f = spec.hidden, spec.heads * spec.dhead, spec.kv * spec.dhead, spec.ffn
    matmul_outputs = 2 * ((q + 2 * kv) + h + 2 * f + h)  # qkv, out, gate+up, down
    expected = 2 * h + (2 * q + 4 * spec.heads) + matmul_outputs / 2
    assert float(op_level) == pytest.approx(expected, rel=1e-6)


def test_a_dense_layer_pays_nothing_for_gemms_it_lacks() -> None:
    """A dense model's expert, router, latent and Mamba GEMMs keep their shapes but have no
    FLOPs: they take no time. Their activation traffic once did, which, not being split by
    tensor parallelism, made a wide-TP layer look slower than it is."""
    x = make_inputs("llama3-8b", gpu="h100-sxm-80gb", tp=8, sp=1.0, mbs=1, seq=4096)
    absent = [op for op in layer_ops(x) if op.kind == "gemm" and not op.present.any()]
    assert {"router", "expert_up", "expert_down"} <= {op.name for op in absent}
    for op in absent:
        assert float(_op_time(x, op, np.float64(4096.0))) == 0.0


@pytest.mark.parametrize(
    ("tokens", "n", "sms", "busy"),
    [
        (4096, 256, 132, 32 / 132),  # 32 x 1 tiles of 128 tokens x 256: a quarter of H100
        (128 * 132, 256, 132, 1.0),  # exactly one full wave
        (128 * 133, 256, 132, 133 / 264),  # one tile too many: a second wave, nearly empty
        (4096, 256, 0, 1.0),  # no SM count (a CPU profile): not modelled
    ],
)
def test_a_gemms_output_tiles_run_in_waves_over_the_sms(tokens, n, sms, busy) -> None:
    assert float(wave_utilization(np.float64(tokens), np.float64(n), np.float64(sms))) == (
        pytest.approx(busy)
    )


def _constants_only(x):
    """`x` timed by its profile's efficiency constants, as a GPU without kernel tables is."""
    return replace(x, kernels=NO_KERNELS)


def test_fused_qkv_counts_its_tiles_once() -> None:
    """Standard attention's q and k/v projections are one fused kernel: both are charged the
    waves of the fused width, not each the waves of its own narrower part."""
    x = _constants_only(make_inputs("llama3-8b", gpu="h100-sxm-80gb", tp=8, sp=1.0, seq=2048))
    ops = {op.name: op for op in layer_ops(x)}
    fused = float(ops["q_proj"].gemm_n) + float(ops["kv_proj"].gemm_n)
    tokens = np.float64(2048.0)
    for name in ("q_proj", "kv_proj"):
        assert float(ops[name].kernel_n) == pytest.approx(fused)
    both = sum(float(_op_time(x, ops[n], tokens)) for n in ("q_proj", "kv_proj"))
    flops = (float(ops["q_proj"].flops) + float(ops["kv_proj"].flops)) * 2048.0
    share = float(wave_utilization(tokens, np.float64(fused), np.float64(132.0)))
    assert both == pytest.approx(flops / (float(x.peak_flops) * float(x.eff_gemm) * share))


def test_a_small_micro_batch_under_wide_tp_leaves_sms_idle() -> None:
    """llama3-8b at tp 8 on H100: one 4,096-token sequence makes too few output tiles to fill
    the 132 SMs, so its compute-bound GEMMs take longer per token than an 8-sequence
    micro-batch's (by more than 5%); with no SM count per token is the same."""
    for sms, expect_slower in ((132.0, True), (0.0, False)):
        x = make_inputs("llama3-8b", gpu="h100-sxm-80gb", tp=8, sp=1.0, seq=4096, sms=sms)
        x = _constants_only(x)
        gemms = [op for op in layer_ops(x) if op.kind == "gemm" and op.present.all()]
        small, large = np.float64(4096.0), np.float64(8 * 4096.0)
        per_token_small = sum(float(_op_time(x, op, small)) for op in gemms) / 4096
        per_token_large = sum(float(_op_time(x, op, large)) for op in gemms) / (8 * 4096)
        if expect_slower:
            assert per_token_small > 1.05 * per_token_large
        else:
            assert per_token_small == pytest.approx(per_token_large, rel=0.02)


def test_fused_qkv_runs_at_the_fused_kernels_measured_rate() -> None:
    """With the chip's kernel tables, q and k/v are charged the rate the table gives the one
    fused kernel (tokens x fused width x hidden), each for its own FLOPs; backward looks up
    the input-gradient and weight-gradient shapes."""
    x = make_inputs("llama3-8b", gpu="h100-sxm-80gb", tp=8, sp=1.0, seq=2048)
    ops = {op.name: op for op in layer_ops(x)}
    fused = float(ops["q_proj"].kernel_n)
    k = float(ops["q_proj"].gemm_k)
    tokens = np.float64(2048.0)
    eff = kernel_time.gemm_efficiency(x.kernels, x.kernel_chip, x.gemm_bytes, tokens, fused, k)
    dgrad = kernel_time.gemm_efficiency(x.kernels, x.kernel_chip, x.gemm_bytes, tokens, k, fused)
    wgrad = kernel_time.gemm_efficiency(x.kernels, x.kernel_chip, x.gemm_bytes, k, fused, tokens)
    for name in ("q_proj", "kv_proj"):
        flops = float(ops[name].flops) * 2048.0
        fwd, bwd = _op_times(x, ops[name], tokens)
        assert float(fwd) == pytest.approx(flops / (float(x.peak_flops) * float(eff)), rel=1e-4)
        expected = flops / float(x.peak_flops) * (1 / float(dgrad) + 1 / float(wgrad))
        assert float(bwd) == pytest.approx(expected, rel=1e-4)
    # the table's rate is not the fitted constant's
    assert float(eff) != pytest.approx(float(x.eff_gemm), rel=0.01)


def test_a_small_micro_batch_under_wide_tp_runs_slower_in_the_measured_kernels() -> None:
    """llama3-8b at tp 8 on H100 from its kernel tables: one 2,048-token sequence runs its
    GEMMs slower per token than an 8-sequence micro-batch (the measured kernels fill the SMs
    worse), by more than 5%."""
    x = make_inputs("llama3-8b", gpu="h100-sxm-80gb", tp=8, sp=1.0, seq=2048)
    gemms = [op for op in layer_ops(x) if op.kind == "gemm" and op.present.all()]
    small, large = np.float64(2048.0), np.float64(8 * 2048.0)
    per_token_small = sum(float(sum(_op_times(x, op, small))) for op in gemms) / 2048
    per_token_large = sum(float(sum(_op_times(x, op, large))) for op in gemms) / (8 * 2048)
    assert per_token_small > 1.05 * per_token_large


def test_a_dense_layers_gpu_time_splits_over_tp_with_sp() -> None:
    """With sequence parallelism every op of a dense layer is split over tp: one rank's GPU
    time at tp 8 is within 20% of an eighth of tp 1's (the GEMMs' unsplit input and output
    widths add a little traffic)."""
    times = []
    for tp in (1, 8):
        x = make_inputs("llama3-8b", gpu="h100-sxm-80gb", tp=tp, sp=float(tp > 1), seq=4096)
        fwd, bwd = _fwd_bwd(x, layer_ops(x), np.float64(4096.0))
        times.append(float(fwd + bwd))
    assert times[1] == pytest.approx(times[0] / 8, rel=0.2)


def _routed_flops(x) -> float:
    return float(sum(np.asarray(op.flops) for op in mlp_ops(x) if op.routed))


def test_tp_ranks_share_the_routed_expert_work_whatever_etp() -> None:
    """Each tp rank routes its own 1/tp of the tokens (Megatron-Core's dispatcher sends a
    rank's sequence shard); with whole experts (etp 1) or experts split over tp (etp = tp) a
    rank's routed FLOPs are 1/tp of the micro-batch's, never the whole micro-batch's."""
    one = _routed_flops(make_inputs("mixtral-8x7b", tp=1, dp=8, ep=8, etp=1))
    for etp in (1, 2):
        x = make_inputs("mixtral-8x7b", tp=2, dp=4, ep=4 if etp == 2 else 8, etp=etp)
        assert _routed_flops(x) == pytest.approx(one / 2, rel=1e-12)


def test_expert_dispatch_sends_each_tp_rank_its_own_tokens() -> None:
    """Folding ep over tp (etp 1) halves each rank's dispatched tokens at tp 2: per
    micro-batch, the same all-to-all over the same 8 ranks inside a node moves half the
    bytes of tp 1's (large micro-batches: the fixed latency per call is under 3%)."""
    common = {"gpu": "h100-sxm-80gb", "ep": 8, "etp": 1, "mbs": 8, "seq": 8192, "gbs": 64}
    per_mb = []
    for tp in (1, 2):
        dp = 8 // tp
        t = step_time(make_inputs("mixtral-8x7b", tp=tp, dp=dp, **common))
        per_mb.append(float(t.ep_comm) / (64 / (dp * 8)))
    assert per_mb[1] == pytest.approx(per_mb[0] / 2, rel=0.03)


def test_expert_dispatch_replaces_the_moe_layers_tp_collective() -> None:
    """With expert parallelism the dispatch (all-to-all, then the etp group's gather of routed
    copies) is the MoE layer's communication: raising etp from 1 to tp adds that gather to the
    EP time but no tensor-parallel collective pair for the experts (mixtral has no shared
    experts, so its MoE layers keep none)."""
    common = {"tp": 2, "dp": 4, "mbs": 1, "seq": 4096, "gbs": 64}
    whole = step_time(make_inputs("mixtral-8x7b", ep=4, etp=1, **common))
    split = step_time(make_inputs("mixtral-8x7b", ep=4, etp=2, **common))
    assert float(split.tp_comm) == pytest.approx(float(whole.tp_comm), rel=1e-9)
    assert float(split.ep_comm) > float(whole.ep_comm)


def test_op_level_checkpointing_keeps_a_ranks_share_of_the_routed_outputs() -> None:
    """torchtitan's op-level checkpointing keeps matmul outputs; a tp rank's routed expert
    outputs are 1/tp of the micro-batch's whatever etp (as mlp_ops counts them)."""
    common = {"tp": 2, "dp": 4, "ep": 4}
    whole = op_level_sac_bytes(make_inputs("mixtral-8x7b", etp=1, **common))
    split = op_level_sac_bytes(make_inputs("mixtral-8x7b", etp=2, **common))
    assert float(whole) == pytest.approx(float(split), rel=1e-12)


def test_a_rank_routes_the_tokens_it_holds() -> None:
    """With sequence parallelism a tp rank holds and routes 1/tp of the tokens; without it
    (serving) every rank sees every token, so its router and latent projection run on all of
    them while the routed expert work stays 1/tp."""

    def per_op(model: str, sp: int) -> dict[str, float]:
        x = make_inputs(model, tp=4, dp=2, ep=1, etp=4, sp=sp)
        return {op.name: float(np.asarray(op.flops)) for op in mlp_ops(x)}

    for model, op in (("mixtral-8x7b", "router"), ("nemotron-3-super", "latent_proj")):
        held, every = per_op(model, 1), per_op(model, 0)
        assert every[op] == pytest.approx(4 * held[op], rel=1e-12) and held[op] > 0
        assert every["expert_up"] == pytest.approx(held["expert_up"], rel=1e-12)


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        # two fp32 norm inputs (+2 bytes each), k and v's own bf16 casts (+2 each), and the
        # gate's cast of the MLP input (+2) under SwiGLU; LayerNorm + GELU lacks the gate's
        ("llama3-8b", 10),
        ("gpt3-1.3b", 8),
    ],
)
def test_autocast_over_fp32_weights_keeps_fp32_norm_inputs_and_a_cast_per_linear(
    model: str, extra: int
) -> None:
    # Measured on one H100 with the bundled trainer (autocast over fp32 weights): what one
    # layer saved beyond this model's 16-bit figure was these bytes per token per hidden unit.
    h = catalog.get_model(model).hidden
    plain = layer_activation_bytes(make_inputs(model, flash=1.0), np.float64(S))[0]
    cast = layer_activation_bytes(make_inputs(model, flash=1.0, autocast_fp32=1.0), np.float64(S))
    assert float(cast[0] - plain) == pytest.approx(extra * h * S, rel=1e-9)
    # a fully recomputed layer keeps its fp32 input
    assert float(cast[2]) == pytest.approx(4.0 * h * S, rel=1e-9)


def test_autocast_casts_and_fp32_norms_cost_memory_time() -> None:
    x16, x32 = make_inputs("llama3-8b"), make_inputs("llama3-8b", autocast_fp32=1.0)
    cheap = [op for op in layer_ops(x16) if op.kind == "memory"]
    costly = [op for op in layer_ops(x32) if op.kind == "memory"]
    f16, _ = _fwd_bwd(x16, cheap, np.float64(S))
    f32, _ = _fwd_bwd(x32, costly, np.float64(S))
    h = x16.hidden
    # norms +4h each, residual adds +4h each, five casts of 6h (q, k, v, up, gate)
    extra = (2 * 4 + 2 * 4 + 5 * 6) * h * S / (x16.hbm_bytes_s * x16.eff_memory)
    assert float(f32 - f16) == pytest.approx(float(extra), rel=1e-6)


@pytest.mark.parametrize("m", [1, 2, 8])
def test_gradient_accumulation_outside_the_gemm_is_a_pass_per_micro_batch(m: int) -> None:
    """A pass over the rank's weight gradients in every micro-batch, another in every one but
    the first, each at the memory-bound rate: none where accumulation is fused (the default)."""
    from autoconfig.cost.memory import stage_params

    layout = {"tp": 2, "pp": 1, "dp": 1, "mbs": 1, "gbs": m}
    fused = make_inputs("gpt3-1.3b", "h100-sxm-80gb", **layout)
    apart = make_inputs(
        "gpt3-1.3b", "h100-sxm-80gb", grad_pass_bytes=6.0, grad_accumulate_bytes=12.0, **layout
    )
    params = stage_params(fused)
    held = float(np.maximum(params.dense_first, params.dense_last))
    bandwidth = float(fused.hbm_bytes_s * fused.eff_memory)
    extra = float(step_time(apart).compute - step_time(fused).compute)
    assert extra == pytest.approx(held * (6.0 * m + 12.0 * (m - 1)) / bandwidth, rel=1e-9)
    assert held == pytest.approx(catalog.get_model("gpt3-1.3b").param_count() / 2, rel=0.05)


def test_gradient_passes_lengthen_the_pipeline_slot_the_bubble_counts() -> None:
    """Each micro-batch's passes run in its backward on every stage: with p stages and v
    chunks the bubble grows by (p - 1) / v of one micro-batch's share."""
    layout = {"tp": 1, "pp": 4, "vp": 2, "dp": 1, "mbs": 1, "gbs": 8}
    fused = step_time(make_inputs("gpt3-1.3b", "h100-sxm-80gb", **layout))
    apart = step_time(make_inputs("gpt3-1.3b", "h100-sxm-80gb", grad_pass_bytes=10.0, **layout))
    share = float(apart.compute - fused.compute) / 8
    assert share > 0
    assert float(apart.bubble - fused.bubble) == pytest.approx(3 / 2 * share, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_a_framework_that_reduces_every_micro_batch_pays_each_reduction(zero: int) -> None:
    """Where the framework reduces gradients in every micro-batch's backward (FSDP, DeepSpeed's
    ZeRO-2), each of the m reductions shows what its backward does not hide; elsewhere only the
    last one does. A pipeline schedule reduces once a step either way."""
    from autoconfig.columns.build import reduce_bits

    m = 8
    # a 70B stage over 32 nodes, one GPU of each in the DP group: its reduction outlasts a
    # micro-batch's backward
    layout = {"tp": 8, "pp": 1, "dp": 32, "mbs": 1, "gbs": m * 32, "zero": zero}
    once = step_time(make_inputs("llama3-70b", "h100-sxm-80gb", **layout))
    bits = reduce_bits([zero])
    every = step_time(
        make_inputs("llama3-70b", "h100-sxm-80gb", reduce_every_micro_batch=bits, **layout)
    )
    other = step_time(
        make_inputs("llama3-70b", "h100-sxm-80gb", reduce_every_micro_batch=7 - bits, **layout)
    )
    one_micro_batch = step_time(make_inputs("llama3-70b", "h100-sxm-80gb", **layout | {"gbs": 32}))
    # by default the data-parallel cost is one per step, however many micro-batches
    assert float(once.dp_comm) == pytest.approx(float(one_micro_batch.dp_comm), rel=1e-12)
    assert float(other.dp_comm) == pytest.approx(float(once.dp_comm), rel=1e-12)
    exposed_reduction = float(every.dp_comm - once.dp_comm) / (m - 1)
    assert exposed_reduction > 0.05
    if zero == 0:  # the all-reduce is all there is
        assert float(every.dp_comm) == pytest.approx(m * float(once.dp_comm), rel=1e-12)
    # the rest of the step is unchanged
    assert float(every.total - every.dp_comm) == pytest.approx(float(once.total - once.dp_comm))
    piped = layout | {"pp": 2, "dp": 16, "gbs": m * 16}
    assert float(
        step_time(
            make_inputs("llama3-70b", "h100-sxm-80gb", reduce_every_micro_batch=bits, **piped)
        ).dp_comm
    ) == pytest.approx(
        float(step_time(make_inputs("llama3-70b", "h100-sxm-80gb", **piped)).dp_comm)
    )


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_a_reduction_after_the_whole_backward_hides_behind_none_of_it(zero: int) -> None:
    """Under a pipeline, a framework whose reduction starts after a stage's last backward
    (torch.distributed.pipelining, DeepSpeed's pipeline engine) pays it whole; Megatron-style
    reduction inside the last backward hides behind it. Without a pipeline the other bits
    decide (the bundled trainer's ZeRO-1 reduces in its optimizer step)."""
    from autoconfig.columns.build import reduce_bits

    bits = reduce_bits([zero])

    def dp_comm(**changes: float) -> float:
        layout = {"tp": 8, "pp": 2, "dp": 16, "mbs": 1, "gbs": 128, "zero": zero} | changes
        return float(step_time(make_inputs("llama3-70b", "h100-sxm-80gb", **layout)).dp_comm)

    inside = dp_comm()
    after = dp_comm(pipeline_reduce_after_backward=bits)
    assert after > inside + 0.05
    # the exposed part grows by exactly the backward window one stage's layers gave it
    no_window = dp_comm(overlap_grad_reduce=0.0)
    assert after == pytest.approx(no_window, rel=1e-12)
    # other stages' bits, and the unpipelined bits under a pipeline, change nothing
    assert dp_comm(pipeline_reduce_after_backward=15 - bits) == pytest.approx(inside, rel=1e-12)
    assert dp_comm(reduce_after_backward=bits) == pytest.approx(inside, rel=1e-12)
    if zero == 3:
        return  # ZeRO-3 without a pipeline reduces layer by layer in backward: no such bit
    flat = {"pp": 1, "dp": 32, "gbs": 256}
    assert dp_comm(reduce_after_backward=bits, **flat) == pytest.approx(
        dp_comm(overlap_grad_reduce=0.0, **flat), rel=1e-12
    )
    assert dp_comm(reduce_after_backward=bits, **flat) > dp_comm(**flat) + 0.05
    assert dp_comm(pipeline_reduce_after_backward=bits, **flat) == pytest.approx(
        dp_comm(**flat), rel=1e-12
    )


def test_fsdp_pays_a_memory_pass_for_each_gather_and_reduction_it_copies() -> None:
    """torch's fully_shard copies every all-gather's output into the per-parameter weights
    (2 x param_bytes a parameter) and every gradient into the reduce-scatter's input in the
    reduction dtype (2 + grad_comm_bytes), on the compute stream: ZeRO-3 gathers twice and
    reduces once a micro-batch, FSDP's ZeRO-2 once each, a pipeline schedule once a step (from
    an accumulator in the reduction dtype)."""
    model, gpu = "llama3-70b", "h100-sxm-80gb"

    def extra(**layout: float) -> float:
        base = {"tp": 8, "pp": 1, "dp": 4, "mbs": 1, "gbs": 4, "zero": 3} | layout
        with_copies = step_time(make_inputs(model, gpu, fsdp_copies=1.0, **base))
        without = step_time(make_inputs(model, gpu, **base))
        # memory passes on the compute stream: nothing else moves
        assert float(with_copies.total - with_copies.compute) == pytest.approx(
            float(without.total - without.compute), rel=1e-12
        )
        return float(with_copies.compute - without.compute)

    x = make_inputs(model, gpu)
    per_byte = catalog.get_model(model).param_count() / 8 / float(x.hbm_bytes_s * x.eff_memory)
    assert extra() == pytest.approx(14 * per_byte, rel=0.02)  # 2 gathers x 4 + 1 x (2 + 4)
    assert extra(gbs=32) == pytest.approx(8 * extra(), rel=1e-9)
    fsdp_zero2 = {"zero": 2, "zero2_gathers_every_micro_batch": 1.0}
    every = {"reduce_every_micro_batch": 4.0}  # ZeRO-2 reduces in every micro-batch
    assert extra(**fsdp_zero2, **every) == pytest.approx(10 / 14 * extra(), rel=1e-9)
    assert extra(gbs=32, **fsdp_zero2, **every) == pytest.approx(8 * extra(**fsdp_zero2), rel=1e-9)
    # under a pipeline: one gather and one reduction a step, however many micro-batches; the
    # reduction reads the fp32 accumulator the gradients were summed into (4 + 4 + 4 bytes)
    piped = {"pp": 2, "dp": 2, "gbs": 2}
    assert extra(**piped) == pytest.approx(12 / 14 * extra() / 2, rel=0.05)
    assert extra(**piped | {"gbs": 16}) == pytest.approx(extra(**piped), rel=1e-9)
    # ZeRO-1 and DeepSpeed-style ZeRO-2 gather into and reduce from whole buffers
    assert extra(zero=1) == 0.0 and extra(zero=2) == 0.0
    assert extra(dp=1) == 0.0


def test_fsdps_zero2_gathers_the_weights_again_in_every_micro_batch() -> None:
    """FSDP reshards ZeRO-2's weights after each backward, so each micro-batch's forward
    gathers them again, layer by layer; DeepSpeed-style ZeRO-2 gathers the updated shards once
    a step. A pipeline schedule keeps FSDP's weights gathered, and ZeRO-1 is untouched."""
    m = 8
    layout = {"tp": 8, "pp": 1, "dp": 32, "mbs": 1, "gbs": m * 32, "zero": 2}

    def dp_comm(gathers: float, **changes: float) -> float:
        x = make_inputs(
            "llama3-70b",
            "h100-sxm-80gb",
            zero2_gathers_every_micro_batch=gathers,
            **layout | changes,
        )
        return float(step_time(x).dp_comm)

    assert dp_comm(1.0) > dp_comm(0.0) + 0.5
    # m gathers: per micro-batch the same, so the excess grows with m
    one = dp_comm(1.0, gbs=32) - dp_comm(0.0, gbs=32)
    assert dp_comm(1.0) - dp_comm(0.0) > 4 * one
    assert dp_comm(1.0, zero=1) == pytest.approx(dp_comm(0.0, zero=1), rel=1e-12)
    piped = {"pp": 2, "dp": 16, "gbs": m * 16}
    assert dp_comm(1.0, **piped) == pytest.approx(dp_comm(0.0, **piped), rel=1e-12)
