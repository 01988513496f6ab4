"""The bundled trainer's ZeRO-1/2 with tensor parallelism, context parallelism, expert
parallelism and MoE with tensor parallelism (CPU, gloo, at most 4 ranks): they train like one
process, CP and EP layouts save what the cost model predicts, token drops are counted, and
layouts that cannot run never start."""

from __future__ import annotations

import math
import subprocess
import sys

import pandas as pd
import pytest
from helpers import BASE, RTOL, TRAIN, run_cli

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.cli.app import execute
from autoconfig.trainer import prediction
from autoconfig.trainer.config import TrainConfig, config_from_search_row, make_config
from autoconfig.trainer.launch import launch_local
from autoconfig.trainer.metrics import RunMetrics

# Two layers of tiny-llama/tiny-gpt (tiny-moe has four): what a layout does to one layer it
# does to every layer, and the runs stay short on two cores.
LAYERS = {"tiny-llama": 2, "tiny-gpt": 2, "tiny-moe": 4}
SMALL = {**BASE, **TRAIN, "gbs": 2}

LAYOUTS = {
    "tp2 x dp2 ZeRO-1": ("tiny-llama", {"tp": 2, "dp": 2, "zero": 1}),
    "tp2+sp x dp2 ZeRO-2": ("tiny-llama", {"tp": 2, "sp": True, "dp": 2, "zero": 2}),
    "cp2": ("tiny-llama", {"cp": 2}),
    "cp2 x tp2+sp": ("tiny-llama", {"cp": 2, "tp": 2, "sp": True}),
    "cp2 learned positions, tied": ("tiny-gpt", {"cp": 2}),
    "dp2 ep2 ZeRO-1": ("tiny-moe", {"dp": 2, "ep": 2, "zero": 1}),
    "cp2 ep2 ZeRO-3": ("tiny-moe", {"cp": 2, "ep": 2, "zero": 3}),
    "MoE tp2+sp x dp2 ep2": ("tiny-moe", {"tp": 2, "sp": True, "dp": 2, "ep": 2, "etp": 2}),
    # tp 4 above tiny-moe's 2 K/V heads: each K/V head on the two ranks whose query heads use it
    "tp4 over 2 K/V heads": ("tiny-moe", {"tp": 4}),
    "tp4+sp over 2 K/V heads": ("tiny-moe", {"tp": 4, "sp": True}),
    # etp 1: whole experts on each tp rank, which routes its share of the tokens
    "MoE tp2 whole experts": ("tiny-moe", {"tp": 2, "etp": 1}),
    "MoE tp2+sp whole experts x dp2 ep2": (
        "tiny-moe",
        {"tp": 2, "sp": True, "dp": 2, "ep": 2, "etp": 1},
    ),
    # ep folded over the tp ranks (Megatron-Core's MoE parallel folding)
    "MoE tp2 whole experts ep2": ("tiny-moe", {"tp": 2, "etp": 1, "ep": 2}),
    "MoE tp4 whole experts ep2": ("tiny-moe", {"tp": 4, "etp": 1, "ep": 2}),
    "MoE tp4 whole experts ep2 ZeRO-1": ("tiny-moe", {"tp": 4, "etp": 1, "ep": 2, "zero": 1}),
    "MoE tp2 whole experts x dp2 ep4 ZeRO-3": (
        "tiny-moe",
        {"tp": 2, "dp": 2, "etp": 1, "ep": 4, "zero": 3},
    ),
}


def _config(model: str, **fields) -> TrainConfig:
    return make_config(model=model, layers=LAYERS[model], **{**SMALL, **fields})


def _run(tmp, model: str, **fields) -> RunMetrics:
    code, metrics = launch_local(_config(model, **fields), tmp)
    assert code == 0, metrics.message
    return metrics


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict[str, list[float]]:
    return {m: _run(tmp_path_factory.mktemp(m), m).losses for m in LAYERS}


@pytest.mark.parametrize(("model", "layout"), LAYOUTS.values(), ids=LAYOUTS)
def test_layout_trains_like_one_process(single, tmp_path, model, layout) -> None:
    """Plain SGD at a learning rate that moves the loss by 1e-2 relative in three steps: a
    gradient wrong by a constant factor (e.g. expert gradients divided by the ranks holding
    the expert instead of dp*cp) showed as 2.7e-5 relative, rounding as at most 3.4e-7."""
    metrics = _run(tmp_path, model, **layout)
    assert metrics.losses == pytest.approx(single[model], rel=RTOL)


