"""Mixed pools (`infer --decode-gpu`): the prefill pool on one GPU type, the decode pool on
another. Without a decode type nothing changes; with the same type on both sides the mixed path
reproduces the single-type disaggregated goodput of the same split; a memory-rich decode GPU
holds more sequences and takes more requests/s per GPU; the K/V handoff crosses the network;
the launch lines and deploy files pin each pool to its type; bad input is one line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pandas as pd
import pytest
import yaml
from helpers import assert_user_error
from helpers import run_cli as run

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.report import deploy_files, serving
from autoconfig.report.serving_flags import launch_flags, memory_share, product_label
from autoconfig.serve import goodput
from autoconfig.serve.disaggregate import disaggregated, mixed, mixed_split
from autoconfig.serve.result import ServingResult
from autoconfig.spec import catalog
from autoconfig.spec.vocab import GIB, Engine

# The searches below are shared by the module's tests: keep them on one xdist worker.
pytestmark = pytest.mark.xdist_group("mixed_pools")

H100, H200 = "h100-sxm-80gb", "h200-sxm-141gb"
# One weight and K/V format, one running-batch and token limit: a handful of layouts, every
# one simulated, so each type's pools hold the same layouts whatever its GPU count.
FEW: dict[str, Any] = dict(
    model="llama3-8b",
    precision="bf16",
    kv_precision="auto",
    max_num_seqs=(256,),
    max_num_batched_tokens=(8192,),
    requests=100,
)
# Long prompts and long answers: 3,000 + 1,000 tokens a request fill an H100's K/V cache
# before 256 sequences run, so the decode GPU's memory matters.
LONG: dict[str, Any] = dict(
    FEW, input_len=3000, output_len=1000, max_ttft_ms=3000, max_tpot_ms=25, gpus=2
)
POOL_COLUMNS = ("prefill_gpu", "decode_gpu", "spare_prefill_gpus", "decode_instance_goodput_rps")


@pytest.fixture(scope="module")
def on_h200() -> ServingResult:
    """H100 prefill, H200 decode: two GPUs each."""
    return api.infer(**LONG, gpu=H100, decode_gpu=H200, decode_gpus=2, gpu_hour_usd=(3.0, 4.5))


@pytest.fixture(scope="module")
def on_h100() -> ServingResult:
    """The same, the decode pool on H100s too (through the mixed path)."""
    return api.infer(**LONG, gpu=H100, decode_gpu=H100, decode_gpus=2)


def _layout(row: pd.Series, prefix: str = "") -> tuple:
    return tuple(
        row[f"{prefix}{c}"]
        for c in ("tp", "pp", "precision", "max_num_seqs", "max_num_batched_tokens")
    )


# -- (a) without --decode-gpu nothing changes ---------------------------------------------------


def test_without_a_decode_gpu_the_single_type_search_is_unchanged() -> None:
    """The search through api.infer is the single-type pipeline (colocated replicas, then the
    disaggregated pools built on them) value for value, with none of the mixed columns."""
    kw: dict[str, Any] = dict(FEW, input_len=4000, output_len=64, max_ttft_ms=2000, max_tpot_ms=20)
    result = api.infer(**kw, gpu=H100, gpus=4)
    assert result.decode_gpu is None and not result.mixed and result.comparison == ""
    # the same search by hand, through the pieces that predate mixed pools
    req = result.request
    part = goodput.colocated(req)
    pools = disaggregated(
        req, part.spec, part.hardware, part.workload, part.slo, part.deps, part.table, part.frames
    )
    by_hand = goodput.rank(pd.concat([part.table, pools], ignore_index=True), req)
    pd.testing.assert_frame_equal(result.table, by_hand, check_exact=True)
    assert (result.table["mode"] == "disaggregated").any()  # the pools were tried
    assert not set(POOL_COLUMNS) & set(result.table.columns)
    assert "decode_gpu" not in result.context()
    assert str(serving.mode_comparison(result)).startswith("colocated vs disaggregated")
    assert "gpu.product" not in launch_flags(result, Engine.VLLM)
    # explicit defaults are the defaults
    again = api.infer(**kw, gpu=H100, gpus=4, decode_gpu=None, decode_gpus=None, gpu_hour_usd=())
    pd.testing.assert_frame_equal(result.table, again.table, check_exact=True)


# -- (b) the same type on both sides reproduces the single-type pools --------------------------


def test_one_type_on_both_sides_reproduces_the_single_type_split() -> None:
    """The single-type search's best disaggregated deployment (x prefill instances, y decode
    instances) against the mixed path given x and y instances' worth of GPUs of the same type:
    the same per-instance goodputs, so the same deployment goodput. One GPU per node, so that
    the single-type transfer goes over the network as the mixed one always does."""
    kw: dict[str, Any] = dict(
        FEW, input_len=3000, output_len=256, max_ttft_ms=2000, max_tpot_ms=25, gpus_per_node=1
    )
    single = api.infer(**kw, gpu=H100, gpus=4)
    pools = single.table[single.table["mode"] == "disaggregated"]
    assert len(pools)
    best = pools.iloc[0]
    x, y = int(best["prefill_replicas"]), int(best["replicas"])
    prefill_gpus = x * int(best["prefill_tp"] * best["prefill_pp"])
    decode_gpus = y * int(best["tp"] * best["pp"])
    both = api.infer(
        **{**kw, "gpus": prefill_gpus}, gpu=H100, decode_gpu=H100, decode_gpus=decode_gpus
    )
    assert both.mixed and (both.table["mode"] == "disaggregated").all()
    same = both.table[
        both.table.apply(
            lambda r: (
                _layout(r, "prefill_") == _layout(best, "prefill_")
                and _layout(r) == _layout(best)
                and r["kv_precision"] == best["kv_precision"]
            ),
            axis=1,
        )
    ]
    assert len(same) == 1, both.table["label"].tolist()
    row = same.iloc[0]
    assert row["goodput_rps"] == pytest.approx(best["goodput_rps"], rel=1e-12)
    assert row["kv_transfer_ms"] == pytest.approx(best["kv_transfer_ms"], rel=1e-12)
    assert row["ttft_p90_ms"] == pytest.approx(best["ttft_p90_ms"], rel=1e-12)
    assert row["tpot_p90_ms"] == pytest.approx(best["tpot_p90_ms"], rel=1e-12)
    # The same instances, less any the other pool could not keep busy.
    assert int(row["prefill_replicas"]) <= x and int(row["replicas"]) <= y
    assert int(row["prefill_replicas"]) == x or int(row["replicas"]) == y


def test_the_split_fills_each_budget_and_trims_the_side_that_outserves() -> None:
    # 16 GPUs of 2-GPU prefill instances (8) at 3 req/s, 16 of 4-GPU decode ones (4) at 4:
    # min(24, 16) = 16 requests/s, which 6 prefill instances already reach (18).
    assert mixed_split(16, 16, 2, 4, 3.0, 4.0) == (6, 4, 16.0)
    assert mixed_split(16, 16, 4, 2, 4.0, 3.0) == (4, 6, 16.0)
    assert mixed_split(8, 8, 2, 2, 2.5, 2.5) == (4, 4, 10.0)  # balanced: nothing spare
    assert mixed_split(1, 8, 2, 2, 1.0, 1.0) is None  # no prefill instance fits the budget


# -- (c) a memory-rich decode GPU ----------------------------------------------------------------


def test_a_memory_rich_decode_gpu_holds_more_and_serves_more_per_gpu(
    on_h100: ServingResult, on_h200: ServingResult
) -> None:
    per_request = 3000 + 1000
    found, memory_bound = 0, 0
    for _, d200 in on_h200.table.iterrows():
        layout = _layout(d200)
        match = on_h100.table[on_h100.table.apply(lambda r, x=layout: _layout(r) == x, axis=1)]
        if match.empty:
            continue
        d100 = match.iloc[0]
        found += 1
        # The running batch each decode instance's cache holds (at most the limit of 256).
        held_100 = min(256, d100["kv_cache_tokens"] // per_request)
        held_200 = min(256, d200["kv_cache_tokens"] // per_request)
        assert held_200 >= held_100
        memory_bound += held_200 > held_100
        gpus = int(d200["tp"] * d200["pp"])
        assert (
            d200["decode_instance_goodput_rps"] / gpus > d100["decode_instance_goodput_rps"] / gpus
        )
        assert d200["decode_gpu"] == H200 and d100["decode_gpu"] == H100
        assert d200["prefill_gpu"] == d100["prefill_gpu"] == H100
    assert found >= 2
    assert memory_bound >= 1  # one GPU per instance: the H100's cache holds fewer than 256
    # What the decode pool gains, the deployment keeps: the best mixed one serves at least as
    # much with H200s decoding.
    assert on_h200.table.iloc[0]["goodput_rps"] >= on_h100.table.iloc[0]["goodput_rps"]
    # goodput per GPU over both budgets; per GPU used and per USD where priced
    best = on_h200.table.iloc[0]
    assert best["goodput_rps_per_gpu"] == pytest.approx(best["goodput_rps"] / 4)
    used = best["prefill_gpus_used"] + best["decode_gpus_used"]
    assert best["gpus_used"] == used <= 4
    usd = 3.0 * best["prefill_gpus_used"] + 4.5 * best["decode_gpus_used"]
    assert best["usd_per_hour"] == pytest.approx(usd)
    assert best["goodput_requests_per_usd"] == pytest.approx(3600 * best["goodput_rps"] / usd)
    assert np.isnan(on_h100.table.iloc[0]["goodput_requests_per_usd"])  # unpriced
    # ranked by goodput; of equal goodput, the one using fewer GPUs first
    met = on_h200.table[on_h200.table["meets"]]
    keys = list(zip(-met["goodput_rps_per_gpu"], met["gpus_used"], strict=True))
    assert keys == sorted(keys)
    # each type alone, for comparison, labelled with its count and type
    assert f"2 x {H100} alone" in on_h200.comparison
    assert f"2 x {H200} alone" in on_h200.comparison


# -- (d) the handoff crosses the network -------------------------------------------------------


def test_the_handoff_crosses_the_network_at_the_slower_link(on_h200: ServingResult) -> None:
    h100, h200 = catalog.get_gpu(H100), catalog.get_gpu(H200)
    link = min(h100.cluster.inter_node_gb_s, h200.cluster.inter_node_gb_s)
    assert (on_h200.table["kv_link_gb_s"] == link).all() and link < h100.cluster.intra_node_gb_s
    # Each type's pools by hand, as the search builds them (same workload, limits, settings).
    req = dataclasses.replace(
        on_h200.request, decode_gpu=None, decode_gpus=None, gpu_hour_usd=(), request_rate=None
    )
    prefill = goodput.colocated(req)
    decode = goodput.colocated(dataclasses.replace(req, gpu=H200))
    over_network = mixed(on_h200.request, prefill, decode)
    # the prompt's K/V (its p90 length), each prefill rank's shard in the prefill format
    row = over_network.iloc[0]
    table = prefill.deps.table
    (i,) = table.index[
        (table["tp"] == row["prefill_tp"])
        & (table["pp"] == row["prefill_pp"])
        & (table["precision"] == row["prefill_precision"])
        & (table["kv_precision"] == row["prefill_kv_precision"])
    ]
    token_bytes = table.at[i, "kv_cache_gib"] * GIB / table.at[i, "kv_cache_tokens"]
    prompt = float(np.percentile(req.workload.trace().input_len, 90))
    assert row["kv_transfer_ms"] == pytest.approx(1e3 * prompt * token_bytes / (link * 1e9))
    # and the search's own rows are these
    assert row["goodput_rps"] == on_h200.table.iloc[0]["goodput_rps"]

    # The single-type pools on H100s send the same bytes over NVLink (a pair of 1-GPU
    # instances shares a node): mixed pools take the network's time.
    one_type = disaggregated(
        req, prefill.spec, prefill.hardware, prefill.workload, prefill.slo, prefill.deps,
        prefill.table, prefill.frames,
    )  # fmt: skip
    a = over_network[over_network["prefill_tp"] * over_network["prefill_pp"] == 1].iloc[0]
    b = one_type[(one_type["prefill_tp"] * one_type["prefill_pp"] == 1)].iloc[0]
    ratio = h100.cluster.intra_node_gb_s / link
    assert a["kv_transfer_ms"] == pytest.approx(ratio * b["kv_transfer_ms"], rel=1e-9)
    # a decode cluster with a slower network sets the link for both pools
    slow = h200.cluster.model_copy(update={"inter_node_gb_s": link / 4})
    slower = mixed(on_h200.request, prefill, dataclasses.replace(decode, hardware=(h200, slow)))
    assert (slower["kv_link_gb_s"] == link / 4).all()
    c = slower[slower["label"] == a["label"]].iloc[0]
    assert c["kv_transfer_ms"] == pytest.approx(4 * a["kv_transfer_ms"], rel=1e-9)


# -- (e) launch lines and deploy files carry both types ----------------------------------------


@pytest.mark.parametrize("engine", [Engine.VLLM, Engine.SGLANG])
def test_deploy_files_pin_each_pool_to_its_gpu_type(on_h200: ServingResult, engine: Engine) -> None:
    best = on_h200.best
    assert best is not None and best["mode"] == "disaggregated"
    text = launch_flags(on_h200, engine)
    assert f"on 2 x {H100} (prefill) + 2 x {H200} (decode)" in text.splitlines()[0]
    prefill_at, decode_at = text.index("# prefill:"), text.index("# decode:")
    assert H100 in text[prefill_at:decode_at].splitlines()[0]
    assert H200 in text[decode_at:].splitlines()[0]
    # each pool's memory share of its own GPU's memory
    h100, h200 = catalog.get_gpu(H100), catalog.get_gpu(H200)
    flag = {Engine.VLLM: "--gpu-memory-utilization", Engine.SGLANG: "--mem-fraction-static"}
    shares = [float(part.split()[1]) for part in text.split(" \\\n") if flag[engine] in part]
    prefill = best.copy()
    prefill["kv_cache_gib"] = best["prefill_kv_cache_gib"]
    assert shares == [
        memory_share(prefill, h100.memory_gib, 0.9),
        memory_share(best, h200.memory_gib, 0.9),
    ]

    (doc,) = [d for d in yaml.safe_load_all(deploy_files.manifest(on_h200, engine)) if d]
    components = {c["name"]: c for c in doc["spec"]["components"]}
    selectors = {
        name: components[name]["podTemplate"]["spec"].get("nodeSelector")
        for name in ("Frontend", "prefill", "decode")
    }
    assert selectors == {
        "Frontend": None,  # the frontend needs no GPU
        "prefill": {"nvidia.com/gpu.product": product_label(h100)},
        "decode": {"nvidia.com/gpu.product": product_label(h200)},
    }
    assert product_label(h100) != product_label(h200)
    for name in ("prefill", "decode"):
        template = components[name]["podTemplate"]
        pod = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
        for version in ("1.31", kubernetes_validate.latest_version()):
            kubernetes_validate.validate({**pod, "template": template}, version, strict=True)
    assert components["prefill"]["replicas"] == int(best["prefill_replicas"])
    assert components["decode"]["replicas"] == int(best["replicas"])
    bench = deploy_files.bench_script(on_h200, engine)
    assert f"2 x {H100} (prefill) + 2 x {H200} (decode)" in bench


def test_an_unlabelled_gpu_gets_a_placeholder_no_node_carries() -> None:
    label = product_label(catalog.get_gpu("rtx-pro-6000-blackwell"))
    assert label.startswith("REPLACE-WITH-") and len(label) <= 63
    assert label.replace("-", "").isalnum()


def test_the_command_writes_both_types_into_its_files(tmp_path: Path) -> None:
    done = run(
        "infer", "--model", "llama3-8b", "--gpu", H100, "--gpus", "2", "--decode-gpu", H200,
        "--decode-gpus", "2", "--precision", "bf16", "--max-num-seqs", "256",
        "--max-num-batched-tokens", "8192", "--requests", "100", "--input-len", "3000",
        "--output-len", "1000", "--max-ttft-ms", "3000", "--max-tpot-ms", "25",
        "--gpu-hour-usd", "3", "--gpu-hour-usd", "4.5", "--emit", "vllm", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"2 x {H100} (prefill) + 2 x {H200} (decode)" in done.stdout
    assert "each type alone vs mixed pools" in done.stdout
    assert "requests per USD" in done.stdout
    table = pd.read_csv(tmp_path / "results.csv")
    assert (table["prefill_gpu"] == H100).all() and (table["decode_gpu"] == H200).all()
    manifest = (tmp_path / "k8s.yaml").read_text()
    assert "NVIDIA-H100-80GB-HBM3" in manifest and "NVIDIA-H200" in manifest
    best = (tmp_path / "best.json").read_text()
    assert '"decode_gpu": "h200-sxm-141gb"' in best and "each_type_vs_mixed" in best


# -- (f) bad input ------------------------------------------------------------------------------

BASE = ["infer", "--model", "llama3-8b", "--gpu", H100, "--gpus", "2", "--requests", "100"]
PAIR = ["--decode-gpu", H200, "--decode-gpus", "2"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--decode-gpus", "2"], "decode-gpu:"),
        (["--decode-gpu", H200], "decode-gpus:"),
        (["--decode-gpu", "h999", "--decode-gpus", "2"], "decode-gpu: unknown"),
        (
            [*PAIR, "--batching", "static", "--input-len", "100", "--output-len", "10"],
            "decode-gpu:",
        ),
        ([*PAIR, "--no-disaggregation"], "decode-gpu:"),
        ([*PAIR, *("--gpu-hour-usd", "1") * 3], "gpu-hour-usd:"),
        (["--gpu-hour-usd", "1"], "gpu-hour-usd:"),
        (["--decode-gpu", H200, "--decode-gpus", "0"], "decode-gpus"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(extra: list[str], field: str) -> None:
    assert_user_error(run(*BASE, *extra), field)


def test_mixed_pools_need_a_prefill_count() -> None:
    done = run(
        "infer", "--model", "llama3-8b", "--gpu", H100, "--request-rate", "10",
        "--decode-gpu", H200, "--decode-gpus", "2",
    )  # fmt: skip
    assert_user_error(done, "decode-gpu:", "--gpus")


def test_the_api_refuses_what_the_command_does() -> None:
    with pytest.raises(UserError, match=r"^decode-gpu: required"):
        api.infer("llama3-8b", 2, H100, decode_gpus=2)
    with pytest.raises(UserError, match=r"^decode-gpu: .*static"):
        api.infer(
            "llama3-8b", 2, H100, batching="static", input_len=100, output_len=10,
            decode_gpu=H200, decode_gpus=2,
        )  # fmt: skip
    # a decode type the model does not fit names the decode side
    with pytest.raises(UserError, match=r"^decode-gpus: llama3-70b does not fit"):
        api.infer(
            **{**FEW, "model": "llama3-70b"}, gpus=4, gpu=H100, decode_gpu="rtx-4090",
            decode_gpus=1,
        )  # fmt: skip
