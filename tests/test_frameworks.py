"""The framework enters the model only through what it does: the layouts it can run (search leaves
the rest out and says how many; estimate refuses them naming the framework), the communication
it overlaps, and ZeRO-3's per-micro-batch weight traffic priced on the network it crosses."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from helpers import assert_user_error, make_inputs, run_cli

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.calibrate.validation import load_training_runs
from autoconfig.columns import frameworks
from autoconfig.cost import evaluate
from autoconfig.cost.inputs import (
    busiest_rank_layers,
    last_stage_layers,
    last_stage_rank,
    stage_layers,
)
from autoconfig.cost.layer import head_ops
from autoconfig.cost.memory import in_flight, memory
from autoconfig.cost.timing import _fwd_bwd, step_time
from autoconfig.report import exports
from autoconfig.rows.resolve import read_resolved
from autoconfig.spec import catalog, layout
from autoconfig.spec.schema import FrameworkSpec
from autoconfig.trainer.config import TrainConfig


def test_megatron_search_never_proposes_zero2_or_fsdp_with_pipelining() -> None:
    result = api.search("llama3-70b", 256, "h100-sxm-80gb", framework="megatron")
    table = result.table
    assert not (table["zero"] == 2).any()
    assert not ((table["zero"] == 3) & (table["pp"] > 1)).any()
    assert sum(result.left_out.values()) > 0  # and it says how many it left out


def test_megatron_export_states_expert_tensor_parallelism_when_it_differs_from_tp() -> None:
    """Megatron-Core sets expert_tensor_parallel_size to tp when the flag is absent: an MoE
    layout with experts unsplit (etp 1) under tp 4 must say so; a dense model needs no flag."""
    row = layout.plain(layout.Layout(tp=4, pp=1, dp=8, ep=8, etp=1, mbs=1).model_dump())
    moe = exports.export("megatron", row, 32, 256, 4096, "bf16", experts=64)
    assert "--expert-tensor-parallel-size 1" in moe
    assert "--expert-tensor-parallel-size" not in exports.export(
        "megatron", row, 32, 256, 4096, "bf16"
    )
    same = exports.export("megatron", row | {"etp": 4, "ep": 2}, 32, 256, 4096, "bf16", experts=64)
    assert "--expert-tensor-parallel-size" not in same


def test_composer_runs_no_pipeline_and_no_tensor_parallelism() -> None:
    table = api.search("llama3-8b", 64, "h100-sxm-80gb", framework="composer").table
    assert len(table) > 0
    assert (table["pp"] == 1).all()


def test_estimate_refuses_what_the_framework_cannot_run() -> None:
    with pytest.raises(UserError, match=r"zero: megatron .*ZeRO"):
        api.estimate("llama3-8b", 16, "h100-sxm-80gb", tp=2, pp=2, zero=2, framework="megatron")
    # torchtitan runs FSDP with pipelining
    row = api.estimate("llama3-8b", 16, "h100-sxm-80gb", tp=2, pp=2, zero=3, framework="torchtitan")
    assert row["framework"].iloc[0] == "torchtitan"


def test_overlapped_communication_is_not_charged_as_exposed() -> None:
    layout = {"tp": 8, "pp": 4, "vp": 1, "mbs": 1, "gbs": 512, "zero": 1, "sp": True}
    megatron = api.estimate("llama3-70b", 256, "h100-sxm-80gb", framework="megatron", **layout)
    plain = api.estimate("llama3-70b", 256, "h100-sxm-80gb", framework="nanotron", **layout)
    # Megatron overlaps TP communication (userbuffers) and the gradient reduce-scatter
    assert float(megatron["time_tp_comm_s"].iloc[0]) < float(plain["time_tp_comm_s"].iloc[0])
    assert float(megatron["pred_step_time_s"].iloc[0]) < float(plain["pred_step_time_s"].iloc[0])


def test_zero3_across_nodes_pays_for_its_weight_traffic() -> None:
    """gpt3-175b, ZeRO-3 on 1536 A100: each micro-batch gathers the 16-bit model (350 GB) for
    forward and again for backward and reduce-scatters its gradients. Each node must bring
    the whole model in through its eight 25 GB/s NICs for every pass (its own GPUs hold
    8/1536 of it): three passes at line rate are a floor on the step, since no layer runs
    before its weights arrive, and what the layers' own compute (one micro-batch per step)
    cannot hide stays exposed (each micro-batch's own compute, ~15 s here, hides most)."""
    row = api.estimate(
        "gpt3-175b",
        1536,
        "a100-sxm-80gb",
        zero=3,
        mbs=1,
        gbs=1536,
        seq_len=2048,
        recompute="full",
        precision="bf16",  # torchtitan trains in bf16, not fp16 (its profile; the search's rule)
        framework="torchtitan",
    ).iloc[0]
    cluster = catalog.get_gpu("a100-sxm-80gb").cluster
    node_in = cluster.gpus_per_node * cluster.inter_node_gb_s * 1e9
    passes = 3 * 350e9 / node_in
    assert float(row["pred_step_time_s"]) > passes
    # the first layer's gather and the last reduce-scatter hide behind no compute
    assert float(row["time_dp_comm_s"]) > 0.1 * passes
    assert float(row["pred_mfu"]) < 0.514  # below the best published 3D-parallel run


def test_search_ranks_3d_parallelism_above_zero3_for_175b_on_a100() -> None:
    result = api.search("gpt3-175b", 1024, "a100-sxm-80gb", framework="torchtitan")
    feasible = result.table[result.table["pred_fits"]]
    best = feasible.iloc[0]
    best_zero3_pure_dp = feasible[(feasible["zero"] == 3) & (feasible["tp"] == 1)]
    assert best["tp"] > 1 or best["pp"] > 1
    if len(best_zero3_pure_dp):
        # by what the ranking sorts on: the conservative end of each layout's spread
        key = "pred_tokens_per_s_per_gpu_low"
        ratio = best_zero3_pure_dp[key].max() / feasible[key].max()
        assert ratio < 0.9


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["search", "--model", "llama3-8b", "--gpus", "8", "--framework", "megatorn"], "framework"),
        (
            ["search", "--model", "llama3-8b", "--gpus", "8", "--framework", "megatronn"],
            "framework: unknown name 'megatronn'; closest: megatron",
        ),
        (
            ["search", "--model", "llama3-8b", "--gpus", "8", "--emit", "torchtitann"],
            "emit: unknown name 'torchtitann'; closest: torchtitan",
        ),
        (
            [
                "estimate",
                "--model",
                "llama3-8b",
                "--gpus",
                "16",
                "--tp",
                "2",
                "--pp",
                "2",
                "--zero",
                "2",
                "--framework",
                "megatron",
            ],
            "megatron",
        ),
        (["search", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h10"], "h100"),
    ],
)
def test_cli_framework_refusals_are_one_line(args: list[str], needle: str) -> None:
    assert_user_error(run_cli(*args), needle)