def test_zero1_with_tp_shards_adamw_states_over_dp(tmp_path) -> None:
    """AdamW through the sharded optimizer on DTensor shards: the same losses as one process,
    and each rank keeps m and v for half (dp 2) of its tp shard of the weights."""
    adamw = {"optimizer": "adamw", "lr": 1e-3}
    reference = _run(tmp_path / "single", "tiny-llama", **adamw)
    metrics = _run(tmp_path / "zero1", "tiny-llama", tp=2, dp=2, zero=1, **adamw)
    assert metrics.losses == pytest.approx(reference.losses, rel=RTOL)
    assert reference.memory[0].optimizer_bytes == 8 * reference.memory[0].parameters
    for rank in metrics.memory:
        assert rank.gradient_bytes == rank.parameter_bytes  # ZeRO-1 keeps whole gradients
        assert rank.optimizer_bytes == 8 * math.ceil(rank.parameters / 2)


SAVED_LAYOUTS = {
    "cp2 x tp2+sp": ("tiny-llama", {"cp": 2, "tp": 2, "sp": True}),
    "dp2 ep2": ("tiny-moe", {"dp": 2, "ep": 2}),
    "cp2 ep2": ("tiny-moe", {"cp": 2, "ep": 2}),
    # whole experts under tp: each tp rank keeps the routed copies of its own tokens only
    "MoE tp2+sp whole experts": ("tiny-moe", {"tp": 2, "sp": True, "etp": 1}),
    "MoE tp2+sp whole experts x dp2 ep2": (
        "tiny-moe",
        {"tp": 2, "sp": True, "etp": 1, "dp": 2, "ep": 2},
    ),
}


@pytest.mark.parametrize(("model", "layout"), SAVED_LAYOUTS.values(), ids=SAVED_LAYOUTS)
def test_saved_activations_match_the_cost_model(tmp_path, model, layout) -> None:
    """Bytes saved for backward per layer (saved_tensors_hooks, bf16 on CPU, one micro-batch
    per rank) against the cost model's per-layer activation memory. Expert-parallel ranks
    receive uneven token counts; the cost model's figure is their mean."""
    one_step = {"steps": 1, "warmup": 0, "precision": "bf16", "mbs": 1, "gbs": layout.get("dp", 1)}
    cfg = make_config(model=model, **{**BASE, **one_step, **layout})
    code, metrics = launch_local(cfg, tmp_path)
    assert code == 0, metrics.message
    per_rank = [r.saved_activation_bytes_per_layer for r in metrics.memory]
    # The prediction `train` prints: this run's layout and precision, the trainer's kernels
    # (unfused; DTensor SP keeps the all-gathered inputs), not a framework's fused ones.
    predicted = prediction.predicted(cfg, "h100-sxm-80gb", "cpu")["act_bytes_per_layer"]
    assert sum(per_rank) / len(per_rank) == pytest.approx(predicted, rel=0.03)


