"""Primus (AMD's Megatron-LM on ROCm) as a framework of its own: its profile is Megatron's but
where ROCm differs, the search runs it on AMD GPUs, and `--emit primus` writes a Primus
experiment YAML whose overrides are the Megatron flags of the same layout in snake case."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.report import exports, primus_export
from autoconfig.spec import catalog, layout
from autoconfig.spec.schema import FrameworkSpec

PROFILE = Path(__file__).resolve().parent.parent / "autoconfig/profiles/frameworks/primus.yaml"
SEARCH = ["search", "--model", "llama3-70b", "--gpus", "64", "--gpu", "mi300x"]

# What the Primus profile states differently from Megatron's, and nothing else.
DIFFERS = {
    ("can", "precisions"),
    ("does", "tp_overlap"),
    # Megatron-Core features whose presence in Primus's Megatron-LM build is not checked
    ("can", "activation_offload"),
    ("can", "hybrid_context_parallel"),
}


def test_the_profile_loads_and_differs_from_megatron_only_where_rocm_does() -> None:
    primus = FrameworkSpec.model_validate(yaml.safe_load(PROFILE.read_text()))
    assert catalog.get_framework("primus") == primus
    assert catalog.get_framework("primus-megatron").name == "primus"
    megatron = catalog.get_framework("megatron")
    for part in ("can", "does"):
        ours, theirs = getattr(primus, part), getattr(megatron, part)
        for name in type(ours).model_fields:
            same = getattr(ours, name).value == getattr(theirs, name).value
            assert same != ((part, name) in DIFFERS), f"{part}.{name}"
    assert primus.allows("precisions") == ["bf16", "fp16", "fp8"]
    assert primus.does.tp_overlap.value is False and primus.does.cuda_graphs.value is False
    assert primus.defaults == megatron.defaults
    assert "as recalled" in primus.source
    assert "as recalled" in primus.can.precisions.source
    assert "as recalled" in primus.does.tp_overlap.source


def test_a_search_on_mi300x_proposes_layouts_and_charges_tp_unoverlapped() -> None:
    result = api.search("llama3-70b", 64, "mi300x", framework="primus")
    assert result.best is not None and result.feasible
    assert result.request.framework.name == "primus"
    fixed = {"tp": 8, "pp": 2, "vp": 1, "mbs": 1, "gbs": 512, "zero": 1, "sp": True}
    primus = api.estimate("llama3-70b", 64, "mi300x", framework="primus", **fixed)
    megatron = api.estimate("llama3-70b", 64, "mi300x", framework="megatron", **fixed)
    # no userbuffers on ROCm: the TP collectives are not hidden behind the GEMMs
    assert float(primus["time_tp_comm_s"].iloc[0]) > float(megatron["time_tp_comm_s"].iloc[0])


def _megatron_overrides(text: str) -> dict:
    """The Megatron export's flags as Primus names them, read apart from primus_export: each
    --flag in snake case (--fp8-format stores into `fp8`), a bare switch true, a number as a
    number; less --tp-comm-overlap, which the Primus profile does not do."""
    out: dict = {}
    words = shlex.split(text.replace("\\\n", " "))
    for i, word in enumerate(words):
        if not word.startswith("--") or word == "--tp-comm-overlap":
            continue
        name = "fp8" if word == "--fp8-format" else word[2:].replace("-", "_")
        nxt = words[i + 1] if i + 1 < len(words) else "--"
        if nxt.startswith("--"):
            out[name] = True
        else:
            out[name] = yaml.safe_load(nxt) if nxt.replace(".", "").isdigit() else nxt
    return out


def _experiment(text: str) -> dict:
    tree = yaml.safe_load(text)
    pre = tree["modules"]["pre_trainer"]
    assert (pre["framework"], pre["config"], pre["model"]) == (
        "megatron",
        "pre_trainer.yaml",
        "<model>.yaml",
    )
    assert {"work_group", "user_name", "exp_name"} <= set(tree)
    return pre["overrides"]


def _row(**dims) -> dict:
    return layout.plain(layout.Layout(**dims).model_dump())


ROWS = {
    "dense, sp": (_row(dp=4, tp=8, pp=2, vp=4, sp=True, mbs=1, zero=1), 80, 0, "bf16"),
    "uneven, fp8": (_row(dp=2, tp=4, pp=3, mbs=2, zero=1, sp=True), 80, 0, "fp8"),
    "ends as layers": (_row(dp=1, tp=8, pp=8, vp=2, zero=1, sp=True), 126, 0, "bf16"),
    "moe, etp": (_row(dp=8, tp=4, ep=8, etp=1, sp=True, mbs=1, zero=1), 32, 8, "bf16"),
    "recompute, state": (
        _row(dp=8, tp=2, pp=2, recompute="full", recompute_layers=3, optimizer_state="bf16"),
        32,
        0,
        "fp16",
    ),
    "fsdp": (_row(dp=16, zero=3, sp=False, mbs=1), 32, 0, "bf16"),
    "offload": (_row(dp=16, zero=1, offload="optimizer"), 32, 0, "bf16"),
}  # fmt: skip


@pytest.mark.parametrize("case", ROWS)
def test_the_overrides_are_the_megatron_flags_in_snake_case(case: str) -> None:
    row, layers, experts, precision = ROWS[case]
    gbs = 8 * row["dp"] * row["mbs"] * max(row["pp"], 1)
    megatron = exports.export("megatron", row, layers, gbs, 4096, precision, experts=experts)
    primus = exports.export("primus", row, layers, gbs, 4096, precision, experts=experts)
    assert _experiment(primus) == _megatron_overrides(megatron)
    assert "tp_comm_overlap" not in _experiment(primus)
    first, launch, *_ = primus.splitlines()
    assert first.startswith("# Primus") and "EXP=primus_experiment.yaml" in launch
    assert launch.endswith("bash ./examples/run_pretrain.sh")


def test_quoted_values_stay_strings_and_switches_are_true() -> None:
    row, layers, *_ = ROWS["ends as layers"]
    overrides = _experiment(exports.export("primus", row, layers, 64, 4096, "bf16"))
    assert overrides["sequence_parallel"] is True
    assert overrides["pipeline_model_parallel_layout"] == exports.pipeline_layout(126, 16)
    assert isinstance(overrides["tensor_model_parallel_size"], int)
    fp8 = _experiment(exports.export("primus", *ROWS["uneven, fp8"][:2], 48, 4096, "fp8"))
    assert fp8["fp8"] == "hybrid" and fp8["bf16"] is True
    assert fp8["decoder_last_pipeline_num_layers"] == 26


def test_the_cli_prints_the_experiment_of_the_best_layout() -> None:
    done = run(*SEARCH, "--framework", "primus", "--emit", "primus")
    assert done.returncode == 0, done.stderr
    text = done.stdout[done.stdout.index("# Primus") :]
    overrides = _experiment(text)
    assert "tensor_model_parallel_size" in overrides and "global_batch_size" in overrides
    assert "NNODES=8" in text.splitlines()[1]


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (["recipe.trainer.strategy.tensor_model_parallel_size = 8"], "is not a --flag"),
        (["--no-gradient-accumulation-fusion"], "--no-gradient-accumulation-fusion"),
        (["--moe-layer-freq 1 2"], "more than one value"),
        (['--pipeline-model-parallel-layout "Et|tL'], "No closing quotation"),
        (["--micro-batch-size 1", "--micro-batch-size 2"], "micro_batch_size is already 1"),
        (["--seq-length=4096"], "not a flag and a value apart"),
    ],
)
def test_a_line_that_is_not_flags_and_values_refuses_the_export(lines, needle) -> None:
    with pytest.raises(UserError) as refused:
        primus_export.experiment(lines, catalog.get_framework("primus"), "bf16", 8)
    message = str(refused.value)
    assert message.startswith("emit: primus cannot write Megatron's") and needle in message
    assert "\n" not in message


def test_what_primus_cannot_run_is_one_line_naming_the_field() -> None:
    # mi355x has mxfp8 tensor cores; Primus's profile does not list the format
    mxfp8 = ["--gpu", "mi355x", "--framework", "primus", "--precision", "mxfp8"]
    done = run("estimate", *SEARCH[1:5], "--tp", "8", "--pp", "2", *mxfp8)
    assert_user_error(done, "precision: primus trains in bf16, fp16, fp8, not mxfp8")
    # the search says what it searches first, then refuses with the same line
    done = run(*SEARCH[:5], *mxfp8)
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1].endswith("primus trains in bf16, fp16, fp8, not mxfp8")
    )
    with pytest.raises(UserError, match="emit: primus trains in bf16, fp16, fp8, not nvfp4"):
        exports.export("primus", ROWS["dense, sp"][0], 80, 64, 4096, "nvfp4")
    with pytest.raises(UserError, match="emit: 12 GPUs do not fill whole nodes of 8"):
        exports.export("primus", _row(dp=12, zero=1), 32, 48, 4096, "bf16")
