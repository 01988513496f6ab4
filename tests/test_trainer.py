"""The bundled trainer on CPU with gloo (at most 4 ranks): every layout trains like one process,
what it measures matches the cost model, failures end runs with a status, bad layouts never
start."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import BASE, RTOL, TRAIN, assert_user_error, make_inputs, run_cli

from autoconfig import search
from autoconfig.base.errors import UserError
from autoconfig.cost.memory import layer_activation_bytes, stage_params
from autoconfig.spec import catalog
from autoconfig.spec.schema import Position
from autoconfig.trainer import cli_train, ops
from autoconfig.trainer.config import TrainConfig, config_from_search_row, make_config
from autoconfig.trainer.launch import launch_local
from autoconfig.trainer.metrics import EXIT_OOM, RunMetrics, read_metrics
from autoconfig.trainer.model import Block, rope_tables
from autoconfig.trainer.prediction import grad_bytes_of_run, runs_autocast

LAYOUTS = {
    "tp2": {"tp": 2},
    "tp2+sp": {"tp": 2, "sp": True},
    "pp2 1F1B": {"pp": 2},
    "pp2 interleaved vp2": {"pp": 2, "vp": 2},
    # 8 layers in 10 chunks: the embedding and the head count as a layer each (Megatron's
    # split where only layers + 2 divide), so the first and the last chunk hold no layer
    "pp2 interleaved vp5, ends as layers": {"pp": 2, "vp": 5},
    "dp2 DDP": {"dp": 2},
    "dp2 ZeRO-1": {"dp": 2, "zero": 1},
    "dp2 ZeRO-2 (FSDP)": {"dp": 2, "zero": 2},
    "dp2 FSDP": {"dp": 2, "zero": 3},
    "tp2 x dp2": {"tp": 2, "dp": 2},
    "tp2+sp x dp2 FSDP": {"tp": 2, "sp": True, "dp": 2, "zero": 3},
    "tp2 x pp2": {"tp": 2, "pp": 2},
    # FSDP under a pipeline schedule keeps the weights gathered from forward to backward
    "pp2 x dp2 FSDP": {"pp": 2, "dp": 2, "zero": 3},
    "recompute full": {"recompute": "full"},
    "recompute full on 3 layers": {"recompute": "full", "recompute_layers": 3},
    "recompute selective": {"recompute": "selective"},
}
GPT_LAYOUTS = {  # tied embeddings, learned positions, LayerNorm, GELU
    "gpt tp2+sp": {"tp": 2, "sp": True},
    "gpt pp2 (tied across stages)": {"pp": 2},
}


def _run(tmp: Path, model: str, **layout) -> tuple[int, RunMetrics]:
    cfg = make_config(model=model, **{**BASE, **TRAIN, **layout})
    return launch_local(cfg, tmp)


@dataclass
class Launched:
    """One run of `autoconfig train --config`: the CLI's output, the configuration it ran and
    the folder it wrote (metrics.json)."""

    done: subprocess.CompletedProcess[str]
    config: TrainConfig
    out: Path

    @property
    def metrics(self) -> RunMetrics:
        assert self.done.returncode == 0, self.done.stdout[-2000:] + self.done.stderr[-2000:]
        return read_metrics(self.out / "metrics.json")


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Callable[..., Launched]:
    """Trains `model` with a layout (SGD at lr 10, fp32, three steps) through the command line
    in this process (`autoconfig train --config`), once per configuration for the module: the
    checks on one layout (same losses as one process, every metrics.json field, the
    prediction) read one run instead of launching the same ranks again for each."""
    runs: dict[str, Launched] = {}

    def launch(model: str, **layout) -> Launched:
        cfg = make_config(model=model, **{**BASE, **TRAIN, **layout})
        key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
        if key not in runs:
            folder = tmp_path_factory.mktemp(model)
            (folder / "trial.json").write_text(key)
            done = run_cli("train", "--config", str(folder / "trial.json"), "--out", str(folder))
            runs[key] = Launched(done, cfg, folder)
        return runs[key]

    return launch


@pytest.fixture(scope="module")
def single(launched) -> dict[str, list[float]]:
    return {model: launched(model).metrics.losses for model in ("tiny-llama", "tiny-gpt")}


def test_the_reference_run_really_trains(single, tmp_path) -> None:
    """The equivalence below compares trained models: with a negligible learning rate the
    losses after the first step are far outside the tolerance."""
    cfg = make_config(model="tiny-llama", **{**BASE, **TRAIN, "lr": 1e-9})
    code, frozen = launch_local(cfg, tmp_path)
    assert code == 0, frozen.message
    assert frozen.losses[0] == pytest.approx(single["tiny-llama"][0], rel=1e-12)
    for got, trained in zip(frozen.losses[1:], single["tiny-llama"][1:], strict=True):
        assert abs(got - trained) > 100 * RTOL * trained


# Four-rank layouts whose parts the default run already checks (tp2 x dp2 ZeRO-1 and
# tp2+sp x dp2 ZeRO-2 in test_trainer_layouts.py): CI's second pass (-m slow) runs them.
SLOW_LAYOUTS = {"tp2 x dp2", "tp2+sp x dp2 FSDP", "pp2 x dp2 FSDP"}


# The tests that read the tp2 x pp2 run stay on one xdist worker, which launches it once.
SHARED_RUN = pytest.mark.xdist_group("trainer-tp2-pp2")


def _marks(name: str) -> list[pytest.MarkDecorator]:
    marks = [pytest.mark.slow] if name in SLOW_LAYOUTS else []
    return marks + ([SHARED_RUN] if name == "tp2 x pp2" else [])


@pytest.mark.parametrize(
    ("model", "layout"),
    [pytest.param("tiny-llama", v, marks=_marks(k)) for k, v in LAYOUTS.items()]
    + [("tiny-gpt", v) for v in GPT_LAYOUTS.values()],
    ids=[*LAYOUTS, *GPT_LAYOUTS],
)
def test_layout_trains_like_one_process(single, launched, model, layout) -> None:
    assert launched(model, **layout).metrics.losses == pytest.approx(single[model], rel=RTOL)


@pytest.mark.parametrize(
    ("layout", "reshards"),
    [({"zero": 3, "dp": 2}, True), ({"zero": 3, "dp": 2, "pp": 2}, False),
     ({"zero": 2, "dp": 2}, False)],
)  # fmt: skip
def test_fsdp_keeps_the_weights_gathered_under_a_pipeline(layout: dict, reshards: bool) -> None:
    """ZeRO-3 frees the gathered weights after each forward, except under a pipeline, where
    they stay gathered from forward to backward (torchtitan's default, what the model
    charges); ZeRO-2 keeps them gathered through backward."""
    from autoconfig.trainer.parallel import reshards_after_forward

    cfg = make_config(model="tiny-llama", **{**BASE, "gbs": 8, **layout})
    assert reshards_after_forward(cfg) is reshards


def test_untied_head_with_learned_positions_across_stages(tmp_path) -> None:
    """The last stage's own head starts from the same weights as in one process (its init
    does not depend on which embeddings the stage holds)."""
    from autoconfig.spec import catalog

    spec = catalog.get_model("tiny-gpt").model_copy(update={"tied_embeddings": False})
    runs = [
        launch_local(make_config(model=spec, **{**BASE, **TRAIN, **layout}), tmp_path / str(i))
        for i, layout in enumerate(({}, {"pp": 2}))
    ]
    assert [code for code, _ in runs] == [0, 0], [m.message for _, m in runs]
    assert runs[1][1].losses == pytest.approx(runs[0][1].losses, rel=RTOL)


ACTIVATION_LAYOUTS = [
    {"tp": tp, "sp": sp, "recompute": r}
    for tp in (1, 2, 4)
    for sp in (False, True)
    for r in ("none", "selective", "full")
    if not (sp and tp == 1)
] + [{"tp": 1, "recompute": "full", "recompute_layers": 2}]


@pytest.mark.parametrize(
    "layout",
    [  # tp 4 (four ranks) repeats tp 2's formula: CI's second pass (-m slow) runs it
        pytest.param(d, marks=[pytest.mark.slow] if d["tp"] == 4 else [])
        for d in ACTIVATION_LAYOUTS
    ],
    ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()),
)
def test_saved_activations_match_the_cost_model(tmp_path, layout) -> None:
    """Bytes saved for backward per layer (saved_tensors_hooks, bf16 on CPU) against the cost
    model's per-layer activation memory for the same layout."""
    cfg = make_config(
        model="tiny-llama",
        **{**BASE, "steps": 1, "warmup": 0, "precision": "bf16", "gbs": 1, "mbs": 1, **layout},
    )
    code, metrics = launch_local(cfg, tmp_path)
    assert code == 0, metrics.message
    measured = metrics.memory[0].saved_activation_bytes_per_layer
    predicted = metrics.predicted["act_bytes_per_layer"]
    assert predicted == pytest.approx(measured, rel=0.03)


