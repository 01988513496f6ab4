"""Documents within a sequence (spec.documents): packed documents attend each within itself,
padded ones compute their padding without counting it, and the lengths come from a preset or
a CSV whose bad lines are refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autoconfig import api
from autoconfig.cost import evaluate
from autoconfig.cost.flops import model_flops_per_token
from autoconfig.cost.layer import layer_ops
from autoconfig.cost.timing import _op_times
from autoconfig.spec.documents import DocLengths, document_columns, preset, read_lengths
from tests.helpers import assert_user_error, make_inputs, run_cli

MODEL, GPU = "llama2-7b", "h100-sxm-80gb"
SEQ = 4096.0
LAYOUT = {"tp": 1.0, "pp": 1.0, "dp": 8.0, "mbs": 1.0, "gbs": 32.0, "seq": SEQ, "zero": 0.0}
# A fixed packing: documents filling one 4,096-token sequence exactly.
LENGTHS = (1000, 1500, 96, 500, 1000)


def inputs(**cols: float):
    return make_inputs(MODEL, GPU, **{**LAYOUT, **cols})


def op_flops(x, kind: str) -> float:
    """Forward FLOPs per token of the layer's ops of `kind` (attention: as costed, causal)."""
    causal = 0.5 if kind == "attention" else 1.0
    return causal * sum(float(np.asarray(op.flops)) for op in layer_ops(x) if op.kind == kind)


def test_packed_attention_is_the_sum_of_each_documents_causal_attention() -> None:
    assert sum(LENGTHS) == SEQ
    docs = DocLengths("fixed", LENGTHS, (1.0,) * len(LENGTHS))
    packed = op_flops(inputs(**docs.columns(SEQ)), "attention") * SEQ
    # each document alone, as a sequence of its own length
    alone = sum(op_flops(inputs(seq=float(n)), "attention") * n for n in LENGTHS)
    assert packed == pytest.approx(alone, rel=1e-6)
    whole = op_flops(inputs(), "attention") * SEQ
    ratio = sum(n * n for n in LENGTHS) / SEQ**2  # E[l^2] / (E[l] seq)
    assert packed == pytest.approx(ratio * whole, rel=1e-6)


def test_gemms_and_memory_ops_do_not_change() -> None:
    x, y = inputs(), inputs(**preset("squad").columns(SEQ))
    assert op_flops(y, "gemm") == op_flops(x, "gemm")
    gemm = [o.name for o in layer_ops(x) if o.kind != "attention"]
    for a, b in zip(layer_ops(x), layer_ops(y), strict=True):
        if a.name in gemm:
            assert np.array_equal(np.asarray(a.flops), np.asarray(b.flops)), a.name
            assert np.array_equal(np.asarray(a.saved), np.asarray(b.saved)), a.name
    # model FLOPs lose exactly the attention the documents do not compute
    lost = 3.0 * 32 * 2.0 * (op_flops(x, "attention") - op_flops(y, "attention"))
    drop = float(model_flops_per_token(x)) - float(model_flops_per_token(y))
    assert drop == pytest.approx(lost, rel=1e-5)
    assert evaluate(y)["pred_peak_mem_gib"] == pytest.approx(evaluate(x)["pred_peak_mem_gib"])


def test_packed_attention_is_timed_at_the_document_length() -> None:
    x, y = inputs(), inputs(**preset("squad").columns(SEQ))
    attn = next(o for o in layer_ops(x) if o.name == "attention")
    short = next(o for o in layer_ops(y) if o.name == "attention")
    (fx, _), (fy, _) = _op_times(x, attn, SEQ), _op_times(y, short, SEQ)
    # fewer FLOPs, at the short kernels' lower rate: faster, by less than the FLOPs ratio
    ratio = op_flops(y, "attention") / op_flops(x, "attention")
    assert ratio < float(fy / fx) < 1.0
    assert evaluate(y)["pred_tokens_per_s_per_gpu"] > evaluate(x)["pred_tokens_per_s_per_gpu"]


def test_unfused_attention_computes_every_score() -> None:
    plain = inputs(flash=0.0)
    packed = inputs(flash=0.0, **preset("squad").columns(SEQ))
    assert op_flops(packed, "attention") == op_flops(plain, "attention")