def test_a_framework_flag_takes_the_aliases_its_profile_lists() -> None:
    """`--framework titan` is torchtitan, as a batch row's `titan` is: the same estimate,
    which differs from the default framework's."""
    base = ["estimate", "--model", "llama3-8b", "--gpus", "8", "--zero", "3"]
    alias, name, default = (
        run_cli(*base, *extra)
        for extra in (["--framework", "titan"], ["--framework", "torchtitan"], [])
    )
    assert alias.returncode == name.returncode == default.returncode == 0, alias.stderr
    assert alias.stdout == name.stdout
    assert alias.stdout != default.stdout
    assert catalog.get_framework("titan").name == "torchtitan"


def test_resolved_unknowns_are_what_the_framework_could_run() -> None:
    """A published row that leaves ZeRO and recompute unknown is evaluated with the framework's
    choices that fit, so a layout that ran is not refused by a guessed default."""
    row = {
        "model": "llama3-405b",
        "layers": "126",
        "hidden": "16384",
        "heads": "128",
        "kv_heads": "8",
        "ffn_hidden": "53248",
        "vocab": "128256",
        "gpu": "h100-sxm-80gb",
        "num_gpus": "16384",
        "framework": "megatron",
        "tp": "8",
        "pp": "16",
        "vp": "unknown",
        "cp": "1",
        "ep": "1",
        "dp": "128",
        "sp": "unknown",
        "mbs": "1",
        "gbs": "2048",
        "seq_len": "8192",
        "recompute": "unknown",
        "zero": "unknown",
        "precision": "bf16",
        "status": "ok",
    }
    rows, _ = read_resolved(pd.DataFrame([row]))
    assert rows.errors.iloc[0] == ""
    assert bool(np.asarray(evaluate(rows.inputs())["pred_fits"])[0])


def test_unknown_recompute_recomputes_only_the_layers_it_takes_to_fit() -> None:
    """Megatron recomputes N layers per stage (--recompute-num-layers): a row that leaves
    recompute unknown gets the fewest full-recompute layers that fit, not all of them."""
    row = {
        "model": "llama3-70b",
        "layers": "80",
        "hidden": "8192",
        "heads": "64",
        "kv_heads": "8",
        "ffn_hidden": "28672",
        "vocab": "128256",
        "gpu": "h100-sxm-80gb",
        "num_gpus": "64",
        "framework": "megatron",
        "tp": "4",
        "pp": "4",
        "vp": "1",
        "cp": "1",
        "ep": "1",
        "dp": "4",
        "sp": "y",
        "mbs": "1",
        "gbs": "128",
        "seq_len": "8192",
        "recompute": "unknown",
        "zero": "1",
        "precision": "bf16",
    }
    got = api.estimate_frame(pd.DataFrame([row])).iloc[0]
    layers = int(got["resolved_recompute_layers"])
    assert got["resolved_recompute"] == "full" and 0 < layers < 20
    assert bool(got["pred_fits"])
    # One layer fewer does not fit (for one layer: recomputing none does not).
    fewer = {"recompute": "full", "recompute_layers": str(layers - 1)} if layers > 1 else {}
    stated = [
        row | {"recompute": "none"} | fewer,
        row | {"recompute": "full", "recompute_layers": "20"},
    ]
    fewer_row, every = api.estimate_frame(pd.DataFrame(stated)).itertuples()
    assert fewer_row.resolved_recompute == fewer_row.recompute  # a stated mode is honoured
    assert not fewer_row.pred_fits
    assert every.pred_tokens_per_s_per_gpu < got["pred_tokens_per_s_per_gpu"]


def test_estimate_auto_chooses_what_the_batch_resolution_chooses() -> None:
    """`estimate --auto zero,recompute,vp` and a batch row that leaves them unknown pick the
    same settings; without --auto the stated defaults are honoured (and do not fit)."""
    shape = {"tp": 4, "pp": 4, "mbs": 1, "gbs": 128, "seq_len": 8192}
    given = api.estimate("llama3-70b", 64, "h100-sxm-80gb", **shape).iloc[0]
    assert given["recompute"] == "none" and not bool(given["pred_fits"])
    auto = api.estimate(
        "llama3-70b", 64, "h100-sxm-80gb", **shape, auto=["zero", "recompute", "vp"]
    ).iloc[0]
    assert bool(auto["pred_fits"]) and auto["auto"] == "zero,recompute,vp"
    spec = catalog.get_model("llama3-70b")
    row = {
        "model": spec.name,
        "layers": spec.layers,
        "hidden": spec.hidden,
        "heads": spec.heads,
        "kv_heads": spec.kv,
        "ffn_hidden": spec.ffn,
        "vocab": spec.vocab,
        "gpu": "h100-sxm-80gb",
        "num_gpus": 64,
        "framework": "megatron",
        "dp": 4,
        "cp": 1,
        "ep": 1,
        "sp": "y",
        "vp": "unknown",
        "zero": "unknown",
        "recompute": "unknown",
        "precision": "bf16",
        **shape,
    }
    batch = api.estimate_frame(pd.DataFrame([row])).iloc[0]
    for name in ("zero", "recompute", "recompute_layers", "vp"):
        assert batch[f"resolved_{name}"] == auto[name], name
    assert batch["pred_tokens_per_s_per_gpu"] == pytest.approx(auto["pred_tokens_per_s_per_gpu"])