def _saved_by_one_layer(model: str, autocast: bool) -> float:
    """Bytes one layer of `model` saves for backward, as the trainer counts them: under CPU
    autocast over fp32 weights (the trainer's GPU mode), or in plain bf16."""
    spec = catalog.get_model(model)
    torch.manual_seed(0)
    block = Block(spec) if autocast else Block(spec).to(torch.bfloat16)
    seq = spec.seq_len
    rope = rope_tables(seq, spec.dhead) if spec.position == Position.ROPE else None
    counter = ops.SavedBytes()
    counter.ignore_parameters(block)
    counter.stack = ["all"]
    dtype = torch.float32 if autocast else torch.bfloat16
    x = torch.randn(2, seq, spec.hidden, dtype=dtype, requires_grad=True)
    with counter.hooks(), torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        block(x, rope)
    return counter.by_region["all"]


def _predicted_for_one_layer(model: str, autocast: bool) -> float:
    seq = catalog.get_model(model).seq_len
    inputs = make_inputs(model, autocast_fp32=float(autocast), flash=1.0, seq=seq, mbs=2)
    return float(layer_activation_bytes(inputs, np.float64(2 * seq))[0])


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt", "tiny-moe"])
def test_autocast_activations_match_the_cost_model(model: str) -> None:
    """A layer under autocast over fp32 weights, as the trainer runs on GPU (here CPU autocast):
    what it saves beyond the same layer in bf16, autocast's weight copies left out, against
    the cost model's `autocast_fp32` (its fp32 norm inputs and the casts each linear keeps)."""
    measured = _saved_by_one_layer(model, True) - _saved_by_one_layer(model, False)
    predicted = _predicted_for_one_layer(model, True) - _predicted_for_one_layer(model, False)
    assert measured == pytest.approx(predicted, rel=0.02)
    assert _saved_by_one_layer(model, True) == pytest.approx(
        _predicted_for_one_layer(model, True), rel=0.04
    )