def test_padding_is_computed_but_not_counted() -> None:
    docs = preset("squad")
    cols = docs.columns(SEQ, packed=False)
    mean, _ = docs.moments(SEQ)
    assert cols == {"doc_len": 0.0, "useful_share": pytest.approx(mean / SEQ)}
    x, y = evaluate(inputs()), evaluate(inputs(**cols))
    assert y["pred_step_time_s"] == pytest.approx(x["pred_step_time_s"])
    assert y["pred_tokens_per_s_per_gpu"] == pytest.approx(
        x["pred_tokens_per_s_per_gpu"] * mean / SEQ
    )


def test_squad_preset_and_truncation() -> None:
    docs = preset("squad")
    mean, square = docs.moments(SEQ)
    assert mean == pytest.approx(197.5)
    assert square / mean == pytest.approx(225.95, abs=0.01)
    # documents longer than the sequence are cut to it
    long = DocLengths("long", (8192,), (1.0,))
    assert long.columns(SEQ) == {"doc_len": SEQ, "useful_share": 1.0}
    assert long.columns(SEQ, packed=False)["useful_share"] == 1.0


def test_without_documents_nothing_moves() -> None:
    base = api.estimate(MODEL, 8, GPU, seq_len=4096, gbs=32)
    assert base["task"].iloc[0] == "pretrain"
    again = api.estimate(MODEL, 8, GPU, seq_len=4096, gbs=32, doc_lengths=None)
    assert float(again["pred_step_time_s"].iloc[0]) == float(base["pred_step_time_s"].iloc[0])
    squad = api.estimate(MODEL, 8, GPU, seq_len=4096, gbs=32, doc_lengths="squad")
    assert "squad documents packed" in squad["task"].iloc[0]
    assert float(squad["pred_step_time_s"].iloc[0]) < float(base["pred_step_time_s"].iloc[0])


def test_lengths_file(tmp_path: Path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("length\n100\n300\n300\n")
    docs = read_lengths(path)
    assert docs.lengths == (100, 300) and docs.weights == (1.0, 2.0)
    workload = tmp_path / "workload.csv"
    workload.write_text("input_len,output_len\n90,10\n250,50\n")
    assert read_lengths(workload).lengths == (100, 300)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("length\n100\nabc\n5\n", "line 3"),
        ("length\n100\n200\n0\n", "line 4"),
        ("length\n", "no lengths"),
        ("size\n100\n", "line 1"),
    ],
)
def test_bad_lengths_file_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    done = run_cli(
        "estimate", "--model", MODEL, "--gpus", "8", "--seq-len", "4096", "--doc-lengths", str(path)
    )
    assert_user_error(done, "doc-lengths", str(path), needle)
    done = run_cli("search", "--model", MODEL, "--gpus", "8", "--doc-lengths", str(path))
    assert_user_error(done, "doc-lengths", needle)


def test_cli_estimate_with_a_preset() -> None:
    done = run_cli(
        "estimate", "--model", MODEL, "--gpus", "8", "--seq-len", "4096", "--doc-lengths", "squad"
    )
    assert done.returncode in (0, 1), done.stderr


def test_runs_columns() -> None:
    row = {
        "model": MODEL,
        "layers": "32",
        "hidden": "4096",
        "heads": "32",
        "vocab": "32000",
        "seq_len": "4096",
        "gpu": GPU,
        "num_gpus": "8",
        "tp": "1",
        "pp": "1",
        "gbs": "32",
    }
    runs = pd.DataFrame(
        [
            {**row, "doc_lengths": "", "packed": ""},
            {**row, "doc_lengths": "squad", "packed": "y (SQuAD packed to 4096)"},
            {**row, "doc_lengths": "256", "packed": "n"},
            {**row, "doc_lengths": "long", "packed": ""},
        ]
    )
    out = api.estimate_frame(runs)
    tps = out["pred_tokens_per_s_per_gpu"].astype(float)
    assert tps[1] > tps[0]
    assert tps[2] == pytest.approx(tps[0] * 256 / 4096, rel=1e-4)
    assert "doc_lengths" in out["error"].iloc[3]
    assert document_columns("squad", SEQ, None)["doc_len"] == pytest.approx(225.95, abs=0.01)
