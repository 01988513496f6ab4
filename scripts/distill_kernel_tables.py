"""Distil aiconfigurator-core's measured kernel latencies into the small per-chip tables autoconfig
ships under autoconfig/profiles/kernels/<chip>/ (GEMM and attention achieved TFLOP/s, NCCL times).

Data provenance only: autoconfig never imports aiconfigurator-core; this script runs under a Python
that has it (plus pandas, pyarrow, pyyaml) and writes plain files that the package then ships.

    python scripts/distill_kernel_tables.py [--source DIR] [--out DIR] [--chips a100,h100,...]

aiconfigurator-core (NVIDIA, Apache-2.0) stores per GPU, per op, per engine and engine version a
parquet table of measured latencies in milliseconds. Choices, per chip:

- GEMM bf16: TensorRT-LLM's PyTorch flow ("torch_flow"), whose unquantized Linear calls
  torch.nn.functional.linear, i.e. cuBLAS, as a training framework's bf16 linear does.
- GEMM fp8: the same flow's per-tensor-scaled fp8 Linear, a cuBLASLt fp8 GEMM
  (trtllm.cublas_scaled_mm): the kernel family Transformer Engine's per-tensor (delayed or
  current) scaling recipes call; vLLM's CutlassFP8ScaledMM and SGLang's fp8_scaled_mm are CUTLASS.
- GEMM fp8_block (1x128 activation, 128x128 weight scales, DeepSeek-V3's training recipe):
  DeepGEMM where measured (TensorRT-LLM's "deepgemm" on Blackwell, SGLang's DeepGEMM on Hopper),
  else TensorRT-LLM's own blockwise kernel.
- GEMM nvfp4: TensorRT-LLM's nvfp4 Linear (its nvfp4_gemm picks among cuBLASLt and CUTLASS).
- Attention: FlashAttention's forward through vLLM (FA3 on Hopper, FA2 on Ampere and on the
  RTX PRO 6000); on Blackwell data-centre parts, where no FlashAttention was measured,
  TensorRT-LLM's own context FMHA. bf16 inputs and KV, no sliding window.
- NCCL: the newest nccl-version folder, dtype half.
- The serving engines' own TP all-reduce (TensorRT-LLM's, vLLM's custom all-reduce in a CUDA
  graph and eagerly, SGLang's), each from the newest version that measured it, bf16.
- MoE: TensorRT-LLM's fused MoE layer (routing's permute, the grouped expert GEMMs, activation,
  unpermute; no all-to-all), per dtype and gating from the newest version that measured it,
  under balanced routing (every expert gets the same tokens), at the model shapes measured
  (hidden, expert FFN, experts, top-k) and the expert TP / EP splits with one of them 1.

The newest engine version that holds the wanted kernel is used. Each table becomes a full regular
grid; a grid point the source did not measure is filled from its nearest measured neighbours in
log space (linear in log of the value over log2 of the coordinate, along one axis at a time,
constant beyond the last measured point) and counted in provenance.yaml.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

# Our GPU profiles' `chip` -> the package's system folder. gb202 is the RTX PRO 6000 Blackwell's
# die (the profile rtx-pro-6000-blackwell says chip: gb202). h200, gb200 and gb300 are measured
# separately from the chip their profiles name (h100, b200, b300) and ship under their own names.
CHIPS = {
    "a100": "a100_sxm",
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "b300": "b300_sxm",
    "gb200": "gb200",
    "gb300": "gb300",
    "gb202": "rtx_pro_6000_server",
}

DEEPGEMM = "DeepGEMM blockwise fp8 (1x128 activation, 128x128 weight scales), DeepSeek-V3's recipe"
# dtype -> (engine, kernel_source, gemm_dtype) in order of preference, with the reason.
GEMM_SOURCES: dict[str, list[tuple[str, str, str, str]]] = {
    "bf16": [
        (
            "trtllm",
            "torch_flow",
            "bfloat16",
            "torch.nn.functional.linear (cuBLAS), as a training framework's bf16 linear",
        ),
        ("vllm", "torch.nn.functional.linear", "bfloat16", "torch.nn.functional.linear (cuBLAS)"),
    ],
    "fp8": [
        (
            "trtllm",
            "torch_flow",
            "fp8",
            "per-tensor-scaled fp8 through cuBLASLt (trtllm.cublas_scaled_mm), the kernel family "
            "Transformer Engine's per-tensor scaling recipes call (vLLM/SGLang measured CUTLASS "
            "kernels instead)",
        ),
    ],
    "fp8_block": [
        ("trtllm", "deepgemm", "fp8_block", DEEPGEMM),
        ("sglang", "sglang_deepgemm_gemm_nt_f8f8bf16", "fp8_block", DEEPGEMM),
        (
            "trtllm",
            "torch_flow",
            "fp8_block",
            "TensorRT-LLM's blockwise fp8 GEMM (1x128 / 128x128 scales; no DeepGEMM here)",
        ),
    ],
    "nvfp4": [
        (
            "trtllm",
            "torch_flow",
            "nvfp4",
            "NVFP4 (16-element blocks, fp8 scales) through trtllm.nvfp4_gemm, which picks among "
            "cuBLASLt and CUTLASS kernels",
        ),
    ],
}

# (engine, kernel_source, reason) in order of preference.
ATTENTION_SOURCES: list[tuple[str, str, str]] = [
    ("vllm", "vllm_flash_attn_fa3", "FlashAttention-3 forward (vLLM's flash-attn build, Hopper)"),
    ("vllm", "vllm_flash_attn", "FlashAttention-2 forward (vLLM's flash-attn build on Ampere)"),
    ("vllm", "vllm_flash_attn_fa2", "FlashAttention-2 forward (vLLM's flash-attn build)"),
    (
        "trtllm",
        "torch_flow",
        "TensorRT-LLM's context FMHA (no FlashAttention measured on this chip)",
    ),
]

# The serving engines' own TP all-reduce (comm/<engine>/<version>/custom_allreduce_perf.parquet):
# key -> (engine folder, (column, value) rows to keep or None, what was measured).
ENGINE_ALLREDUCE: dict[str, tuple[str, tuple[str, str] | None, str]] = {
    "trtllm": ("trtllm", ("kernel_source", "TRTLLM"), "TensorRT-LLM's own all-reduce kernels"),
    "vllm": (
        "vllm",
        ("backend", "vllm_graph"),
        "vLLM's custom all-reduce, captured in a CUDA graph as its decode runs it",
    ),
    "vllm_eager": (
        "vllm",
        ("backend", "vllm_eager"),
        "vLLM's custom all-reduce launched eagerly (no CUDA graph): the launch cost included",
    ),
    "sglang": (
        "sglang",
        ("backend", "sglang_graph"),
        "SGLang's custom all-reduce, captured in a CUDA graph as its decode runs it",
    ),
}

# MoE: dtype -> (kernel_source, moe_dtype, what) in order of preference for gated (SwiGLU)
# experts; non-gated ones (squared ReLU, Nemotron-H) have their own kernel (NONGATED_SOURCE).
MOE_SOURCES: dict[str, list[tuple[str, str, str]]] = {
    "bf16": [
        ("moe_torch_flow_cutlass", "bfloat16", "TensorRT-LLM's CUTLASS fused MoE, bf16"),
        ("moe_torch_flow", "bfloat16", "TensorRT-LLM's fused MoE (PyTorch flow), bf16"),
    ],
    "fp8": [
        (
            "moe_torch_flow_cutlass",
            "fp8",
            "TensorRT-LLM's CUTLASS fused MoE, per-tensor-scaled fp8",
        ),
    ],
    "fp8_block": [
        ("deepgemm", "fp8_block", "TensorRT-LLM's DeepGEMM fused MoE, 1x128 / 128x128 block fp8"),
        (
            "moe_torch_flow_cutlass",
            "fp8_block",
            "TensorRT-LLM's CUTLASS fused MoE, 1x128 / 128x128 block-scaled fp8",
        ),
        (
            "moe_torch_flow_triton_fp8_block",
            "fp8_block",
            "TensorRT-LLM's Triton fused MoE, block-scaled fp8",
        ),
    ],
    "nvfp4": [
        ("moe_torch_flow_cutlass", "nvfp4", "TensorRT-LLM's CUTLASS fused MoE, nvfp4"),
    ],
}
NONGATED_SOURCE = "moe_torch_flow_nongated"  # the non-gated (squared ReLU) experts' kernel

NCCL_OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
NCCL_DTYPE_BYTES = {"half": 2, "int8": 1}
GEMM_DTYPES = ("bf16", "fp8", "fp8_block", "nvfp4")

COLUMNS = {
    "gemm": {
        "dtype": "the GEMM's input type: bf16, fp8 (per-tensor scales), fp8_block (1x128 / "
        "128x128 block scales), nvfp4",
        "m": "rows of x[m, k] (tokens)",
        "n": "columns of W[k, n] (output features)",
        "k": "the reduction dimension (input features)",
        "tflops": "achieved TFLOP/s = 2*m*n*k / latency / 1e12 (4 significant digits)",
    },
    "attention": {
        "head_dim": "per-head dimension of q, k and v",
        "seq": "sequence length of every sequence in the call (queries = keys, causal)",
        "heads": "parallel (sequence, query head) work items: batch size x query heads",
        "tflops": "achieved TFLOP/s of the causal forward, counting 2*heads*seq^2*head_dim "
        "FLOPs (4*b*h*s^2*d halved by the mask); geometric mean over the KV-head "
        "counts and the (batch, heads) splits measured at the same point",
    },
    "allreduce": {
        "engine": "the serving engine whose own TP all-reduce was measured: trtllm, vllm (in a "
        "CUDA graph), vllm_eager (launched eagerly), sglang",
        "gpus": "ranks in the all-reduce (one node's NVLink domain)",
        "bytes": "the all-reduce buffer in bytes, = message_size x 2 (bf16, message_size an "
        "element count, as the NCCL table's)",
        "us": "measured time of one call in microseconds",
    },
    "moe": {
        "dtype": "weights and inputs: bf16, fp8 (per-tensor scales), fp8_block (1x128 / 128x128 "
        "block scales), nvfp4",
        "gated": "1: gated experts (SwiGLU: up and gate in one GEMM of 2 x inter), 0: not "
        "(squared ReLU)",
        "hidden": "the token width entering the experts",
        "inter": "one expert's FFN width (before expert TP)",
        "experts": "routed experts of the layer",
        "topk": "experts each token is routed to",
        "tp": "expert tensor parallelism: ranks each expert's FFN width is split over",
        "ep": "expert parallelism: ranks the experts are spread over",
        "tokens": "tokens entering the layer (each rank's routed copies: tokens x topk / ep)",
        "us": "measured time of one fused MoE layer on one rank in microseconds (balanced "
        "routing: each expert receives the same number of tokens)",
    },
    "nccl": {
        "op": "all_reduce, all_gather, reduce_scatter or alltoall",
        "gpus": "ranks in the collective (one node's NVLink domain as measured)",
        "bytes": "the collective's whole buffer in bytes (nccl-tests' size: the all-reduce "
        "buffer, all-gather's output, reduce-scatter's input), = message_size x 2 for "
        "dtype half, message_size being an element count",
        "us": "measured time of one call in microseconds",
    },
}


class FlowListDumper(yaml.SafeDumper):
    """Writes lists of numbers on one line (the grid axes), everything else in block style."""


FlowListDumper.add_representer(
    list,
    lambda dumper, data: dumper.represent_sequence(
        "tag:yaml.org,2002:seq",
        data,
        flow_style=all(isinstance(v, (int, float)) for v in data),
    ),
)


def sig4(x: np.ndarray) -> list[str]:
    return [f"{v:.4g}" for v in np.asarray(x, dtype=float)]


def version_key(v: str) -> tuple:
    """Sort key for '1.3.0rc20', '0.5.6.post2', '2.27', '0.1.dev19262': release numbers, then
    dev < rc < final < post."""
    m = re.match(r"^(\d+(?:\.\d+)*)(.*)$", v)
    if not m:
        return ((), 0, 0)
    rel = tuple(int(p) for p in m.group(1).split("."))
    rest = m.group(2).lstrip(".")
    num = int(re.findall(r"\d+", rest)[0]) if re.findall(r"\d+", rest) else 0
    rank = 2
    if rest.startswith("dev"):
        rank = 0
    elif rest.startswith(("rc", "a", "b")):
        rank = 1
    elif rest.startswith("post"):
        rank = 3
    return (rel, rank, num)


def versions(folder: Path, filename: str) -> list[Path]:
    """Version folders holding `filename`, newest first (reuse-only folders have no parquet)."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if (p / filename).is_file()]
    return sorted(found, key=lambda p: version_key(p.name), reverse=True)