def test_autocasts_weight_copies_are_not_activations() -> None:
    linear = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    saved: list[torch.Tensor] = []
    with (
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
        torch.autocast("cpu", torch.bfloat16),
    ):
        linear(x)
        torch.nn.functional.linear(x, linear.weight[:16])  # a slice is cast afresh each call
    # F.linear keeps the bf16 copies of its input and of its (transposed) weight
    kinds = sorted((ops.is_weight_cast(t), tuple(t.shape)) for t in saved)
    assert kinds == [(False, (8, 64)), (False, (8, 64)), (False, (64, 16)), (True, (64, 32))]


@pytest.mark.parametrize(
    "layout",
    [
        {"tp": 2},
        {"dp": 2, "zero": 3},
        pytest.param({"tp": 2, "dp": 2, "zero": 3}, marks=pytest.mark.slow),  # four ranks
        {"pp": 2},
    ],
    ids=["tp2", "fsdp2", "tp2-fsdp2", "pp2"],
)
def test_parameter_gradient_optimizer_bytes_are_exact(tmp_path, layout) -> None:
    code, metrics = _run(tmp_path, "tiny-llama", **layout, optimizer="adamw", lr=1e-3)
    assert code == 0, metrics.message
    x = make_inputs("tiny-llama", **{"seq": 128, "gbs": 4, **layout})
    params = stage_params(x)
    for rank in metrics.memory:
        stage = params.dense_first if rank.pp_rank == 0 else params.dense_last
        shard = layout.get("dp", 1) if layout.get("zero", 0) == 3 else 1
        assert rank.parameters == round(float(stage)) // shard
        assert rank.parameter_bytes == 4 * rank.parameters  # fp32 weights
        assert rank.gradient_bytes == 4 * rank.parameters
        assert rank.optimizer_bytes == 8 * rank.parameters  # AdamW m and v


@SHARED_RUN
def test_metrics_json_has_every_field(launched) -> None:
    """The four-rank tp2 x pp2 run of the equivalence check above, as the CLI wrote it."""
    run = launched("tiny-llama", tp=2, pp=2)
    assert run.done.returncode == 0, run.done.stderr[-2000:]
    raw = json.loads((run.out / "metrics.json").read_text())
    metrics = RunMetrics.model_validate(raw)
    assert metrics.status == "ok"
    assert len(metrics.step_times_s) == len(metrics.losses) == 3
    assert metrics.median_step_time_s > 0 and metrics.tokens_per_s_per_gpu > 0
    assert metrics.model_tflops_per_gpu > 0
    assert metrics.environment.world_size == 4 and metrics.environment.torch
    assert sorted(r.rank for r in metrics.memory) == [0, 1, 2, 3]
    assert {r.pp_rank for r in metrics.memory} == {0, 1}
    assert all(r.saved_activation_bytes > 0 for r in metrics.memory)
    assert metrics.config["tp"] == 2 and metrics.config["pp"] == 2
    assert "measured" in run.done.stdout