def test_estimate_auto_cli_says_what_it_chose_and_refuses_unknown_names() -> None:
    args = ["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "4", "--pp", "4"]
    args += ["--gbs", "128", "--seq-len", "8192"]
    done = run_cli(*args, "--auto", "zero,recompute")
    assert done.returncode == 0, done.stderr
    assert "chosen as megatron would run it: zero 1, recompute full" in done.stderr
    assert_user_error(run_cli(*args, "--auto", "zero,tp"), "auto", "recompute")
    # a setting is stated or left to the framework, not both
    assert_user_error(run_cli(*args, "--zero", "0", "--auto", "zero"), "auto", "--zero")
    assert_user_error(
        run_cli(*args, "--recompute-layers", "3", "--auto", "recompute"), "--recompute-layers"
    )


def test_a_refused_row_resolves_nothing() -> None:
    base = {"model": "llama3-70b", "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8,
            "ffn_hidden": 28672, "vocab": 128256, "gpu": "h100-sxm-80gb", "num_gpus": 64,
            "framework": "megatron", "tp": 8, "dp": 8, "cp": 1, "ep": 1, "vp": 1, "mbs": 1,
            "gbs": 128, "seq_len": 8192, "zero": "unknown", "recompute": "unknown",
            "sp": "y", "precision": "bf16"}  # fmt: skip
    out = api.estimate_frame(pd.DataFrame([base | {"pp": 1}, base | {"pp": 160}]))
    assert out["error"].tolist()[0] == "" and "pp" in out["error"].tolist()[1]
    assert out["resolved_zero"].notna().tolist() == [True, False]
    assert out["resolved_recompute"].notna().tolist() == [True, False]


def test_a_failed_nanotron_row_keeps_nanotrons_default_tensor_parallel_mode() -> None:
    """A failed run takes its framework's defaults for what it leaves unknown; nanotron's tensor
    parallelism defaults to all-reduce mode (no sequence parallelism), whose replicated norm
    and GEMM inputs need more memory than the sequence-parallel layout a run that ran may pick."""
    row = {
        "model": "llama3-8b",
        "layers": "32",
        "hidden": "4096",
        "heads": "32",
        "kv_heads": "8",
        "ffn_hidden": "14336",
        "vocab": "128256",
        "gpu": "h100-sxm-80gb",
        "num_gpus": "64",
        "framework": "nanotron",
        "tp": "8",
        "pp": "1",
        "dp": "8",
        "sp": "unknown",
        "mbs": "4",
        "gbs": "256",
        "seq_len": "4096",
        "recompute": "unknown",
        "zero": "1",
        "precision": "bf16",
    }
    failed, ran = api.estimate_frame(
        pd.DataFrame([row | {"status": "crash_or_oom"}, row | {"status": "ok"}])
    ).itertuples()
    assert not failed.resolved_sp and ran.resolved_sp
    assert failed.pred_peak_mem_gib > ran.pred_peak_mem_gib


def _nanotron_placement(
    layers: int, hidden: int, ffn: int, vocab: int, pp: int, mlp_gemms: int
) -> tuple[int, int]:
    """nanotron's block placement rank by rank, as models/base.py build_model does it: each
    block goes to the current rank, which moves on once the running cost passes its threshold.
    Returns (layers on the first rank, layers on the LM head's rank)."""
    costs = [4 * hidden**2 + mlp_gemms * ffn * hidden] * layers + [vocab * hidden]
    total, running, rank = sum(costs), 0, 0
    held, head_rank = [0] * pp, 0
    for block, cost in enumerate(costs):
        running += cost
        if block < layers:
            held[rank] += 1
        else:
            head_rank = rank
        if running > total * ((rank + 1) / pp):
            rank += 1
    return held[0], held[head_rank]


@pytest.mark.parametrize(
    "model", ["gpt3-1.3b", "gpt3-350m", "llama3-8b", "llama2-70b", "gpt3-175b", "qwen3-30b-a3b"]
)
@pytest.mark.parametrize("pp", [2, 3, 4, 8, 16, 20])
def test_nanotron_places_pipeline_blocks_by_its_compute_cost(model: str, pp: int) -> None:
    spec = catalog.get_model(model)
    # nanotron costs a gated (SwiGLU) MLP at 3 GEMMs, a GELU one at 2 (models/starcoder2.py)
    gemms = 3 if spec.mlp.value == "swiglu" else 2
    want = _nanotron_placement(spec.layers, spec.hidden, spec.ffn_hidden, spec.vocab, pp, gemms)
    x = make_inputs(model, pp=pp, cost_split=1.0)
    assert (float(stage_layers(x)), float(last_stage_layers(x))) == want
    even = make_inputs(model, pp=pp)
    assert float(stage_layers(even)) == -(-spec.layers // pp)


# The Ultra-Scale Playbook's Llama-style models; the 8B on 32 stages sits exactly on a threshold.
PLAYBOOK_SHAPES = {"1B": (16, 2048, 8192, 131072), "8B": (32, 4096, 14336, 131072)}


@pytest.mark.parametrize("name", sorted(PLAYBOOK_SHAPES))
@pytest.mark.parametrize("pp", [2, 4, 8, 16, 32])
def test_nanotron_places_the_playbook_models_as_nanotron_does(name: str, pp: int) -> None:
    layers, hidden, ffn, vocab = PLAYBOOK_SHAPES[name]
    want = _nanotron_placement(layers, hidden, ffn, vocab, pp, 3)
    shape = {"layers": layers, "hidden": hidden, "ffn": ffn, "vocab": vocab, "pp": pp}
    x = make_inputs("llama3-8b", cost_split=1.0, **shape)
    assert (float(stage_layers(x)), float(last_stage_layers(x))) == want


def test_the_head_rank_holds_the_micro_batches_its_place_in_the_pipeline_gives() -> None:
    # The 8B model on 16 stages: nanotron puts 2 layers and the head on rank 14, which holds
    # min(m, 16 - 14) = 2 micro-batches of them under 1F1B, not the last rank's one.
    layers, hidden, ffn, vocab = PLAYBOOK_SHAPES["8B"]
    shape = {"layers": layers, "hidden": hidden, "ffn": ffn, "vocab": vocab, "pp": 16.0}
    x = make_inputs("llama3-8b", cost_split=1.0, dp=1.0, gbs=64.0, **shape)
    assert float(last_stage_rank(x)) == 14.0
    assert float(in_flight(x, last_stage_rank(x))) == 2.0
    assert float(last_stage_rank(make_inputs("llama3-8b", dp=1.0, gbs=64.0, **shape))) == 15.0


def test_a_cost_split_first_rank_holds_its_extra_layers_activations() -> None:
    # llama3-8b over 2 stages: nanotron puts 18 layers on the first rank (the LM head is worth
    # about two layers), which holds two micro-batches of them under 1F1B.
    even = make_inputs("llama3-8b", gpu="h100-sxm-80gb", pp=2.0, dp=1.0, gbs=8.0)
    split = make_inputs("llama3-8b", gpu="h100-sxm-80gb", pp=2.0, dp=1.0, gbs=8.0, cost_split=1.0)
    assert float(stage_layers(split)) == 18.0
    a_even, a_split = memory(even), memory(split)
    total_even = a_even.activations + a_even.pipeline_in_flight
    total_split = a_split.activations + a_split.pipeline_in_flight
    assert float(total_split / total_even) == pytest.approx(18 / 16, rel=1e-9)


def test_a_cost_split_pipeline_runs_at_the_pace_of_its_busiest_rank() -> None:
    # With 18 layers on the first rank and 14 plus the head on the last, the first is slowest:
    # a micro-batch's stage time is 18 layers' time.
    x = make_inputs("llama3-8b", gpu="h100-sxm-80gb", pp=2.0, dp=1.0, gbs=8.0, cost_split=1.0)
    t = step_time(x)
    m = 8.0
    slot = (t.compute + t.launch + t.tp_comm) / m
    assert float(slot) == pytest.approx(18.0 * float(t.layer_fwd + t.layer_bwd), rel=1e-6)


def test_frameworks_state_how_they_cut_the_pipeline() -> None:
    def split(name: str) -> tuple[float, float, float]:
        b = frameworks.behaviour(catalog.get_framework(name), "bf16")
        return float(b.cost_split), float(b.balanced_split), float(b.ends_split)

    assert split("nanotron") == (1.0, 0.0, 0.0)
    assert split("megatron") == split("nemo") == (0.0, 0.0, 0.0)
    assert split("torchtitan") == (0.0, 0.0, 1.0)
    raw = catalog.get_framework("nanotron").model_dump()
    raw["does"]["pipeline_split"] = {"value": "balanced", "source": "a test"}
    assert float(frameworks.behaviour(FrameworkSpec.model_validate(raw), "bf16").balanced_split)
    raw["does"]["pipeline_split"] = {"value": "by_hand", "source": "a test"}
    allowed = "even, ends_as_layers, balanced or compute_cost"
    with pytest.raises(ValueError, match=f"pipeline_split must be {allowed}"):
        FrameworkSpec.model_validate(raw)


def test_frameworks_state_which_zero_stages_reduce_every_micro_batch() -> None:
    def stages(name: str) -> float:
        return float(
            frameworks.behaviour(catalog.get_framework(name), "bf16").reduce_every_micro_batch
        )

    # Megatron's schedules and nanotron's engine hold the reduction to the last micro-batch
    assert stages("megatron") == stages("nemo") == stages("nanotron") == 0.0
    assert stages("deepspeed") == 4.0  # ZeRO-2's partitioned gradients
    # FSDP: torchtitan's DDP is FSDP over the replicate mesh, Composer's ZeRO-0 FSDP NO_SHARD
    assert stages("torchtitan") == stages("composer") == 5.0
    raw = catalog.get_framework("deepspeed").model_dump()
    raw["does"]["grad_reduce_every_micro_batch"] = {"value": [3], "source": "a test"}
    with pytest.raises(ValueError, match="must list ZeRO stages among 0, 1, 2, not"):
        FrameworkSpec.model_validate(raw)


def test_frameworks_state_which_zero_stages_reduce_after_the_whole_backward() -> None:
    def stages(name: str) -> tuple[float, float]:
        b = frameworks.behaviour(catalog.get_framework(name), "bf16")
        return float(b.reduce_after_backward), float(b.pipeline_reduce_after_backward)

    # Megatron's schedules and nanotron's engine reduce inside the last backward
    for name in ("megatron", "nemo", "nanotron", "composer"):
        assert stages(name) == (0.0, 0.0)
    assert stages("deepspeed") == (0.0, 3.0)  # the pipeline engine's ReduceGrads: ZeRO-0/1
    assert stages("torchtitan") == (0.0, 13.0)  # torch's pipelining: FSDP and replicate
    raw = catalog.get_framework("deepspeed").model_dump()
    raw["does"]["grad_reduce_after_backward"] = {"value": [3], "source": "a test"}
    with pytest.raises(ValueError, match=r"grad_reduce_after_backward\n.*must list ZeRO stages"):
        FrameworkSpec.model_validate(raw)
    raw["does"]["grad_reduce_after_backward"] = {"value": [True], "source": "a test"}
    with pytest.raises(ValueError, match=r"grad_reduce_after_backward\.value"):
        FrameworkSpec.model_validate(raw)
    raw["does"]["grad_reduce_after_backward"] = {"value": [], "source": "a test"}
    raw["does"]["pipeline_grad_reduce_after_backward"] = {"value": [4], "source": "a test"}
    with pytest.raises(ValueError, match="among 0, 1, 2, 3, not"):
        FrameworkSpec.model_validate(raw)


YES_OR_NO = {
    "can": ["tensor_parallel", "pipeline", "interleaving", "interleave_needs_pp_multiple",
            "uneven_pipeline", "ends_as_layers_split", "stages_by_size", "context_parallel",
            "expert_parallel", "expert_folding", "expert_tensor_parallel", "partial_recompute"],
    "does": ["flash_attention", "overlap_grad_reduce", "overlap_param_gather", "tp_overlap",
             "p2p_overlap", "cuda_graphs", "fused_kernels", "ep_dedup", "fp8_params",
             "grad_reduce_bf16", "sp_saves_gathered", "zero2_gathers_every_micro_batch",
             "fsdp_copies", "pipeline_p2p_serial"],
}  # fmt: skip


@pytest.mark.parametrize(
    ("part", "name"), [(part, name) for part, names in YES_OR_NO.items() for name in names]
)
def test_what_a_framework_can_or_does_is_stated_true_or_false(part: str, name: str) -> None:
    raw = catalog.get_framework("torchtitan").model_dump()
    for value in ("yes", 2):
        raw[part][name] = {"value": value, "source": "a test"}
        with pytest.raises(ValueError, match=f"{name}\n.*must be true or false, not {value!r}"):
            FrameworkSpec.model_validate(raw)


def test_frameworks_on_torchs_fully_shard_copy_their_gathers_and_reductions(monkeypatch) -> None:
    def copies(name: str) -> float:
        return float(frameworks.behaviour(catalog.get_framework(name), "bf16").fsdp_copies)

    assert copies("torchtitan") == copies("megatron") == 1.0  # FSDP2 (--use-torch-fsdp2)
    # Megatron-FSDP's buckets, FSDP1's flat parameters, DeepSpeed's partitions: in place
    assert copies("nemo") == copies("composer") == copies("deepspeed") == 0.0
    # llama3-8b over 64 ranks, 4 micro-batches: 14 bytes a parameter each at the GPU's
    # effective memory bandwidth
    x = make_inputs("llama3-8b", "h100-sxm-80gb")
    copied = 4 * 14 * catalog.get_model("llama3-8b").param_count()
    expected = copied / float(x.hbm_bytes_s * x.eff_memory)
    layout = {"mbs": 1, "gbs": 256, "seq_len": 8192, "recompute": "full", "zero": 3}

    def compute() -> float:
        row = api.estimate("llama3-8b", 64, "h100-sxm-80gb", framework="torchtitan", **layout)
        return float(row["time_compute_s"].iloc[0])

    with_copies = compute()
    raw = catalog.get_framework("torchtitan").model_dump()
    raw["does"]["fsdp_copies"] = {"value": False, "source": "a test"}
    in_place = FrameworkSpec.model_validate(raw)
    monkeypatch.setattr(catalog, "get_framework", lambda name: in_place)
    assert with_copies - compute() == pytest.approx(expected, rel=0.01)


def test_deepspeed_zero2_pays_a_reduction_per_micro_batch_where_zero1_does_not() -> None:
    """The same tokens in 1 or 16 micro-batches: DeepSpeed's ZeRO-2 reduces the gradients of
    every micro-batch, its ZeRO-1 once a step, as Megatron's distributed optimizer does."""
    layout = {"tp": 8, "mbs": 1, "seq_len": 4096, "recompute": "full"}

    def dp_comm(zero: int, gbs: int, framework: str = "deepspeed") -> float:
        row = api.estimate(
            "llama3-70b", 256, "h100-sxm-80gb", zero=zero, gbs=gbs, framework=framework, **layout
        )
        return float(row["time_dp_comm_s"].iloc[0])

    assert dp_comm(1, 512) == pytest.approx(dp_comm(1, 32), rel=1e-9)
    assert dp_comm(1, 512, "megatron") == pytest.approx(dp_comm(1, 32, "megatron"), rel=1e-9)
    assert dp_comm(2, 512) > 4 * dp_comm(2, 32)


def _slot(model: str, **layout: float) -> tuple[float, float, float]:
    """(busiest stage time per micro-batch, one layer's, the head's) on h100, tp 1."""
    x = make_inputs(model, gpu="h100-sxm-80gb", dp=1.0, gbs=8.0, **layout)
    t = step_time(x)
    f_head, b_head = _fwd_bwd(x, head_ops(x), x.mbs * x.seq)
    m = 8.0
    slot = float((t.compute + t.launch + t.tp_comm) / m)
    return slot, float(t.layer_fwd + t.layer_bwd), float(f_head + b_head)


def test_each_way_of_cutting_the_pipeline_puts_the_head_where_the_framework_does() -> None:
    # llama3-8b: 32 layers, an LM head of 128k words worth almost 3 layers.
    slot, layer, head = _slot("llama3-8b", pp=4.0)
    assert slot == pytest.approx(8 * layer + head, rel=1e-6)  # even: 8 each, the head on top
    # 3 stages: 11, 11 and 10 + the head (Megatron's --decoder-last-pipeline-num-layers 10)
    slot, layer, head = _slot("llama3-8b", pp=3.0)
    assert slot == pytest.approx(max(11 * layer, 10 * layer + head), rel=1e-6)
    # the embedding and head counted as a layer each (torchtitan's default, Megatron's
    # --account-for-*): 34 units over 4 stages, so 9, 9, 8 and 7 + the head
    slot, layer, head = _slot("llama3-8b", pp=4.0, ends_split=1.0)
    assert slot == pytest.approx(max(9 * layer, 7 * layer + head), rel=1e-6)
    # placed by hand: whole layers, and no slower than the even split
    even, _, _ = _slot("llama3-8b", pp=4.0)
    slot, layer, _ = _slot("llama3-8b", pp=4.0, balanced_split=1.0)
    assert slot < even and slot / layer == pytest.approx(round(slot / layer), abs=1e-6)


def _split_row(model: str, **layout: object) -> dict:
    """A Megatron row naming a catalog model (its blank shape cells taken from the catalog)
    with its pipeline split left to the framework."""
    return {
        "model": model,
        "layers": "",
        "hidden": "",
        "heads": "",
        "vocab": "",
        "seq_len": 8192,
        "gpu": "h100-sxm-80gb",
        "framework": "megatron",
        "zero": 1,
        "mbs": 1,
        "balanced_pipeline": "",
        "pipeline_ends_as_layers": "",
        **layout,
    }


def test_a_row_stating_how_it_cut_its_pipeline_is_predicted_so() -> None:
    row = _split_row("llama3-8b", num_gpus=4, tp=1, pp=4, vp=1, gbs=8, recompute="none")
    runs = pd.DataFrame(
        [row, row | {"pipeline_ends_as_layers": "y"}, row | {"balanced_pipeline": "y"}]
    ).astype(str)
    even, counted, balanced = api.estimate_frame(runs)["pred_step_time_s"].astype(float)
    assert balanced < counted < even


def test_megatron_bridge_rows_take_their_recipes_pipeline_split(tmp_path) -> None:
    names = ["LLAMA3.1_405B", "Qwen3_235B_a22B (tokendrop)", "DeepSeekV3 (w/o MTP)", "GPT OSS 120B"]
    group = {"source_group": "Megatron-Bridge", "recompute": ""}
    rows = [group | {"run_id": n, "model": n} for n in names]
    rows.append(group | {"run_id": "x", "source_group": "NeMo", "model": "LLAMA3.1_405B"})
    rows.append(group | {"run_id": "y", "model": "Kimi_K2"})
    frame = pd.DataFrame(rows).assign(balanced_pipeline=["", "", "", "", "", "n"])
    frame.to_csv(tmp_path / "runs.csv", index=False)
    runs = load_training_runs(tmp_path / "runs.csv").set_index("run_id")
    assert runs["pipeline_ends_as_layers"].tolist() == ["y", "y", "", "", "", ""]
    assert runs["balanced_pipeline"].tolist() == ["", "", "y", "", "", "n"]  # a row's own wins


def test_a_stated_none_is_a_value_not_a_blank() -> None:
    """recompute none and position none are what the row says; blank or unknown are not."""
    row = {
        "model": "gpt3-1.3b",  # blank architecture cells take the catalog's
        "layers": "",
        "hidden": "",
        "heads": "",
        "vocab": "",
        "gpu": "a100-sxm-40gb",
        "num_gpus": "8",
        "tp": "1",
        "pp": "1",
        "dp": "8",
        "mbs": "16",
        "gbs": "256",
        "seq_len": "2048",
        "zero": "1",
        "precision": "bf16",
    }
    # Micro-batches of 16 do not fit without recompute: unknown takes what fits, none stays.
    stated, unknown = api.estimate_frame(
        pd.DataFrame(
            [row | {"recompute": "none", "position": "none"}, row | {"recompute": "unknown"}]
        )
    ).itertuples()
    assert (stated.resolved_recompute, bool(stated.pred_fits)) == ("none", False)
    assert (unknown.resolved_recompute, bool(unknown.pred_fits)) == ("full", True)
    # gpt3-1.3b has learned positions (2048 x 2048 weights): stated "none" drops them.
    learned, dropped = api.estimate_frame(pd.DataFrame([row, row | {"position": "none"}]))[
        "mem_weights_gib"
    ]
    assert learned - dropped == pytest.approx(2 * 2048 * 2048 / 2**30, rel=1e-6)


def replace_inputs(x, **cols: float):
    return dataclasses.replace(x, **{k: np.asarray(v, dtype=float) for k, v in cols.items()})


def _unrolled_layout(text: str) -> list[str]:
    """A --pipeline-model-parallel-layout string unrolled into its chunks ('(x)*n' and 'x*n'
    repeat, as Megatron-Core's parser does), each a string of E, t and L."""
    import re

    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return text.split("|")


@pytest.mark.parametrize("layers,pp,vp", [(126, 16, 4), (126, 16, 8), (94, 8, 4), (30, 4, 2)])
def test_an_interleaved_split_counting_the_ends_is_emitted_as_it_is_predicted(
    layers, pp, vp
) -> None:
    """Megatron-Core interleaves only where the chunks divide: the layers, or with the
    embedding and the loss counted as a layer each, the layers + 2. Such a layout is predicted
    with that split, and --emit writes it (a layout for Megatron-LM, the account_for flags for
    NeMo), never the even split's flags."""
    assert layers % (pp * vp) != 0 and (layers + 2) % (pp * vp) == 0
    chunks = _unrolled_layout(exports.pipeline_layout(layers, pp * vp))
    per = (layers + 2) // (pp * vp)
    assert len(chunks) == pp * vp and "".join(chunks).count("t") == layers
    assert chunks[0] == "E" + "t" * (per - 1) and chunks[-1] == "t" * (per - 1) + "L"
    assert all(c == "t" * per for c in chunks[1:-1])
    # the bundled trainer builds the same chunks, and the busiest rank holds what the cost
    # model charges (rank r holds chunks r, r + pp, ...)
    cfg = TrainConfig.model_construct(pp=pp, vp=vp)
    built = [len(cfg.stage_layer_ids(layers, c)) for c in range(pp * vp)]
    assert built == [c.count("t") for c in chunks]
    ranks = [sum(built[r::pp]) for r in range(pp)]
    assert max(ranks) == busiest_rank_layers(layers, pp, vp)
    every = [i for c in range(pp * vp) for i in cfg.stage_layer_ids(layers, c)]
    assert every == list(range(layers))  # each layer once, in order
    row = layout.plain(layout.Layout(tp=8, pp=pp, vp=vp, dp=4, mbs=1).model_dump())
    megatron = exports.export("megatron", row, layers, 4 * pp, 8192, "bf16")
    assert (
        f'--pipeline-model-parallel-layout "{exports.pipeline_layout(layers, pp * vp)}"' in megatron
    )
    assert "--num-layers-per-virtual-pipeline-stage" not in megatron
    assert "--decoder-last-pipeline-num-layers" not in megatron
    nemo = exports.export("nemo", row, layers, 4 * pp, 8192, "bf16")
    assert "account_for_embedding_in_pipeline_split = True" in nemo
    assert "account_for_loss_in_pipeline_split = True" in nemo
    assert "num_layers_in_last_pipeline_stage" not in nemo
    # multi-token prediction sits before the loss, in the last chunk
    mtp = exports.export("megatron", row, layers, 4 * pp, 8192, "bf16", mtp=1)
    assert f'{exports.pipeline_layout(layers, pp * vp)[:-1]}mL"' in mtp
    # a layout the layers alone divide keeps the even split's flags
    even = exports.export("megatron", row | {"vp": 1}, layers, 4 * pp, 8192, "bf16")
    assert "--pipeline-model-parallel-layout" not in even


def test_megatron_interleaves_llama3_405b_on_16_stages_by_counting_the_ends() -> None:
    """126 layers on 16 stages: no vp divides them, but 128 units do. Megatron and NeMo can be
    told to count the ends; the split is then the one torchtitan runs by default, and a
    framework without the option keeps the even split's chunks."""
    base = make_inputs(
        "llama3-405b", gpu="h100-sxm-80gb", tp=8.0, pp=16.0, vp=4.0, dp=8.0, gbs=128.0
    )
    told = replace_inputs(base, ends_split_to_interleave=1.0)
    counted = replace_inputs(base, ends_split=1.0)
    assert step_time(told).total == pytest.approx(step_time(counted).total, rel=1e-9)
    assert step_time(told).total < step_time(base).total
    # an explicit layout wins over it; an interleave the layers divide is left even
    balanced = replace_inputs(told, balanced_split=1.0)
    assert step_time(balanced).total == pytest.approx(
        step_time(replace_inputs(base, balanced_split=1.0)).total, rel=1e-9
    )
    # two stages: each rank holds 63 layers and one end, the last rank the head
    slot, layer, head = _slot("llama3-405b", pp=2.0, vp=2.0, ends_split_to_interleave=1.0)
    assert slot == pytest.approx(63 * layer + head, rel=1e-6)
    divides = make_inputs("llama3-405b", gpu="h100-sxm-80gb", tp=8.0, pp=9.0, vp=2.0, dp=8.0)
    assert step_time(replace_inputs(divides, ends_split_to_interleave=1.0)).total == (
        pytest.approx(step_time(divides).total, rel=1e-9)
    )
    assert [
        bool(frameworks.behaviour(catalog.get_framework(n), "bf16").ends_split_to_interleave)
        for n in ("megatron", "nemo", "deepspeed", "nanotron")
    ] == [True, True, False, False]


def test_unknown_vp_interleaves_by_counting_the_ends_unless_the_row_says_not_to() -> None:
    row = _split_row(
        "llama3-405b", num_gpus=1024, tp=8, pp=16, vp="unknown", gbs=512, recompute="full"
    )
    runs = pd.DataFrame([row, row | {"pipeline_ends_as_layers": "n"}]).astype(str)
    free, even = api.estimate_frame(runs).itertuples()
    assert int(free.resolved_vp) > 1 and (128 % (16 * int(free.resolved_vp))) == 0
    assert int(even.resolved_vp) == 1  # 126 layers: no vp divides them evenly
    assert free.pred_tokens_per_s_per_gpu > even.pred_tokens_per_s_per_gpu


def test_the_search_proposes_what_counting_the_ends_lets_megatron_interleave() -> None:
    table = api.search("llama3-405b", 2048, "h100-sxm-80gb", framework="megatron").table
    piped = table[(table["pp"] == 16) & (table["vp"] > 1)]
    assert len(piped) and (128 % (16 * piped["vp"]) == 0).all()
    # what lets the search propose them: Megatron can be told to count the ends, torchtitan's
    # own split does; a Megatron-like profile without the option cannot
    raw = catalog.get_framework("megatron").model_dump()
    raw["can"]["ends_as_layers_split"] = {"value": False, "source": "a test"}
    told = [catalog.get_framework(n) for n in ("megatron", "nemo", "torchtitan", "deepspeed")]
    told.append(FrameworkSpec.model_validate(raw))
    counts = [frameworks.counts_ends_to_interleave(f) for f in told]
    assert counts == [True, True, True, False, False]


def test_a_torchtitan_row_naming_an_interleaved_schedule_ran_two_stages_per_rank(
    tmp_path,
) -> None:
    """torchtitan builds 2 stages per rank for a multi-stage schedule unless told otherwise:
    a row that names the schedule and leaves vp blank ran that; a stated vp stays."""
    notes = ["schedule=Interleaved 1F1B; x", "schedule=1F1B", "schedule=Interleaved 1F1B"]
    frame = pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d"],
            "source_group": ["torchtitan"] * 3 + ["NeMo"],
            "model": ["m"] * 4,
            "recompute": [""] * 4,
            "vp": ["", "", "4", ""],
            "notes": [*notes, notes[0]],
        }
    )
    frame.to_csv(tmp_path / "runs.csv", index=False)
    runs = load_training_runs(tmp_path / "runs.csv").set_index("run_id")
    assert runs["vp"].tolist() == ["2", "", "4", ""]