def copyright_line(folder: Path) -> str:
    meta = folder / "collection_meta.yaml"
    if meta.is_file():
        for line in meta.read_text().splitlines():
            if "SPDX-FileCopyrightText:" in line:
                return line.split("SPDX-FileCopyrightText:", 1)[1].strip()
    return "Copyright (c) NVIDIA CORPORATION & AFFILIATES"


def fill_axis(values: np.ndarray, axes: list[np.ndarray], axis: int) -> None:
    """Fill NaNs along one axis, in place: linear in log(value) over log2(coordinate) between the
    measured points of each line, constant beyond its ends; lines with none stay NaN."""
    moved = np.moveaxis(values, axis, -1)
    x = np.log2(axes[axis])
    flat = moved.reshape(-1, moved.shape[-1])
    for row in flat:
        ok = np.isfinite(row)
        if ok.all() or not ok.any():
            continue
        row[~ok] = np.exp(np.interp(x[~ok], x[ok], np.log(row[ok])))
    moved[...] = flat.reshape(moved.shape)


def fill_grid(values: np.ndarray, axes: list[np.ndarray], order: list[int]) -> int:
    """Fill every NaN of `values`, axis by axis in `order` (repeated until none is left);
    returns how many points were filled."""
    missing = int(np.isnan(values).sum())
    for _ in range(len(order)):
        for ax in order:
            fill_axis(values, axes, ax)
        if not np.isnan(values).any():
            return missing
    raise ValueError("grid has a line with no measured point on any axis")