def test_train_flags_build_the_configuration_they_name(monkeypatch, tmp_path) -> None:
    """`train --tp 2 --pp 2 --nproc 4 ...` builds the configuration of the tp2 x pp2 run above
    (the flags' own path; that run came from its JSON), up to its optimizer, which no flag
    sets: the launch is replaced by a stub that keeps the configuration."""
    seen: list[TrainConfig] = []

    def keep(cfg: TrainConfig, out: Path) -> tuple[int, RunMetrics]:
        seen.append(cfg)
        raise SystemExit(0)  # the CLI's own exit, before anything is shown

    monkeypatch.setattr(cli_train, "launch_local", keep)
    flags = ["--model", "tiny-llama", "--tp", "2", "--pp", "2", "--nproc", "4", "--steps", "3"]
    flags += ["--warmup", "1", "--gbs", "4", "--precision", "fp32", "--zero", "0", "--no-sp"]
    flags += ["--device", "cpu"]
    done = run_cli("train", *flags, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (cfg,) = seen
    ran = make_config(model="tiny-llama", **{**BASE, **TRAIN, "tp": 2, "pp": 2})
    assert cfg.world_size == cfg.world == ran.world == 4  # --nproc, given; derived in the JSON
    assert cfg.model_copy(update={**TRAIN, "world_size": None}) == ran


@SHARED_RUN
def test_the_prediction_uses_the_precision_and_profile_that_ran(launched) -> None:
    """On CPU the ranks hold fp32 and run on cpu-gloo cores: the printed prediction says so,
    has a step time, and its saved activations are the fp32 ones (twice the 16-bit bytes)."""
    metrics = launched("tiny-llama", tp=2, pp=2).metrics
    pred = metrics.predicted
    assert metrics.gpu_profile == pred["gpu_profile"] == "cpu-gloo"
    assert pred["precision"] == "fp32"
    assert pred["pred_step_time_s"] > 0
    measured = max(r.saved_activation_bytes_per_layer for r in metrics.memory)
    assert pred["act_bytes_per_layer"] == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize(
    ("fault", "status", "exit_code"), [("oom@1", "oom", EXIT_OOM), ("crash@0", "error", 1)]
)
def test_a_failing_rank_ends_the_run_with_a_status(
    tmp_path, monkeypatch, fault, status, exit_code
) -> None:
    monkeypatch.setenv("AUTOCONFIG_TRAINER_FAULT", fault)
    begin = time.monotonic()
    code, metrics = _run(tmp_path, "tiny-llama", dp=2)
    assert time.monotonic() - begin < 120  # the surviving rank does not hang
    assert (code, metrics.status) == (exit_code, status)
    assert "injected" in metrics.message
    assert read_metrics(tmp_path / "metrics.json").status == status


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--tp", "2", "--nproc", "3"], "world size"),
        (["--tp", "3", "--nproc", "3"], "tp"),
        (["--pp", "16", "--nproc", "16"], "pp"),
        (["--cp", "3", "--nproc", "3"], "cp"),  # seq 128 is not 2*cp equal chunks
        (["--model", "tiny-lama"], "model"),
        (["--sp"], "sp"),
    ],
)
def test_impossible_layouts_are_refused_before_starting(tmp_path, args, field) -> None:
    model = [] if "--model" in args else ["--model", "tiny-llama"]
    done = run_cli("train", "--device", "cpu", "--out", str(tmp_path), *model, *args)
    assert_user_error(done)
    assert done.stderr.startswith(f"error: {field}"), done.stderr
    assert not (tmp_path / "rank0.json").exists()


def test_slice_mode_builds_the_per_rank_shapes(tmp_path) -> None:
    cfg = make_config(model="tiny-llama", slice=True, tp=4, layers=2, **{**BASE, "gbs": 1})
    code, metrics = launch_local(cfg, tmp_path)
    assert code == 0, metrics.message
    x = make_inputs("tiny-llama", tp=4, layers=2, seq=128)
    # One device holds exactly what one TP rank of the full model holds.
    assert metrics.memory[0].parameters == round(float(stage_params(x).dense_first))
    layer = metrics.slice_layer
    assert layer["tp_of_shapes"] == 4 and layer["forward_ms"] > 0 and layer["backward_ms"] > 0