@pytest.mark.parametrize(("layers", "pp", "vp"), [(80, 4, 2), (126, 16, 8), (32, 2, 3), (80, 4, 4)])
def test_torchtitan_is_told_its_interleaved_stages_by_their_size(layers, pp, vp) -> None:
    """torchtitan makes ceil((layers + 2) / L) stages from pipeline_parallel_layers_per_stage L
    (the embedding and the output count as a layer each); --emit gives the L that makes pp*vp
    of them, and refuses a vp above its default of 2 that no L reaches."""
    row = layout.plain(layout.Layout(tp=8, sp=True, pp=pp, vp=vp, dp=4, mbs=1, zero=0).model_dump())
    per = float(frameworks.layers_per_stage(layers, pp * vp))
    if per != per:  # NaN: no stage size makes pp*vp stages
        assert vp > 2  # the cases above that no L reaches
        with pytest.raises(UserError, match="torchtitan cannot make"):
            exports.export("torchtitan", row, layers, 4 * pp, 8192, "bf16")
        # the search leaves such a layout out and estimate refuses it
        codes = {**layout.columns(layout.frame_of(row)), "layers": layers, "gbs": 4 * pp}
        rule = frameworks.first_broken(catalog.get_framework("torchtitan"), codes)
        assert rule.startswith("vp: torchtitan cannot make pp*vp stages")
        return
    assert -(-(layers + 2) // per) == pp * vp
    toml = exports.export("torchtitan", row, layers, 4 * pp, 8192, "bf16")
    assert f"pipeline_parallel_layers_per_stage = {int(per)}" in toml
    assert 'pipeline_parallel_schedule = "Interleaved1F1B"' in toml
    one = exports.export("torchtitan", row | {"vp": 1}, layers, 4 * pp, 8192, "bf16")
    assert "layers_per_stage" not in one


def test_frameworks_state_where_they_accumulate_gradients() -> None:
    def passes(name: str) -> float:
        return float(frameworks.behaviour(catalog.get_framework(name), "bf16").grad_pass_bytes)

    # nanotron adds each bf16 gradient into an fp32 buffer: read 2 + 4, write 4 bytes
    assert passes("nanotron") == 10.0
    # Megatron's weight-gradient GEMM adds into fp32 main_grad itself
    assert passes("megatron") == passes("nemo") == 0.0


def test_deepspeed_bf16_optimizer_all_reduces_and_copies_fp32_gradients() -> None:
    """DeepSpeed's BF16_Optimizer (bf16 at ZeRO 0/1, a run's `bf16_optimizer` column; not
    DeepSpeed 0.19.8's default) adds every micro-batch's gradients into a copy of its own and
    all-reduces that whole copy at the step: against the same row without it, a gradient pass
    per micro-batch and an all-reduce where ZeRO-1 reduce-scatters; at ZeRO-2 neither."""
    fw = catalog.get_framework("deepspeed")
    assert float(frameworks.behaviour(fw, "bf16").bf16_optimizer) == 0.0  # 0.19.8's default
    assert float(fw.does.bf16_grad_pass_bytes.value) > 0
    bloom = catalog.get_model("bloom-176b")
    row = {"model": "bloom-176b", "num_gpus": 384, "gpu": "a100-sxm-80gb", "tp": 4, "pp": 12}
    row |= {k: getattr(bloom, k) for k in ("layers", "hidden", "heads", "vocab")}
    row |= {"dp": 8, "mbs": 2, "gbs": 2048, "seq_len": 2048, "sp": "n", "recompute": "full"}
    row |= {"precision": "bf16", "framework": "deepspeed", "vp": 1, "cp": 1, "ep": 1}
    unpiped = {"tp": 8, "pp": 1, "dp": 48, "mbs": 1, "gbs": 384, "zero": 2}  # no ZeRO-2 under pp
    runs = pd.DataFrame(
        [
            row | layout | {"bf16_optimizer": flag}
            for layout in ({"zero": 1}, unpiped)
            for flag in "yn"
        ]
    ).astype(str)
    out = api.estimate_frame(runs)
    assert (out["error"] == "").all(), out["error"].tolist()
    dp, compute = out["time_dp_comm_s"].astype(float), out["time_compute_s"].astype(float)
    # ZeRO-1: the whole all-reduce moves twice the reduce-scatter's bytes (the gathers of the
    # updated shards are the same)
    assert dp[0] > 1.3 * dp[1]
    assert compute[0] > 1.05 * compute[1]  # 26 bytes a parameter in each of 128 micro-batches
    # ZeRO-2 runs DeepSpeed's ZeRO optimizer whatever the column says
    assert dp[2] == pytest.approx(dp[3]) and compute[2] == pytest.approx(compute[3])


def test_a_pipeline_that_sends_and_receives_one_at_a_time_pays_twice_the_transfers() -> None:
    """DeepSpeed's and nanotron's pipeline engines send and receive one blocking transfer at a
    time (four a micro-batch); Megatron-Core and torch.distributed.pipelining batch each send
    with its receive (two). MT-NLG's layout, with and without the serial flag: the exposed
    pipeline time doubles and nothing else moves."""
    serial = {
        name: float(frameworks.behaviour(catalog.get_framework(name), "bf16").p2p_serial)
        for name in ("deepspeed", "nanotron", "megatron", "nemo", "torchtitan")
    }
    assert serial == {
        "deepspeed": 1.0, "nanotron": 1.0, "megatron": 0.0, "nemo": 0.0, "torchtitan": 0.0
    }  # fmt: skip
    layout = {"tp": 8, "pp": 35, "dp": 8, "mbs": 1, "gbs": 1920, "seq": 2048, "recompute": 2}
    plain = step_time(make_inputs("mt-nlg-530b", **layout))
    twice = step_time(make_inputs("mt-nlg-530b", p2p_serial=1.0, **layout))
    assert float(plain.pp_comm) > 0
    assert float(twice.pp_comm) == pytest.approx(2 * float(plain.pp_comm))
    assert float(twice.compute) == pytest.approx(float(plain.compute))
    assert float(twice.bubble) == pytest.approx(float(plain.bubble))
    one_stage = {**layout, "pp": 1, "dp": 280}
    assert float(step_time(make_inputs("mt-nlg-530b", p2p_serial=1.0, **one_stage)).pp_comm) == 0