def thin_m(ms: np.ndarray) -> np.ndarray:
    """A roughly log-spaced subset of the measured m: the powers of two and 1.5 x powers of two
    (48, 96, 192, ...) that were measured, plus the largest."""
    keep = []
    for m in ms:
        p = int(m)
        pow2 = p & (p - 1) == 0
        three = p % 3 == 0 and (p // 3) & (p // 3 - 1) == 0 and p >= 48
        if pow2 or three:
            keep.append(p)
    keep.append(int(ms.max()))
    return np.array(sorted(set(keep)), dtype=np.int64)


def gemm_tables(data: Path) -> tuple[list[str], dict]:
    rows: list[str] = []
    meta: dict = {}
    cache: dict[Path, pd.DataFrame] = {}
    for dtype in GEMM_DTYPES:
        chosen = None
        for engine, ks, gdt, why in GEMM_SOURCES[dtype]:
            for vdir in versions(data / "gemm" / engine, "gemm_perf.parquet"):
                path = vdir / "gemm_perf.parquet"
                if path not in cache:
                    cache[path] = pd.read_parquet(path)
                df = cache[path]
                sel = df[(df.kernel_source == ks) & (df.gemm_dtype == gdt)]
                if len(sel):
                    chosen = (engine, vdir, ks, gdt, why, sel)
                    break
            if chosen:
                break
        if not chosen:
            continue
        engine, vdir, ks, gdt, why, sel = chosen
        sel = sel[sel.latency > 0]
        tf = 2.0 * sel.m * sel.n * sel.k / (sel.latency * 1e-3) / 1e12
        pts = (
            pd.DataFrame({"m": sel.m, "n": sel.n, "k": sel.k, "ltf": np.log(tf)})
            .groupby(["m", "n", "k"])
            .ltf.mean()  # geometric mean over repeats (none seen)
        )
        m_ax = thin_m(np.sort(sel.m.unique()))
        n_ax = np.sort(sel.n.unique())
        k_ax = np.sort(sel.k.unique())
        axes = [m_ax.astype(float), n_ax.astype(float), k_ax.astype(float)]
        grid = np.full((len(m_ax), len(n_ax), len(k_ax)), np.nan)
        idx = pd.MultiIndex.from_product([m_ax, n_ax, k_ax], names=["m", "n", "k"])
        grid[...] = np.exp(pts.reindex(idx).to_numpy()).reshape(grid.shape)
        # Unmeasured points are the largest shapes: along m first, where achieved TFLOP/s has
        # saturated by then, so the fill holds it constant.
        filled = fill_grid(grid, axes, [0, 2, 1])
        mm, nn, kk = np.meshgrid(m_ax, n_ax, k_ax, indexing="ij")
        for a, b, c, v in zip(mm.ravel(), nn.ravel(), kk.ravel(), sig4(grid.ravel()), strict=True):
            rows.append(f"{dtype},{a},{b},{c},{v}")
        meta[dtype] = {
            "path": in_package(vdir / "gemm_perf.parquet"),
            "engine": engine,
            "engine_version": vdir.name,
            "kernel_source": ks,
            "gemm_dtype": gdt,
            "kernel": why,
            "device": str(sel.device.iloc[0]) if "device" in sel else "",
            "rows_read": len(sel),
            "axes": {"m": m_ax.tolist(), "n": n_ax.tolist(), "k": k_ax.tolist()},
            "grid_points": int(grid.size),
            "points_filled": filled,
            "max_tflops": float(f"{grid.max():.4g}"),
        }
    return rows, meta


def heads_axis(hmax: int) -> np.ndarray:
    out = []
    p = 1
    while p <= hmax:
        out.append(p)
        if p >= 2 and 3 * p // 2 <= hmax:
            out.append(3 * p // 2)
        p *= 2
    if out[-1] < hmax:
        out.append(hmax)
    return np.array(sorted(set(out)), dtype=np.int64)


def attention_table(data: Path) -> tuple[list[str], dict]:
    for engine, ks, why in ATTENTION_SOURCES:
        for vdir in versions(data / "attention" / engine, "context_attention_perf.parquet"):
            df = pd.read_parquet(vdir / "context_attention_perf.parquet")
            sel = df[
                (df.kernel_source == ks)
                & (df.attn_dtype == "bfloat16")
                & (df.kv_cache_dtype == "bfloat16")
            ]
            if "window_size" in sel:
                sel = sel[sel.window_size == 0]
            if len(sel):
                return _attention_grid(data, engine, vdir, ks, why, sel)
    raise ValueError(f"{data}: no context attention table")


def _attention_grid(
    data: Path, engine: str, vdir: Path, ks: str, why: str, sel: pd.DataFrame
) -> tuple[list[str], dict]:
    rows_read = len(sel)
    # One token per sequence is a decode call: the causal-half FLOP count means nothing there.
    sel = sel[(sel.isl >= 16) & (sel.latency > 0)]
    flops = 2.0 * sel.batch_size * sel.num_heads * sel.isl.astype(float) ** 2 * sel.head_dim
    ltf = np.log(flops / (sel.latency * 1e-3) / 1e12)
    d = pd.DataFrame(
        {
            "head_dim": sel.head_dim,
            "seq": sel.isl,
            "heads": sel.batch_size * sel.num_heads,
            "b": sel.batch_size,
            "nh": sel.num_heads,
            "ltf": ltf,
        }
    )
    # Geometric mean over the KV-head counts at one (batch, heads) point, then over the
    # (batch, heads) splits giving the same number of work items.
    per_call = d.groupby(["head_dim", "seq", "heads", "b", "nh"]).ltf.mean()
    pts = per_call.groupby(["head_dim", "seq", "heads"]).mean()
    hd_ax = np.sort(d.head_dim.unique())
    s_ax = np.sort(d.seq.unique())
    h_ax = heads_axis(int(d.heads.max()))
    axes = [hd_ax.astype(float), s_ax.astype(float), h_ax.astype(float)]
    grid = np.full((len(hd_ax), len(s_ax), len(h_ax)), np.nan)
    exact = 0
    for i, hd in enumerate(hd_ax):
        for j, s in enumerate(s_ax):
            if (hd, s) not in pts.index.droplevel(2):
                continue
            line = pts.loc[(hd, s)]
            hx = np.log2(line.index.to_numpy(float))
            grid[i, j] = np.exp(np.interp(np.log2(h_ax), hx, line.to_numpy()))
            exact += int(np.isin(h_ax, line.index.to_numpy()).sum())
    before = int(np.isfinite(grid).sum())
    filled_lines = fill_grid(grid, axes, [1, 0])
    filled = filled_lines + (before - exact)
    hh, ss, nn = np.meshgrid(hd_ax, s_ax, h_ax, indexing="ij")
    rows = [
        f"{a},{b},{c},{v}"
        for a, b, c, v in zip(hh.ravel(), ss.ravel(), nn.ravel(), sig4(grid.ravel()), strict=True)
    ]
    meta = {
        "path": in_package(vdir / "context_attention_perf.parquet"),
        "engine": engine,
        "engine_version": vdir.name,
        "kernel_source": ks,
        "kernel": why,
        "attn_dtype": "bfloat16",
        "kv_cache_dtype": "bfloat16",
        "window_size": 0,
        "device": str(sel.device.iloc[0]) if "device" in sel else "",
        "rows_read": rows_read,
        "axes": {"head_dim": hd_ax.tolist(), "seq": s_ax.tolist(), "heads": h_ax.tolist()},
        "grid_points": int(grid.size),
        "points_filled": filled,
        "note": "seq 1 (a decode call) left out; a `heads` grid value not measured at its "
        "(head_dim, seq) is interpolated between the measured ones, constant beyond "
        "them, and counted as filled",
        "max_tflops": float(f"{grid.max():.4g}"),
    }
    return rows, meta


def collective_grid(sel: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """A collective's measured times (us) on the full (gpus, bytes) grid of the sizes measured,
    with the points filled and the points the envelope lowered: (gpus axis, bytes axis, grid,
    filled, lowered). message_size counts bf16/half elements: bytes = 2 x message_size."""
    pts = (
        pd.DataFrame(
            {
                "gpus": sel.num_gpus,
                "bytes": sel.message_size * 2,
                "lus": np.log(sel.latency * 1e3),
            }
        )
        .groupby(["gpus", "bytes"])
        .lus.mean()
    )
    g_ax = np.sort(sel.num_gpus.unique())
    b_ax = np.sort((sel.message_size * 2).unique())
    axes = [g_ax.astype(float), b_ax.astype(float)]
    idx = pd.MultiIndex.from_product([g_ax, b_ax], names=["gpus", "bytes"])
    grid = np.exp(pts.reindex(idx).to_numpy()).reshape(len(g_ax), len(b_ax))
    filled = fill_grid(grid, axes, [1, 0])
    # In the latency-bound sizes the measurements scatter by up to tens of percent, some
    # larger messages timing faster than smaller ones. A smaller buffer can always go as a
    # larger one would, so each size takes the least time measured at it or any larger size:
    # time then never falls with bytes (a search would otherwise favour padding).
    envelope = np.minimum.accumulate(grid[:, ::-1], axis=1)[:, ::-1]
    lowered = int((envelope < grid).sum())
    return g_ax, b_ax, envelope, filled, lowered


def nccl_table(data: Path) -> tuple[list[str], dict]:
    vdirs = versions(data / "comm" / "nccl", "nccl_perf.parquet")
    if not vdirs:
        raise ValueError(f"{data}: no nccl table")
    vdir = vdirs[0]
    df = pd.read_parquet(vdir / "nccl_perf.parquet")
    rows: list[str] = []
    per_op: dict = {}
    total_read = total_points = total_filled = total_lowered = 0
    for op in NCCL_OPS:
        sel = df[(df.op_name == op) & (df.nccl_dtype == "half") & (df.latency > 0)]
        if not len(sel):
            continue
        total_read += len(sel)
        g_ax, b_ax, grid, filled, lowered = collective_grid(sel)
        total_points += grid.size
        total_filled += filled
        total_lowered += lowered
        gg, bb = np.meshgrid(g_ax, b_ax, indexing="ij")
        rows += [
            f"{op},{a},{b},{v}"
            for a, b, v in zip(gg.ravel(), bb.ravel(), sig4(grid.ravel()), strict=True)
        ]
        per_op[op] = {
            "gpus": g_ax.tolist(),
            "bytes_min": int(b_ax[0]),
            "bytes_max": int(b_ax[-1]),
            "sizes": len(b_ax),
            "points_filled": filled,
            "points_lowered": lowered,
        }
    # The element-count convention, checked on the data: at the largest size the half (2-byte)
    # all-reduce takes about twice the int8 one's time for the same message_size.
    big = df[(df.op_name == "all_reduce") & (df.num_gpus == df.num_gpus.max())]
    ratio = None
    lat = big.pivot_table(index="message_size", columns="nccl_dtype", values="latency")
    if {"half", "int8"} <= set(lat.columns):
        both = lat[["half", "int8"]].dropna()
        if len(both):
            ratio = round(float(both.iloc[-1]["half"] / both.iloc[-1]["int8"]), 3)
    meta = {
        "path": in_package(vdir / "nccl_perf.parquet"),
        "engine": "nccl",
        "engine_version": vdir.name,
        "kernel_source": str(df.kernel_source.iloc[0]) if "kernel_source" in df else "",
        "nccl_dtype": "half",
        "device": str(df.device.iloc[0]) if "device" in df else "",
        "rows_read": total_read,
        "grid_points": total_points,
        "points_filled": total_filled,
        "points_lowered": total_lowered,
        "monotone": "each size's time is the least measured at that size or any larger one "
        "(points_lowered counts the points this changed)",
        "ops": per_op,
        "message_size_units": (
            "elements: the package's own callers pass element counts (e.g. "
            "ops.NCCL(..., num_elements_per_token=kv_bytes_per_token / comm_bytes, ...)) with the "
            "dtype separately; here the half all-reduce at the largest message_size takes "
            f"{ratio} x the int8 one's time (2 if message_size counts elements, 1 if bytes). "
            "bytes = message_size x 2"
        ),
        "buffer_convention": (
            "whole buffer (nccl-tests' size): all_gather and reduce_scatter take about half the "
            "all_reduce time at the same size, as ring algorithms on the same buffer do; a "
            "per-rank all_gather size would imply several TB/s of NVLink bus bandwidth"
        ),
    }
    return rows, meta


def in_package(path: Path) -> str:
    """The path inside the package (aiconfigurator_core/systems/data/...)."""
    parts = path.parts
    at = parts.index("systems") if "systems" in parts else max(len(parts) - 5, 0)
    return "/".join(("aiconfigurator_core", *parts[at:]))


def source_dir(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("aiconfigurator-core is not installed here; pass --source DIR")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "data"


def package_version() -> str:
    try:
        return importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def engine_allreduce_table(data: Path) -> tuple[list[str], dict]:
    """The engines' own TP all-reduce, each from the newest version that measured it, on the
    (gpus, bytes) grid with the NCCL table's monotone envelope; no rows where none was."""
    rows: list[str] = []
    meta: dict = {}
    for key, (folder, keep, what) in ENGINE_ALLREDUCE.items():
        found = None
        for vdir in versions(data / "comm" / folder, "custom_allreduce_perf.parquet"):
            df = pd.read_parquet(vdir / "custom_allreduce_perf.parquet")
            sel = df[(df.op_name == "all_reduce") & (df.latency > 0)]
            if "allreduce_dtype" in sel:
                sel = sel[sel.allreduce_dtype == "bfloat16"]
            if keep is not None:
                sel = sel[sel[keep[0]] == keep[1]] if keep[0] in sel else sel.iloc[:0]
            if len(sel):
                found = vdir, sel
                break
        if found is None:
            continue
        vdir, sel = found
        g_ax, b_ax, envelope, filled, lowered = collective_grid(sel)
        gg, bb = np.meshgrid(g_ax, b_ax, indexing="ij")
        rows += [
            f"{key},{a},{b},{v}"
            for a, b, v in zip(gg.ravel(), bb.ravel(), sig4(envelope.ravel()), strict=True)
        ]
        implementation = next(
            (
                str(sel[c].iloc[0])
                for c in ("implementation", "backend", "kernel_source")
                if c in sel
            ),
            "",
        )
        meta[key] = {
            "measured": what,
            "path": in_package(vdir / "custom_allreduce_perf.parquet"),
            "engine_version": vdir.name,
            "framework_column": str(sel.framework.iloc[0]) if "framework" in sel else "",
            "implementation": implementation,
            "device": str(sel.device.iloc[0]) if "device" in sel else "",
            "rows_read": len(sel),
            "gpus": g_ax.tolist(),
            "bytes_min": int(b_ax[0]),
            "bytes_max": int(b_ax[-1]),
            "points_filled": filled,
            "points_lowered": lowered,
        }
    return rows, meta


def moe_table(data: Path) -> tuple[list[str], dict]:
    """TensorRT-LLM's fused MoE layer time under balanced routing, per dtype and gating, each
    model shape from the newest version that measured it with the preferred kernel, at each
    (tp, ep) split with tp or ep 1 (autoconfig's two modes: experts split by width over the TP
    ranks, or spread over them); no rows where the chip has no balanced MoE measurement."""
    folder = data / "moe" / "trtllm"
    frames = [
        (v, pd.read_parquet(v / "moe_perf.parquet")) for v in versions(folder, "moe_perf.parquet")
    ]
    keys = ["hidden_size", "inter_size", "num_experts", "topk"]
    split = ["moe_tp_size", "moe_ep_size", "num_tokens"]
    rows: list[str] = []
    meta: dict = {}
    for dtype, sources in MOE_SOURCES.items():
        for gated in (1, 0):
            # The non-gated experts have one kernel family, per dtype.
            options = sources if gated else [(NONGATED_SOURCE, sources[0][1], "")]
            for option in options:
                ks, moe_dtype, _ = option
                picked: list[pd.DataFrame] = []
                seen: set[tuple] = set()
                by_version: dict[str, list] = {}
                for vdir, df in frames:  # newest first: a shape comes from the newest holding it
                    sel = df[
                        (df.kernel_source == ks)
                        & (df.moe_dtype == moe_dtype)
                        & (df.distribution == "balanced")
                        & (df.latency > 0)
                        & ((df.moe_tp_size == 1) | (df.moe_ep_size == 1))
                    ]
                    shapes = {tuple(r) for r in sel[keys].drop_duplicates().to_numpy().tolist()}
                    new = sorted(shapes - seen)
                    if not new:
                        continue
                    seen |= shapes
                    mask = pd.Series(
                        list(zip(*(sel[c] for c in keys), strict=True)), index=sel.index
                    )
                    picked.append(sel[mask.isin(new)])
                    by_version[vdir.name] = {
                        "path": in_package(vdir / "moe_perf.parquet"),
                        "shapes (hidden, inter, experts, topk)": [list(t) for t in new],
                    }
                if picked:
                    break
            if not picked:
                continue
            ks, moe_dtype, what = option
            sel = pd.concat(picked)
            # geometric mean over repeated measurements of a point
            pts = np.exp(np.log(sel.latency * 1e3).groupby([sel[c] for c in keys + split]).mean())
            for (h, i, e, k, tp, ep, t), us in zip(pts.index, sig4(pts.to_numpy()), strict=True):
                rows.append(f"{dtype},{gated},{h},{i},{e},{k},{tp},{ep},{t},{us}")
            meta[f"{dtype}{'' if gated else '_nongated'}"] = {
                "engine": "trtllm",
                "kernel_source": ks,
                "moe_dtype": moe_dtype,
                "kernel": what if gated else f"TensorRT-LLM's fused MoE, non-gated, {moe_dtype}",
                "distribution": "balanced",
                "device": str(sel.device.iloc[0]) if "device" in sel else "",
                "points": len(pts),
                "versions": by_version,
                "tokens": [int(t) for t in np.sort(sel.num_tokens.unique())],
            }
    return rows, meta


def write_csv(path: Path, header: str, rows: list[str], gz: bool = False) -> None:
    """A CSV file; gzipped (as path + '.gz', with no timestamp so a rerun on the same data gives
    the same bytes) where `gz`, removing the other form."""
    text = (header + "\n" + "\n".join(rows) + "\n").encode()
    plain, packed = path, path.with_name(path.name + ".gz")
    if gz:
        packed.write_bytes(gzip.compress(text, compresslevel=9, mtime=0))
        plain.unlink(missing_ok=True)
    else:
        plain.write_bytes(text)
        packed.unlink(missing_ok=True)


def distil(chip: str, folder: str, src: Path, out: Path, version: str, gz: bool) -> dict:
    data = src / folder
    gemm_rows, gemm_meta = gemm_tables(data)
    att_rows, att_meta = attention_table(data)
    nccl_rows, nccl_meta = nccl_table(data)
    dest = out / chip
    dest.mkdir(parents=True, exist_ok=True)
    write_csv(dest / "gemm.csv", "dtype,m,n,k,tflops", gemm_rows, gz=gz)
    write_csv(dest / "attention.csv", "head_dim,seq,heads,tflops", att_rows)
    write_csv(dest / "nccl.csv", "op,gpus,bytes,us", nccl_rows)
    allreduce_rows, allreduce_meta = engine_allreduce_table(data)
    if allreduce_rows:
        write_csv(dest / "allreduce.csv", "engine,gpus,bytes,us", allreduce_rows)
    moe_rows, moe_meta = moe_table(data)
    if moe_rows:
        write_csv(
            dest / "moe.csv",
            "dtype,gated,hidden,inter,experts,topk,tp,ep,tokens,us",
            moe_rows,
            gz=gz,
        )
    bf16 = gemm_meta["bf16"]
    summary = (
        f"aiconfigurator-core {version} (Apache-2.0) {folder}: GEMM {bf16['engine']} "
        f"{bf16['engine_version']} ({', '.join(gemm_meta)}), attention {att_meta['engine']} "
        f"{att_meta['engine_version']} {att_meta['kernel_source']}, NCCL "
        f"{nccl_meta['engine_version']}"
    )
    prov = {
        "chip": chip,
        "summary": summary,
        "source": {
            "package": "aiconfigurator-core",
            "version": version,
            "license": "Apache-2.0",
            "copyright": copyright_line(data / "gemm" / bf16["engine"] / bf16["engine_version"]),
            "system": folder,
            "data_dir": f"aiconfigurator_core/systems/data/{folder}",
            "units": "the source's latencies are milliseconds",
        },
        "distilled": dt.date.today().isoformat(),
        "script": "scripts/distill_kernel_tables.py",
        "gemm": {
            "file": "gemm.csv.gz" if gz else "gemm.csv",
            "columns": COLUMNS["gemm"],
            "tables": gemm_meta,
        },
        "attention": {"file": "attention.csv", "columns": COLUMNS["attention"], **att_meta},
        "nccl": {"file": "nccl.csv", "columns": COLUMNS["nccl"], **nccl_meta},
    }
    if allreduce_rows:
        prov["allreduce"] = {
            "file": "allreduce.csv",
            "columns": COLUMNS["allreduce"],
            "monotone": "each size's time is the least measured at that size or any larger one",
            "engines": allreduce_meta,
        }
    if moe_rows:
        prov["moe"] = {
            "file": "moe.csv.gz" if gz else "moe.csv",
            "columns": COLUMNS["moe"],
            "layer": "one fused MoE layer on one rank, as TensorRT-LLM runs it: the tokens' "
            "permutation to their experts, the grouped up (and gate) and down GEMMs, the "
            "activation and the weighted unpermute; the router GEMM, shared experts and the "
            "all-to-all are not in it",
            "routing": "balanced: each expert gets tokens x topk / experts routed copies; "
            "autoconfig adds the imbalance of uniform routing (cost/serving_moe.py)",
            "splits": "rows with expert TP or EP 1 only (the source also measured mixed ones)",
            "monotone": "as measured here; the loader makes each count's time the least at "
            "it or any larger count (kernel_catalog)",
            "between_shapes": "a model shape not measured takes the nearest measured shape of "
            "the same dtype and gating (within 4x in hidden, inter and experts / topk) at the "
            "tokens giving the same routed copies per expert, times experts x hidden x inter "
            "over the measured shape's (both the weights and the FLOPs at equal rows per expert "
            "scale so)",
            "tables": moe_meta,
        }
    (dest / "provenance.yaml").write_text(
        "# Distilled from aiconfigurator-core's measured kernel data (Apache-2.0).\n"
        + yaml.dump(prov, Dumper=FlowListDumper, sort_keys=False, width=100)
    )
    return prov


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", help="aiconfigurator-core's systems/data folder")
    ap.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent.parent / "autoconfig" / "profiles" / "kernels"),
    )
    ap.add_argument("--chips", default=",".join(CHIPS), help="comma-separated chip names")
    # The GEMM grids (all measured n and k, ~20 m, up to four dtypes) are about 1 MB of text per
    # chip; gzipped they are a fifth of that, which keeps the shipped folder under ~2 MB.
    ap.add_argument("--plain", action="store_true", help="write gemm.csv uncompressed")
    args = ap.parse_args()
    src = source_dir(args.source)
    out = Path(args.out)
    version = package_version()
    for chip in args.chips.split(","):
        prov = distil(chip, CHIPS[chip], src, out, version, gz=not args.plain)
        sizes = sum(f.stat().st_size for f in (out / chip).iterdir())
        print(f"{chip}: {prov['summary']}; {sizes / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