def test_capacity_drops_the_same_tokens_with_and_without_expert_parallelism(tmp_path) -> None:
    """With a capacity factor each rank keeps the earliest assignments per expert of its own
    tokens. One process with micro-batches of two sequences sees the token groups two dp
    ranks see; dispatching to ep ranks must drop the same assignments."""
    capped = {"capacity_factor": 1.0, "mbs": 2, "gbs": 4}
    reference = _run(tmp_path / "single", "tiny-moe", **capped)
    metrics = _run(tmp_path / "ep", "tiny-moe", dp=2, ep=2, **capped)
    routing = metrics.routing
    assert routing == reference.routing
    assert routing["capacity_factor"] == 1.0
    # 4 sequences of 64 tokens, top-2, 4 layers: 2048 assignments a step, some over capacity
    assert routing["routed_per_step"] == [2048] * 3
    assert all(0 < d < 2048 for d in routing["dropped_per_step"])
    assert metrics.losses == pytest.approx(reference.losses, rel=RTOL)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "tiny-moe", "ep": 3, "dp": 3}, "ep: must divide num_experts"),
        ({"model": "tiny-moe", "ep": 4, "dp": 2}, "ep: ep*etp must divide tp*dp*cp"),
        ({"model": "tiny-llama", "ep": 2, "dp": 2}, "ep: expert parallelism needs an MoE model"),
        ({"model": "tiny-llama", "cp": 3}, "cp: 2*cp must divide seq_len"),
        ({"model": "tiny-llama", "cp": 2, "tp": 4, "sp": True, "seq_len": 20}, "sp: tp 4"),
        ({"model": "tiny-llama", "capacity_factor": 1.0}, "capacity_factor: only MoE"),
    ],
)
def test_layouts_that_cannot_run_name_the_dimension_and_the_rule(fields, message) -> None:
    with pytest.raises(UserError) as err:
        make_config(**fields)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_a_bad_expert_layout_exits_2_before_any_process_starts(tmp_path) -> None:
    done = run_cli(
        "train", "--model", "tiny-moe", "--ep", "4", "--dp", "2", "--nproc", "2",
        "--device", "cpu", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: ep: ep*etp must divide tp*dp*cp"]
    assert not (tmp_path / "rank0.json").exists()


# -- the search's layouts reach the trainer ------------------------------------------------------


def _refusals(model: str, gpus: int) -> tuple[int, dict[str, int]]:
    """(layouts the default search space proposes, the trainer's refusals among them)."""
    result = api.search(model, gpus, "h100-sxm-80gb")
    r = result.request
    refused: dict[str, int] = {}
    for _, row in result.ranked.iterrows():
        try:
            config_from_search_row(row, model, seq_len=r.seq_len, gbs=r.gbs, device="cpu")
        except UserError as exc:
            reason = str(exc).split(";")[0]
            refused[reason] = refused.get(reason, 0) + 1
    return len(result.ranked), refused


@pytest.mark.parametrize(
    ("model", "gpus"),
    [
        ("tiny-llama", 4),
        ("tiny-moe", 4),
        pytest.param("tiny-llama", 8, marks=pytest.mark.slow),
        pytest.param("tiny-moe", 8, marks=pytest.mark.slow),
    ],
)
def test_every_layout_the_search_proposes_is_accepted_by_the_trainer(model, gpus) -> None:
    proposed, refused = _refusals(model, gpus)
    assert proposed > 100
    assert refused == {}


MOE_SPACE = """\
tp: [1, 2]
pp: [1]
vp: [1]
cp: [1, 2]
ep: [1, 2]
mbs: [1]
sp: [true, false]
recompute: [none]
zero: [0]
min_tokens_per_cp_rank: 16
"""


@pytest.mark.slow
def test_a_cpu_measured_search_of_an_moe_model_over_ep_tp_cp_classifies_every_trial(
    tmp_path,
) -> None:
    """Two gloo ranks, the eight candidates (dp2 or cp2, each with ep 1 or 2; tp2 with and
    without sp, each with ep 1 or 2 folded over the tp ranks): every one is launched (none is
    recorded invalid) and each trial ends ok."""
    space = tmp_path / "space.yaml"
    space.write_text(MOE_SPACE)
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable, "-m", "autoconfig.cli", "search", "--model", "tiny-moe",
            "--gpus", "2", "--space", str(space), "--measure", "--device", "cpu",
            "--steps", "2", "--warmup", "1", "--trials", "8", "--out", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    trials = pd.read_csv(out / "trials.csv", keep_default_na=False)
    assert len(trials) == 8
    assert (trials["class"] == "ok").all(), trials[["key", "class", "reason"]].to_string()
    for part in ("-ep2-", "-cp2-", "-tp2-"):
        assert trials["key"].str.contains(part).any(), part
    assert (trials["key"].str.contains("-tp2-") & trials["key"].str.contains("-ep2-")).any()


def test_moe_experts_follow_tp_unless_etp_is_given() -> None:
    """Megatron-Core's default (etp = tp when --expert-tensor-parallel-size is absent) for MoE
    models; a dense model keeps etp 1; an etp the trainer cannot run is refused in one line."""
    assert make_config(model="tiny-moe", tp=2, dp=1, gbs=2).etp == 2
    assert make_config(model="tiny-llama", tp=2, dp=1, gbs=2).etp == 1
    for tp, etp in ((4, 2), (1, 2)):
        with pytest.raises(UserError, match=r"^etp: the bundled trainer splits experts"):
            make_config(model="tiny-moe", tp=tp, etp=etp, dp=4 // tp, gbs=4)


def test_the_trainer_predicts_the_model_it_builds() -> None:
    """A hybrid Mamba/MoE model cut to two layers is built (and predicted) as two attention +
    MoE layers: no Mamba blocks, and no block counts left over from the full depth."""
    cfg = make_config(model="nemotron-3-nano", layers=2, seq_len=128, slice=True, tp=32)
    built = cfg.trained_spec()
    assert built.mamba is None and built.mla is None
    assert built.attn_layers == built.ffn_layers == built.moe_layers == 2
    assert cfg.spec().mamba is not None  # the catalog spec itself is untouched


def test_a_slice_trains_without_sequence_parallelism_by_default(tmp_path) -> None:
    """--slice --tp T runs one device with one tp rank's shapes: sp defaults off there (it
    defaulted on with tp > 1 and refused the run)."""
    args = ["train", "--model", "tiny-llama", "--slice", "--tp", "2", "--layers", "2"]
    args += ["--seq-len", "32", "--device", "cpu", "--steps", "2", "--warmup", "1"]
    assert execute([*args, "--out", str(tmp_path / "run")]) == 0
    assert execute([*args, "--sp", "--out", str(tmp_path / "sp")]) == 2


@pytest.mark.parametrize(("model", "tp"), [("tiny-moe", 2), ("tiny-llama", 2)])
def test_a_slice_is_predicted_with_the_parameters_it_builds(model: str, tp: int) -> None:
    """A slice holds one tp rank's shapes on one device, its experts already cut by tp: the
    prediction must not cut them again by etp (it did, 64x under for a 512-expert slice)."""
    cfg = make_config(model=model, slice=True, tp=tp, layers=2, seq_len=64)
    weights = prediction.predicted(cfg, "cpu-gloo")["mem_weights_gib"] * 2**30 / 2  # 16-bit
    assert weights == pytest.approx(cfg.trained_spec().param_count(), rel=1e-6)


def test_the_trainer_prediction_exposes_the_reductions_it_makes_after_backward(
    monkeypatch,
) -> None:
    """ZeRO-1's ShardedOptimizer reduce-scatters in its step, after the whole backward, and
    torch's pipelining reduces FSDP and `replicate` stages after their last backward, while
    DDP reduces inside it: the prediction hides none of the former and some of the latter."""
    from autoconfig.columns.build import reduce_bits

    def cfg(**layout) -> TrainConfig:
        return make_config(model="llama3-8b", **{**BASE, "mbs": 1, "gbs": 64, **layout})

    flat = {"dp": 8}
    runs = [cfg(zero=1, **flat), cfg(zero=0, **flat), cfg(zero=0, pp=2, dp=4),
            cfg(zero=0, pp=2, dp=2, tp=2)]  # fmt: skip
    bits = prediction.reductions_after_backward(runs)
    assert list(bits["reduce_after_backward"]) == [reduce_bits([1])] * 4
    # DDP at tp 1 reduces in the last backward; `replicate` at tp 2 after it
    assert bits["pipeline_reduce_after_backward"][2] == reduce_bits([1, 2, 3])
    assert bits["pipeline_reduce_after_backward"][3] == reduce_bits([0, 1, 2, 3])

    def dp_comm(run: TrainConfig) -> float:
        return float(prediction.predicted(run, "h100-sxm-80gb", "cuda")["time_dp_comm_s"])

    exposed = [dp_comm(run) for run in runs]
    none = {k: v * 0 for k, v in bits.items()}
    monkeypatch.setattr(prediction, "reductions_after_backward", lambda configs: none)
    hidden = [dp_comm(run) for run in runs]
    assert exposed[0] > hidden[0] + 0.005  # ZeRO-1's reduce-scatter, whole
    assert exposed[1] == pytest.approx(hidden[1])  # DDP: inside the last backward
    assert exposed[2] == pytest.approx(hidden[2])  # DDP under the pipeline too
    assert exposed[3] > hidden[3]  # `replicate` under the pipeline: after it