def test_a_search_result_becomes_a_trainer_configuration(tmp_path) -> None:
    ranked = search("tiny-llama", 4, "h100-sxm-80gb", seq_len=128, gbs=8).ranked
    # The best-ranked layout the trainer runs, as the measured search takes them (it sets
    # aside those the trainer refuses: a pipeline with fewer micro-batches than stages).
    for _, row in ranked.head(30).iterrows():
        try:
            cfg = config_from_search_row(row, "tiny-llama", seq_len=128, gbs=8, steps=2,
                                         warmup=1, device="cpu", precision="fp32")  # fmt: skip
            break
        except UserError:
            continue
    else:
        raise AssertionError("none of the thirty best layouts runs in the trainer")
    assert (cfg.tp, cfg.pp, cfg.resolved_dp, cfg.mbs) == (row.tp, row.pp, row.dp, row.mbs)
    assert cfg.world == 4
    code, metrics = launch_local(cfg, tmp_path)
    assert code == 0, metrics.message


@pytest.mark.parametrize(
    ("layout", "device", "autocast"),
    [
        ({"zero": 1}, "cuda", True),
        ({"zero": 0, "dp": 2}, "cuda", True),
        ({"zero": 3, "dp": 2}, "cuda", False),  # FSDP's bf16 weights and block inputs
        ({"zero": 2, "dp": 2}, "cuda", False),
        ({"zero": 3}, "cuda", True),  # one rank: nothing to shard, no FSDP wrapper
        ({"zero": 1, "precision": "fp32"}, "cuda", False),
        ({"zero": 1}, "cpu", False),
    ],
)
def test_which_runs_are_predicted_under_autocast(layout, device, autocast) -> None:
    cfg = make_config(model="tiny-llama", **{"gbs": 4, "precision": "auto", **layout})
    assert runs_autocast(cfg, device) is autocast


def test_zero0_reduces_gradients_in_the_last_micro_batch_only(monkeypatch) -> None:
    """DDP and `replicate` (ZeRO-0) skip the all-reduce in every micro-batch but the last, as the
    cost model charges it, once a step; "dp2 DDP" and "tp2 x dp2" above, at two micro-batches
    a rank, check that the gradients stay right."""
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.nn.parallel import DistributedDataParallel

    from autoconfig.trainer.parallel import _replicate, reduce_on_last

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(torch.nn.Linear(2, 2))
        replicated = torch.nn.Sequential(torch.nn.Linear(2, 2))
        _replicate(replicated, init_device_mesh("cpu", (1,)))
        group = replicated._get_fsdp_state()._fsdp_param_group  # torch's own flag
        seen = []
        for last in (False, True):
            with reduce_on_last(ddp, last), reduce_on_last(replicated, last):
                seen.append((ddp.require_backward_grad_sync, group.reduce_grads))
        assert seen == [(False, False), (True, True)]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("layout", "device", "expected"),
    [
        ({"precision": "auto"}, "cuda", (6.0, 12.0)),  # autocast: cast to fp32, add to .grad
        ({"precision": "fp32"}, "cuda", (0.0, 12.0)),
        ({"precision": "fp32"}, "cpu", (0.0, 12.0)),
        ({"precision": "bf16"}, "cpu", (0.0, 6.0)),  # bf16 weights and gradients
        # FSDP: add the reduced half to the shard (its copy into the fp32 reduce-scatter
        # buffer is one of FSDP's copies, charged apart)
        ({"precision": "auto", "zero": 2, "dp": 2}, "cuda", (0.0, 6.0)),
        # FSDP under a pipeline schedule: the first bf16 gradient upcast into an unsharded fp32
        # accumulator (6), each later one added to it (2 + 4 + 4 = 6 + 4)
        ({"precision": "auto", "zero": 3, "dp": 2, "pp": 2, "gbs": 8}, "cuda", (6.0, 4.0)),
        # without a reduce dtype autograd adds into `.grad`
        ({"precision": "fp32", "zero": 3, "dp": 2, "pp": 2, "gbs": 8}, "cpu", (0.0, 12.0)),
    ],
)
def test_the_gradient_passes_the_trainer_makes_each_micro_batch(layout, device, expected) -> None:
    cfg = make_config(model="tiny-llama", **{**BASE, "device": device, **layout})
    assert grad_bytes_of_run(cfg, device) == expected
