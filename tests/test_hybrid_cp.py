"""Dynamic (hybrid) context parallelism over packed documents (cost/hybrid_cp.py): the ranks a
document takes, the length classes, each document's own pass summed into the step, the
layouts and frameworks that refuse it, the search's twins and the launch flags."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.columns import frameworks
from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.cost import evaluate, hybrid_cp
from autoconfig.layout_search import run as search_run
from autoconfig.report import exports
from autoconfig.spec import layout
from autoconfig.spec.documents import DocLengths, fixed

SEQ = 131072
# mostly short documents with a long tail: what static CP sized for the longest wastes on
LONG_TAIL = DocLengths("long-tail", (1024, 4096, 8192, 32768, 131072), (400, 200, 60, 10, 2))


def _estimate(docs: DocLengths, hybrid: bool, **extra: object) -> pd.Series:
    args = {"tp": 4, "cp": 16, "gbs": 32, "seq_len": SEQ, **extra}
    return api.estimate(
        "llama3-8b", 128, "h100-sxm-80gb", task="sft", doc_lengths=docs, hybrid_cp=hybrid,
        framework="megatron", **args,
    ).iloc[0]  # fmt: skip


def test_ranks_follow_megatrons_gpus_needed() -> None:
    # capacity seq / cp = 8192 tokens: 2**ceil(log2(L / 8192)), at least 1, at most cp
    lengths = np.array([100.0, 8192.0, 8193.0, 16384.0, 20000.0, 65536.0, SEQ])
    got = hybrid_cp.ranks_needed(lengths, np.float64(SEQ), np.float64(16.0))
    assert got.tolist() == [1.0, 1.0, 2.0, 2.0, 4.0, 8.0, 16.0]


def test_length_classes_keep_the_documents_and_their_tokens() -> None:
    rng = np.random.default_rng(0)
    lengths = tuple(int(v) for v in rng.integers(100, 200_000, 3000))
    docs = DocLengths("many", lengths, tuple(1.0 for _ in lengths))
    classes = docs.classes(SEQ)
    assert 1 < len(classes) <= 24 + 12  # log bins, plus edges where ranks double
    shares = np.array([c[1] for c in classes])
    means = np.array([c[0] for c in classes])
    assert shares.sum() == pytest.approx(1.0)
    assert float(shares @ means) == pytest.approx(docs.moments(SEQ)[0])  # tokens kept
    assert means.max() <= SEQ  # truncated to the sequence


def test_static_layouts_are_unchanged_by_the_classes() -> None:
    req = search_run.make_request(
        "llama3-8b", 128, "h100-sxm-80gb", seq_len=SEQ, gbs=32, task="sft", doc_lengths=LONG_TAIL
    )
    assert req.task.doc_classes  # the request carries them; static CP ignores them
    does = frameworks.behaviour(req.framework, req.precision, 1.0, req.task)
    run = layout.frame_of([layout.plain(layout.Layout(dp=2, tp=4, cp=16, sp=True).model_dump())])
    hardware = Hardware(req.gpu, req.cluster, req.precision)
    with_classes = evaluate(training_inputs(req.model, hardware, run, 32, SEQ, does))
    without = evaluate(
        training_inputs(
            req.model, hardware, run, 32, SEQ, replace(does, doc_classes=np.zeros((0, 2)))
        )
    )
    assert with_classes["time_cp_comm_s"][0] > 0.1  # ring hops across nodes, exposed
    for key in ("pred_step_time_s", "pred_peak_mem_gib", "time_cp_comm_s"):
        assert with_classes[key][0] == without[key][0]


def test_documents_as_long_as_the_sequence_time_as_static_cp() -> None:
    # every document needs all cp ranks: one pass per sequence, static CP with mbs 1
    whole = fixed(SEQ)
    static, dynamic = _estimate(whole, False), _estimate(whole, True)
    assert dynamic["pred_step_time_s"] == pytest.approx(static["pred_step_time_s"], rel=1e-6)
    assert dynamic["pred_peak_mem_gib"] == static["pred_peak_mem_gib"]


def test_short_documents_skip_the_ring_and_run_faster() -> None:
    static, dynamic = _estimate(LONG_TAIL, False), _estimate(LONG_TAIL, True)
    assert dynamic["time_cp_comm_s"] < 0.2 * static["time_cp_comm_s"]
    assert dynamic["pred_tokens_per_s_per_gpu"] > 1.1 * static["pred_tokens_per_s_per_gpu"]
    # the same ranks hold at most seq / cp tokens a pass: memory is the layout's own
    assert dynamic["pred_peak_mem_gib"] == static["pred_peak_mem_gib"]


def test_many_tiny_documents_pay_a_pass_each() -> None:
    # 256-token documents at cp 2: each is its own forward and backward of 32 tokens a GPU
    # at tp 8 (small GEMMs, every kernel's fixed cost), so dynamic CP loses to the static
    # ring that runs them packed 8,192 tokens a pass, though it drops the ring
    tiny = fixed(256)
    static, dynamic = (_estimate(tiny, h, tp=8, cp=2, seq_len=16384, gbs=64) for h in (False, True))
    assert dynamic["time_cp_comm_s"] == 0.0 < static["time_cp_comm_s"]
    assert dynamic["time_compute_s"] > 2.0 * static["time_compute_s"]
    assert dynamic["pred_tokens_per_s_per_gpu"] < static["pred_tokens_per_s_per_gpu"]


def test_length_classes_split_where_a_document_needs_more_ranks() -> None:
    # at seq 65,536 a document over 4,096 tokens needs twice the ranks of one of 4,096 at
    # cp 16 (capacity 4,096): one class may not hold both
    docs = DocLengths("edge", (3000, 4096, 4097, 5000), (1.0, 1.0, 1.0, 1.0))
    classes = docs.classes(65536, most=2)  # log edges 3,000, 3,873, 5,000; 4,096 added
    assert [round(m, 6) for m, _ in classes] == [3000.0, 4096.0, 4548.5]
    assert [s for _, s in classes] == pytest.approx([0.25, 0.25, 0.5])


def test_each_document_is_padded_to_the_split_megatron_requires() -> None:
    # tp 2 with sp, cp 4, dp 2: documents pad to a multiple of 2 x dp x cp x tp = 32 tokens, so
    # 100-token documents run 128-token passes: 1.28x as many passes of the same cost as
    # 128-token documents carry the same tokens
    args = {"tp": 2, "cp": 4, "seq_len": 8192, "gbs": 16}
    once = ("time_dp_comm_s", "time_optimizer_s", "time_offload_s")

    def passes_s(docs: DocLengths) -> float:
        row = api.estimate(
            "llama3-8b", 16, "h100-sxm-80gb", task="sft", doc_lengths=docs, hybrid_cp=True,
            framework="megatron", **args,
        ).iloc[0]  # fmt: skip
        return float(row["pred_step_time_s"] - sum(row[k] for k in once))

    assert passes_s(fixed(100)) == pytest.approx(1.28 * passes_s(fixed(128)), rel=1e-9)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--gpus", "12", "--cp", "3", "--seq-len", "12288"), ("hybrid_cp", "power of two")),
        (("--gpus", "16", "--cp", "4", "--mbs", "2"), ("hybrid_cp", "mbs 1")),
    ],
)
def test_layouts_megatron_cannot_split_are_refused(
    args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    base = ["--model", "llama3-8b", "--tp", "2", "--gbs", "16", "--task", "sft"]
    result = run(
        "estimate", *base, "--doc-lengths", "squad", "--hybrid-cp", *(
            a for a in args
        ), *([] if "--seq-len" in args else ["--seq-len", "16384"]),
    )  # fmt: skip
    assert_user_error(result, *needles)


def test_expert_parallelism_is_refused() -> None:
    result = run(
        "estimate", "--model", "mixtral-8x7b", "--gpus", "32", "--tp", "2", "--cp", "4",
        "--ep", "2", "--seq-len", "16384", "--gbs", "16", "--task", "sft",
        "--doc-lengths", "squad", "--hybrid-cp",
    )  # fmt: skip
    assert_user_error(result, "hybrid_cp", "expert parallelism")


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        ((), ("hybrid_cp", "--doc-lengths")),
        (("--doc-lengths", "squad", "--framework", "nemo"), ("hybrid_cp", "nemo")),
        (("--doc-lengths", "squad", "--pp", "2"), ("hybrid_cp", "pp 1")),
        (("--doc-lengths", "squad", "--zero", "3"), ("hybrid_cp", "ZeRO 0 or 1")),
    ],
)
def test_where_it_cannot_run_is_one_line(extra: tuple[str, ...], needles: tuple[str, ...]) -> None:
    result = run(
        "estimate", "--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--cp", "4",
        "--seq-len", "16384", "--gbs", "16", "--task", "sft", "--hybrid-cp", *extra,
    )  # fmt: skip
    assert_user_error(result, *needles)


def test_multi_latent_attention_refuses_it() -> None:
    with pytest.raises(UserError, match="hybrid_cp: deepseek-v3's multi-latent attention"):
        search_run.make_request(
            "deepseek-v3", 256, "h100-sxm-80gb", seq_len=16384, task="sft",
            doc_lengths="squad", fix={"hybrid_cp": True},
        )  # fmt: skip


def test_the_search_ranks_a_dynamic_twin_beside_each_cp_layout() -> None:
    def table(**kwargs: object) -> pd.DataFrame:
        req = search_run.make_request(
            "llama3-8b", 128, "h100-sxm-80gb", seq_len=SEQ, gbs=32, task="sft",
            framework="megatron", **kwargs,
        )  # fmt: skip
        return search_run.evaluate_all(req).table

    packed = table(doc_lengths=LONG_TAIL)
    twins = packed[packed["hybrid_cp"]]
    assert len(twins) > 0
    assert (twins["cp"] > 1).all() and (twins["pp"] == 1).all() and (twins["zero"] <= 1).all()
    assert not table()["hybrid_cp"].any()  # whole sequences: nothing to split by length
    fixed_on = table(doc_lengths=LONG_TAIL, fix={"hybrid_cp": True})
    assert fixed_on["hybrid_cp"].all()


def test_megatron_flags_name_the_rank_capacity() -> None:
    row = layout.plain(
        layout.Layout(dp=2, tp=4, cp=16, sp=True, zero=1, hybrid_cp=True).model_dump()
    )
    text = exports.export("megatron", row, 32, 32, SEQ, "bf16")
    assert "--hybrid-context-parallel" in text
    assert f"--max-seqlen-per-dp-cp-rank {SEQ // 16}" in text
    static = exports.export("megatron", {**row, "hybrid_cp": False}, 32, 32, SEQ, "bf16")
    assert "hybrid" not in static and "max-seqlen" not in static


def test_advice_offers_no_change_dynamic_cp_cannot_run() -> None:
    req = search_run.make_request(
        "llama3-8b", 128, "h100-sxm-80gb", seq_len=SEQ, gbs=32, task="sft",
        framework="megatron", doc_lengths=LONG_TAIL, fix={"hybrid_cp": True}, max_memory_gib=8.0,
    )  # fmt: skip
    result = search_run.run(req)
    assert not result.feasible
    closest = [line for line in result.advice if line.startswith("closest:")]
    assert closest and " hcp " in closest[0]
    # ZeRO-3 would shrink it, but dynamic CP runs with ZeRO 0 or 1 only (spec.layout.rules)
    assert not any("ZeRO-3" in line for line in result.advice)


@pytest.mark.parametrize("fixed", ["zero=3", "pp=2", "cp=3", "mbs=2", "activation_offload=true"])
def test_a_fix_beside_it_that_it_cannot_run_is_named(fixed: str) -> None:
    result = run(
        "search", "--model", "llama3-8b", "--gpus", "16", "--seq-len", "12288", "--task", "sft",
        "--doc-lengths", "squad", "--fix", "hybrid_cp=true", "--fix", fixed,
    )  # fmt: skip
    assert_user_error(result, "hybrid_cp", fixed.split("=")[0] + "=")
