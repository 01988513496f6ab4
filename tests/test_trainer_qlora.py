"""QLoRA in the bundled trainer (trainer/nf4.py): NF4 quantization round-trips within its
bound and keeps code values exact, a tensor-parallel shard quantizes to its slice of the whole
weight, the linear dequantizes in forward and again in backward and keeps nothing between,
qlora trains like one process under every layout it runs, holds the NF4 bytes the cost model
counts, and starts near lora (the base differs by quantization only)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn
from helpers import BASE, RTOL, TRAIN, assert_user_error, run_cli

from autoconfig.base.errors import UserError
from autoconfig.cost import finetune
from autoconfig.cost.memory import stage_params
from autoconfig.spec import catalog
from autoconfig.spec.schema import ModelSpec
from autoconfig.spec.task import TaskSpec
from autoconfig.spec.vocab import LoraTargets, Task
from autoconfig.trainer import cli_train, nf4
from autoconfig.trainer.config import TrainConfig, make_config, task_fields
from autoconfig.trainer.launch import launch_local
from autoconfig.trainer.metrics import RunMetrics
from autoconfig.trainer.prediction import CPU_PROFILE, training_inputs_of_runs

SMALL = {**BASE, **TRAIN, "layers": 2}
QLORA = {"task": "qlora", "lora_rank": 8}
LORA = {"task": "lora", "lora_rank": 8}
# The bound on held bytes against the cost model, as for LoRA's saved bytes.
BYTES_RTOL = 0.03
# The tests reading the module's runs share them on one xdist worker.
SHARED_RUNS = pytest.mark.xdist_group("trainer-qlora")
# e4m3's widest step is 32 between 256 and 448 (its largest): a centered absmax scaled to its
# group's largest moves by at most half of it.
ABSMAX_STEP = 16.0 / nf4.ABSMAX_MAX


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Callable[..., RunMetrics]:
    """Runs `model` (a catalog name or a spec) with `fields` on top of SMALL (SGD at lr 10,
    fp32, three steps), once per configuration for the module."""
    runs: dict[str, RunMetrics] = {}

    def run(model: str | ModelSpec = "tiny-llama", **fields: object) -> RunMetrics:
        cfg = make_config(model=model, **{**SMALL, **fields})
        key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
        if key not in runs:
            code, metrics = launch_local(cfg, tmp_path_factory.mktemp("qlora"))
            assert code == 0, metrics.message
            runs[key] = metrics
        return runs[key]

    return run


# -- NF4 ---------------------------------------------------------------------------------------


def _weights(rows: int = 1024, cols: int = 256, seed: int = 0) -> torch.Tensor:
    """Weights as the trainer draws them (normal, std 0.02)."""
    return torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * 0.02


def test_round_trip_error_is_within_the_code_gaps_and_the_absmax_error() -> None:
    """Each weight lands within half the widest NF4 gap of its block's absmax, plus what the
    8-bit absmax lost; that loss is within half an fp8 step of its 256-group's largest centered
    absmax. Measured on 1024x256 N(0, 0.02) weights: the largest error 0.164 absmax (0.99999 of
    its bound, which is tight; absmax errors up to 2.7%), mean 0.028 absmax, 9.2% of the
    weights' norm."""
    w = _weights()
    blocks = w.view(-1, nf4.BLOCK)
    absmax = blocks.abs().amax(dim=1)
    packed, measured = nf4.quantize_blocks(w)
    assert torch.equal(measured, absmax)
    bits, scales, mean = nf4.double_quantize(absmax)
    restored = nf4.dequantize_absmax(bits, scales, mean)
    largest = (absmax - mean).view(-1, nf4.GROUP).abs().amax(dim=1)
    lost = (restored - absmax).abs().view(-1, nf4.GROUP)
    assert (lost <= largest[:, None] * ABSMAX_STEP * (1 + 1e-6)).all()
    error = (blocks - nf4.round_trip(w).view(-1, nf4.BLOCK)).abs().amax(dim=1)
    bound = absmax * nf4.largest_half_gap() + (restored - absmax).abs()
    assert (error <= bound * (1 + 1e-6)).all()
    assert error.max() > 0.1 * absmax.max()  # it quantized
    assert float((w - nf4.round_trip(w)).norm() / w.norm()) < 0.1
    # the storage: half a byte a weight, a byte an absmax, fp32 per 256 blocks
    assert (packed.numel(), bits.numel(), scales.numel()) == (w.numel() // 2, 4096, 16)


def test_code_values_come_back_exactly() -> None:
    """Weights that are NF4 values times their block's absmax keep their codes (first in the
    high nibble) and come back bit for bit; zero is exact."""
    table = nf4.codes_table()
    index = torch.randint(0, 16, (8, nf4.BLOCK), generator=torch.Generator().manual_seed(3))
    index[:, 0] = 0  # -1: every block's absmax is the same 0.037
    w = table[index] * 0.037
    packed, _ = nf4.quantize_blocks(w)
    assert torch.equal(packed >> 4, index.flatten()[0::2].to(torch.uint8))
    assert torch.equal(packed & 15, index.flatten()[1::2].to(torch.uint8))
    assert torch.equal(nf4.round_trip(w), w)
    assert nf4.NF4_CODES[7] == 0.0 and nf4.NF4_CODES[0] == -1.0 and nf4.NF4_CODES[-1] == 1.0


def test_a_tensor_parallel_shard_holds_the_blocks_of_the_whole_weight() -> None:
    """Blocks run along the hidden width, which tp never splits: a column-parallel shard (rows)
    and a row-parallel one (columns, blocked along the output) are whole blocks of the full
    weight even where 64 does not divide the shard (tiny-llama's MLP down: 352 / 2 = 176)."""
    down = _weights(128, 352)  # hidden x ffn, row-parallel: each rank keeps 176 columns
    whole_codes, whole_absmax = nf4.quantize_blocks(down.t())
    for rank in range(2):
        codes, absmax = nf4.quantize_blocks(down[:, rank * 176 : (rank + 1) * 176].t())
        half = whole_absmax.numel() // 2
        assert torch.equal(absmax, whole_absmax[rank * half : (rank + 1) * half])
        assert torch.equal(codes, whole_codes[rank * codes.numel() : (rank + 1) * codes.numel()])


def test_the_linear_dequantizes_in_forward_and_again_in_backward(monkeypatch) -> None:
    """Nothing the NF4 linear computes is saved for backward (not the input, not the weight):
    backward dequantizes again for the input's gradient, which is x's gradient through the
    dequantized weight; the weight itself is gone, and no gradient is made for it."""
    linear = nn.Linear(128, 96, bias=False)
    with torch.no_grad():
        linear.weight.copy_(_weights(96, 128))
    nf4.quantize_linear(linear, nf4.COLUMN)
    assert "weight" not in dict(linear.named_parameters())
    assert linear.held_bytes() == 96 * 128 // 2 + 96 * 128 // 64 + 4 + 4
    calls = []
    dequantized = nf4.NF4Linear.dequantized
    monkeypatch.setattr(
        nf4.NF4Linear, "dequantized", lambda self, *a: calls.append(1) or dequantized(self, *a)
    )
    x = torch.randn(2, 5, 128, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = linear(x)
    assert saved == [] and len(calls) == 1
    grad = torch.randn_like(y)
    y.backward(grad)
    assert len(calls) == 2
    weight = linear.dequantized(torch.float32)
    torch.testing.assert_close(y, x @ weight.t())
    torch.testing.assert_close(x.grad, grad @ weight)


# -- training ----------------------------------------------------------------------------------

QLORA_LAYOUTS = {  # a 2-rank run takes 5 s alone, 10 s beside another on two cores
    "tp2": {"tp": 2},  # the one that shards the NF4 weights; the others hold them whole
    # One layout per way the NF4 base could part from one process's: its shards under tp+sp,
    # FSDP's wrapping under ZeRO-2, its stages under an interleaved pipeline (the plain LoRA
    # layouts, tests/test_trainer_finetune.py, cover the rest of the adapters' paths).
    "tp2+sp": pytest.param({"tp": 2, "sp": True}, marks=pytest.mark.slow),
    "dp2 ZeRO-2 (FSDP)": pytest.param({"dp": 2, "zero": 2}, marks=pytest.mark.slow),
    "pp2 interleaved": pytest.param({"pp": 2, "vp": 2, "layers": 4}, marks=pytest.mark.slow),
}


@SHARED_RUNS
@pytest.mark.parametrize("layout", list(QLORA_LAYOUTS.values()), ids=list(QLORA_LAYOUTS))
def test_qlora_trains_like_one_process(trained, layout) -> None:
    """Every rank holds exactly its slice of one process's NF4 weights (the absmaxes' second
    level taken over the whole weight under tp), so the losses differ by rounding only:
    measured at most 3.1e-8 relative after three steps (dp2 ZeRO-1 and DDP; tp2, tp2+sp and
    pp2 1.6e-8)."""
    single = trained(**QLORA, layers=layout.get("layers", 2)).losses
    assert trained(**QLORA, **layout).losses == pytest.approx(single, rel=RTOL)


@SHARED_RUNS
@pytest.mark.slow
def test_qlora_with_kv_heads_kept_whole(trained) -> None:
    """tp above the K/V heads: each rank keeps the K/V weights whole in NF4 and projects its
    head's rows of them (model.Attention._kv)."""
    spec = catalog.get_model("tiny-llama").model_copy(update={"kv_heads": 1})
    single = trained(spec, **QLORA).losses
    assert trained(spec, **QLORA, tp=2).losses == pytest.approx(single, rel=RTOL)


@SHARED_RUNS
@pytest.mark.slow
def test_qlora_with_tied_embeddings_across_stages(trained) -> None:
    single = trained("tiny-gpt", **QLORA).losses
    assert trained("tiny-gpt", **QLORA, pp=2).losses == pytest.approx(single, rel=RTOL)


def _linear_weights(spec: ModelSpec, layers: int, tp: int) -> int:
    """The layers' linear weights a tp rank holds: q, k, v, out, and the MLP's up, gate and
    down, each split over tp."""
    spec = catalog.get_model(spec) if isinstance(spec, str) else spec
    h, d = spec.hidden, spec.dhead
    attention = h * d * (2 * spec.heads + 2 * spec.kv)
    mlp = h * spec.ffn * (3 if spec.mlp == "swiglu" else 2)
    return layers * (attention + mlp) // tp


@SHARED_RUNS
@pytest.mark.parametrize(
    # tp2 reads the run test_qlora_trains_like_one_process[tp2] makes (SHARED_RUNS)
    "layout",
    [{}, {"tp": 2}],
    ids=["one process", "tp2"],
)
def test_qlora_holds_the_nf4_bytes_the_cost_model_counts(trained, layout) -> None:
    """A rank's NF4 base (its parameter bytes but those of the fp32 weights it also holds)
    against the cost model's NF4 bytes for the layers' linear weights it counts on that rank
    (cost/finetune.py NF4_BYTES_PER_PARAM, cost/memory.py stage_params), within 3%. Measured:
    190,240 bytes against 190,170 (+0.04%) on one process, 95,176 against 95,085 (+0.10%) per
    tp2 rank: the fp32 mean per weight and the group scales a small weight's partial group or
    a shard's cut group adds."""
    metrics = trained(**QLORA, **layout)
    cfg = make_config(model="tiny-llama", **{**SMALL, **QLORA, **layout})
    counted = stage_params(training_inputs_of_runs([cfg], [CPU_PROFILE], ["cpu"])).busiest_linear
    expected = finetune.NF4_BYTES_PER_PARAM * float(counted[0])
    linear = _linear_weights("tiny-llama", 2, layout.get("tp", 1))
    assert linear == float(counted[0])
    for rank in metrics.memory:
        held = rank.parameter_bytes - 4 * (rank.parameters - linear)  # the rest is fp32
        assert held == pytest.approx(expected, rel=BYTES_RTOL)
        assert held < linear * 0.52  # 4.127 bits a weight, not 32
    lora = trained(**LORA) if not layout else None
    if lora is not None:  # the same weights, held in 4 instead of 32 bits
        assert metrics.memory[0].parameters == lora.memory[0].parameters


@SHARED_RUNS
def test_qlora_starts_near_lora(trained) -> None:
    """B starts at zero, so the first loss is the base model's: with NF4 weights near lora's
    16-bit ones, and not equal (quantized). Measured: 1.7e-4 relative on 2-layer tiny-llama
    (7.64761 against 7.64892), 34x the equivalence tolerance."""
    quantized, plain = trained(**QLORA).losses[0], trained(**LORA).losses[0]
    assert abs(quantized - plain) < 5e-2 * plain
    assert abs(quantized - plain) > 20 * RTOL * plain


# -- configuration -----------------------------------------------------------------------------

TRAIN_FLAGS = ["train", "--model", "tiny-llama", "--device", "cpu", "--steps", "2", "--warmup", "1"]


def test_the_command_line_runs_qlora(monkeypatch, tmp_path) -> None:
    seen: list[TrainConfig] = []

    def keep(cfg: TrainConfig, out) -> tuple[int, RunMetrics]:
        seen.append(cfg)
        raise SystemExit(0)  # before anything runs

    monkeypatch.setattr(cli_train, "launch_local", keep)
    done = run_cli(*TRAIN_FLAGS, "--task", "qlora", "--lora-rank", "4", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (cfg,) = seen
    assert cfg.quantized and cfg.adapters and cfg.task_spec().task is Task.QLORA


def test_a_qlora_search_task_becomes_a_qlora_trainer_configuration() -> None:
    fields = task_fields(TaskSpec(Task.QLORA, 16, LoraTargets.ATTENTION))
    cfg = make_config(model="tiny-llama", **{**SMALL, **fields})
    assert (cfg.task, cfg.lora_rank, cfg.quantized) == ("qlora", 16, True)


def test_qlora_under_zero3_is_one_line(tmp_path) -> None:
    """ZeRO-3 shards the NF4 base in the cost model; the trainer keeps it whole on each rank."""
    flags = [*TRAIN_FLAGS, "--out", str(tmp_path / "run"), "--task", "qlora"]
    assert_user_error(run_cli(*flags, "--dp", "2", "--zero", "3"), "zero:")
    # under a pipeline ZeRO-3 keeps the weights whole (cost/memory.py): that runs
    make_config(model="tiny-llama", **{**SMALL, **QLORA, "pp": 2, "dp": 2, "zero": 3})


def test_qlora_needs_a_hidden_width_of_whole_blocks() -> None:
    narrow = {"hidden": 96, "heads": 6, "kv_heads": 2}
    spec = catalog.get_model("tiny-llama").model_copy(update=narrow)
    with pytest.raises(UserError, match=r"^task: qlora quantizes blocks of 64"):
        make_config(model=spec, **{**SMALL, **QLORA})
    make_config(model=spec, **{**SMALL, **LORA})
