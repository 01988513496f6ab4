"""What one GPU's kernels run at, beside what its profile's fitted constants assume: a device
copy (HBM bandwidth), bf16 GEMMs at transformer layer shapes (forward, and the two backward
products), causal flash attention through PyTorch's SDPA (forward and backward), the
memory-bound kernels of an eager layer and the copies FSDP2 makes around its collectives.

The cost model times a GEMM as FLOPs / (peak x `gemm` x wave utilization), attention as
causal FLOPs / (peak x `attention`) and memory-bound kernels as bytes / (HBM x `memory`)
(autoconfig/cost/timing.py). The fitted constants absorb whatever the published runs hide or
add; this script measures the kernels themselves, so the two can be told apart.

    python scripts/bench_gpu_kernels.py --profile h100-sxm-80gb --out kernels.json
    python scripts/bench_gpu_kernels.py --device cpu --quick   # the script itself, no GPU

Timing: CUDA events around each kernel after warm-up, the median of many repeats, on random
inputs (never zeros), with several input sets rotated so that no repeat reads from cache.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from autoconfig.cost.timing import wave_utilization
from autoconfig.spec import catalog

# (label, tokens, k, n): a linear layer of k inputs and n outputs over `tokens` tokens.
GEMM_SHAPES = [
    ("square 8192", 8192, 8192, 8192),
    ("gpt3-1.3b qkv, 8192 tokens", 8192, 2048, 6144),
    ("gpt3-1.3b fc1", 8192, 2048, 8192),
    ("gpt3-1.3b fc2", 8192, 8192, 2048),
    ("llama3-8b qkv, 8192 tokens", 8192, 4096, 6144),
    ("llama3-8b out", 8192, 4096, 4096),
    ("llama3-8b gate+up", 8192, 4096, 28672),
    ("llama3-8b down", 8192, 14336, 4096),
    ("llama3-70b tp8 qkv", 8192, 8192, 1280),
    ("llama3-70b tp8 gate+up", 8192, 8192, 7168),
    ("llama3-70b tp8 down", 8192, 3584, 8192),
    ("llama3-70b tp8 qkv, 2048 tokens", 2048, 8192, 1280),
]
# (label, batch, heads, seq, head_dim)
ATTENTION_SHAPES = [
    ("32 heads x 128, seq 8192", 1, 32, 8192, 128),
    ("16 heads x 128, seq 2048, batch 4", 4, 16, 2048, 128),
    ("8 heads x 128, seq 8192", 1, 8, 8192, 128),
    ("32 heads x 128, seq 4096, batch 2", 2, 32, 4096, 128),
    # head widths the kernel tables do not hold (64, 128, 192, 256 there): gpt3-2.7b's 80
    # beside gpt3-1.3b's 64 at the trainer's shapes
    ("32 heads x 80, seq 2048, batch 4", 4, 32, 2048, 80),
    ("32 heads x 64, seq 2048, batch 4", 4, 32, 2048, 64),
    # the trainer's GPT models train with attention dropout 0.1 inside SDPA; the kernel tables
    # were measured without it
    ("32 heads x 64, seq 2048, batch 4, dropout 0.1", 4, 32, 2048, 64, 0.1),
]
QUICK_SCALE = 16  # --quick divides every size by this (a CPU check of the script itself)
INPUT_SETS = 3  # rotated so that repeats do not read the previous repeat's cached inputs


@dataclass
class Row:
    """One kernel's measured rate beside the profile's assumed rate."""

    kind: str
    label: str
    shape: str
    median_ms: float
    measured: float  # TFLOP/s, or TB/s for the copy
    assumed: float  # what the profile's constants give for the same work
    unit: str

    @property
    def ratio(self) -> float:
        return self.measured / self.assumed if self.assumed > 0 else float("nan")


def time_ms(fn: Callable[[int], object], device: torch.device, repeats: int) -> float:
    """Median milliseconds of fn(i) over `repeats` calls after warm-up (i rotates inputs)."""
    for i in range(3):
        fn(i)
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for i in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for i in range(repeats):
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_copy(device: torch.device, gib: float, repeats: int, hbm_tb_s: float, eff: float) -> Row:
    n = int(gib * 2**30) // 2
    src = [torch.randn(n, device=device, dtype=torch.bfloat16) for _ in range(2)]
    dst = torch.empty_like(src[0])
    ms = time_ms(lambda i: dst.copy_(src[i % 2]), device, repeats)
    moved = 2.0 * n * 2  # read once, written once, 2 bytes each
    return Row(
        "memory", "device copy", f"{gib:g} GiB", ms, moved / ms / 1e9, hbm_tb_s * eff, "TB/s"
    )


def _randn(device: torch.device, *shape: int, count: int = INPUT_SETS) -> list[torch.Tensor]:
    return [torch.randn(*shape, device=device, dtype=torch.bfloat16) for _ in range(count)]


def _gemm_passes(xs: list, ws: list, gs: list) -> dict[str, Callable[[int], object]]:
    """The three products of a linear layer: forward, and backward's input and weight grads."""
    return {
        "forward": lambda i: F.linear(xs[i % INPUT_SETS], ws[i % INPUT_SETS]),
        "input grad": lambda i: gs[i % INPUT_SETS] @ ws[i % INPUT_SETS],
        "weight grad": lambda i: gs[i % INPUT_SETS].t() @ xs[i % INPUT_SETS],
    }


def bench_gemms(
    device: torch.device,
    shapes: list[tuple[str, int, int, int]],
    scale: int,
    repeats: int,
    peak: float,
    eff: float,
    sms: float,
) -> list[Row]:
    rows = []
    for label, *dims in shapes:
        tokens, k, n = (max(16, v // scale) for v in dims)
        passes = _gemm_passes(
            _randn(device, tokens, k), _randn(device, n, k), _randn(device, tokens, n)
        )
        flops = 2.0 * tokens * k * n
        util = float(wave_utilization(np.array(tokens, float), np.array(n, float), np.array(sms)))
        assumed = peak * eff * util / 1e12
        for name, fn in passes.items():
            ms = time_ms(fn, device, repeats)
            shape = f"{tokens}x{k}x{n}"
            rows.append(
                Row("gemm", f"{label}, {name}", shape, ms, flops / ms / 1e9, assumed, "TFLOP/s")
            )
    return rows


def bench_attention(
    device: torch.device,
    shapes: list[tuple],
    scale: int,
    repeats: int,
    peak: float,
    eff: float,
) -> list[Row]:
    """Causal SDPA forward and backward at each (label, batch, heads, seq, head width[,
    dropout probability]) shape."""
    rows = []
    for label, batch, heads, seq, head_dim, *rest in shapes:
        dropout = float(rest[0]) if rest else 0.0
        seq = max(64, seq // scale)
        qkv = [
            [t.requires_grad_() for t in _randn(device, batch, heads, seq, head_dim, count=3)]
            for _ in range(INPUT_SETS)
        ]
        grad = torch.randn(batch, heads, seq, head_dim, device=device, dtype=torch.bfloat16)
        # Causal: half of the 4 * s^2 * d multiply-adds per head (QK^T and PV) are done.
        fwd_flops = 4.0 * batch * heads * seq * seq * head_dim * 0.5

        def forward(i: int, qkv=qkv, dropout=dropout):
            q, k, v = qkv[i % INPUT_SETS]
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)

        outs = [forward(i) for i in range(INPUT_SETS)]

        def backward(i: int, outs=outs, qkv=qkv, grad=grad):
            q, k, v = qkv[i % INPUT_SETS]
            return torch.autograd.grad(outs[i % INPUT_SETS], (q, k, v), grad, retain_graph=True)

        shape = f"b{batch} h{heads} s{seq} d{head_dim}" + (f" p{dropout:g}" if dropout else "")
        ms_f = time_ms(lambda i: forward(i), device, repeats)
        assumed = peak * eff / 1e12
        rate_f = fwd_flops / ms_f / 1e9
        rows.append(Row("attention", f"{label}, forward", shape, ms_f, rate_f, assumed, "TFLOP/s"))
        ms_b = time_ms(backward, device, repeats)
        # The cost model charges backward 2.5x the forward's FLOPs (layer.py's bwd_factor).
        rate_b = 2.5 * fwd_flops / ms_b / 1e9
        rows.append(Row("attention", f"{label}, backward", shape, ms_b, rate_b, assumed, "TFLOP/s"))
    return rows


def bench_elementwise(
    device: torch.device, scale: int, repeats: int, hbm_tb_s: float, eff: float
) -> list[Row]:
    """The memory-bound kernels of an eager layer under autocast over fp32 weights (the
    bundled trainer's GPU mode) on 8192 tokens x 8192: the fewest bytes each must read and
    write (what the cost model counts), over time."""
    from autoconfig.trainer.ops import Norm

    tokens, hidden = max(64, 8192 // scale), max(64, 8192 // scale)
    stream = [torch.randn(tokens, hidden, device=device) for _ in range(INPUT_SETS)]
    branch = _randn(device, tokens, hidden)
    gate, up = _randn(device, tokens, 2 * hidden), _randn(device, tokens, 2 * hidden)
    norm = Norm(hidden, "rmsnorm").to(device)
    n = tokens * hidden
    kernels = {
        # label: (bytes moved per token x hidden element, function)
        "bf16 cast of an fp32 tensor": (6, lambda i: stream[i % INPUT_SETS].to(torch.bfloat16)),
        "residual add, fp32 stream + bf16 branch": (
            10,
            lambda i: stream[i % INPUT_SETS] + branch[i % INPUT_SETS],
        ),
        "RMSNorm forward, eager fp32 (the trainer's)": (8, lambda i: norm(stream[i % INPUT_SETS])),
        # gate and up in, the product out, each twice the hidden width
        "SwiGLU forward, eager bf16": (
            12,
            lambda i: F.silu(gate[i % INPUT_SETS]) * up[i % INPUT_SETS],
        ),
    }
    rows = []
    shape = f"{tokens}x{hidden}"
    with torch.no_grad():
        for label, (per_element, fn) in kernels.items():
            ms = time_ms(fn, device, repeats)
            rate = per_element * n / ms / 1e9
            rows.append(Row("memory", label, shape, ms, rate, hbm_tb_s * eff, "TB/s"))
    # The norm's backward, both gradients taken (none accumulated into .grad), counted as a
    # fused kernel's 16 bytes an element: the input and the output gradient read, the input
    # gradient written, in fp32.
    inputs = [t.clone().requires_grad_(True) for t in stream]
    outputs = [norm(t) for t in inputs]
    grads = [torch.randn_like(o) for o in outputs]

    def backward(i: int) -> tuple[torch.Tensor, ...]:
        k = i % INPUT_SETS
        return torch.autograd.grad(
            outputs[k], (inputs[k], norm.weight), grads[k], retain_graph=True
        )

    ms = time_ms(backward, device, repeats)
    label = "RMSNorm backward, eager fp32 (the trainer's)"
    rows.append(Row("memory", label, shape, ms, 16 * n / ms / 1e9, hbm_tb_s * eff, "TB/s"))
    return rows


def bench_fsdp_copies(
    device: torch.device, scale: int, repeats: int, hbm_tb_s: float, eff: float
) -> list[Row]:
    """The copies torch's fully_shard makes on the compute stream around its collectives
    (_fsdp_collectives.py), for one llama3-8b layer's weights sharded over 8 ranks: the
    all-gather's output split into the per-parameter weights (split_with_sizes_copy, 2 bytes
    read and 2 written a parameter) and the bf16 gradients chunked into an fp32 reduce-scatter
    input (chunk_cat, 2 read and 4 written). The cost model charges both as memory passes."""
    spec = catalog.get_model("llama3-8b")
    world, hidden, ffn = 8, max(64, spec.hidden // scale), max(64, spec.ffn_hidden // scale)
    kv = max(8, spec.kv * spec.dhead // scale)
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden),
              (ffn, hidden), (ffn, hidden), (hidden, ffn), (hidden,), (hidden,)]  # fmt: skip
    numels = [int(np.prod(shape)) for shape in shapes]
    shards = [-(-n // world) for n in numels]
    gathered = _randn(device, world * sum(shards))
    weights = [torch.empty(world * s, device=device, dtype=torch.bfloat16) for s in shards]
    outs = [w.view(world, -1) for w in weights]

    def copy_out(i: int) -> None:
        torch.split_with_sizes_copy(
            gathered[i % INPUT_SETS].view(world, -1), shards, dim=1, out=outs
        )

    grad_sets = [[torch.randn(world * s, device=device, dtype=torch.bfloat16) for s in shards]
                 for _ in range(INPUT_SETS)]  # fmt: skip
    reduce_input = torch.empty(world * sum(shards), device=device, dtype=torch.float32)

    def copy_in(i: int) -> None:
        torch._chunk_cat(grad_sets[i % INPUT_SETS], 0, world, out=reduce_input.view(world, -1))

    params = world * sum(shards)
    rows = []
    for label, per_param, fn in (
        ("FSDP2 all-gather copy-out, bf16", 4, copy_out),
        ("FSDP2 reduce-scatter copy-in, bf16 to fp32", 6, copy_in),
    ):
        ms = time_ms(fn, device, repeats)
        shape = f"{params / 1e6:.0f}M parameters"
        rows.append(
            Row("memory", label, shape, ms, per_param * params / ms / 1e9, hbm_tb_s * eff, "TB/s")
        )
    return rows


def bench_fp8(
    device: torch.device, repeats: int, peak_fp8: float, eff: float, sms: float
) -> list[Row]:
    """fp8 (e4m3) GEMMs through torch._scaled_mm, bf16 out, per-tensor scales."""
    rows = []
    one = torch.tensor(1.0, device=device)
    for label, tokens, k, n in (GEMM_SHAPES[0], GEMM_SHAPES[6], GEMM_SHAPES[9]):
        xs = [t.to(torch.float8_e4m3fn) for t in _randn(device, tokens, k)]
        ws = [t.to(torch.float8_e4m3fn) for t in _randn(device, n, k)]
        util = float(wave_utilization(np.array(tokens, float), np.array(n, float), np.array(sms)))

        def fn(i: int, xs=xs, ws=ws) -> torch.Tensor:
            a, b = xs[i % INPUT_SETS], ws[i % INPUT_SETS].t()
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        ms = time_ms(fn, device, repeats)
        rate = 2.0 * tokens * k * n / ms / 1e9
        assumed = peak_fp8 * eff * util / 1e12
        shape = f"{tokens}x{k}x{n}"
        rows.append(Row("gemm", f"fp8 {label}, forward", shape, ms, rate, assumed, "TFLOP/s"))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h100-sxm-80gb", help="GPU profile to compare with")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="sizes / 16, few repeats")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", help="write the rows and the environment as JSON here")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("device: cuda asked for but no GPU is visible (use --device cpu)")
    device = torch.device(args.device)
    gpu = catalog.get_gpu(args.profile)
    eff = gpu.efficiency
    scale = QUICK_SCALE if args.quick else 1
    repeats = 3 if args.quick else args.repeats
    peak, hbm = gpu.peak("bf16") * 1e12, gpu.memory_tb_s
    rows = [bench_copy(device, 2.0 / scale, repeats, hbm, eff.memory)]
    rows += bench_gemms(device, GEMM_SHAPES, scale, repeats, peak, eff.gemm, gpu.sms)
    rows += bench_attention(device, ATTENTION_SHAPES, scale, repeats, peak, eff.attention)
    rows += bench_elementwise(device, scale, repeats, hbm, eff.memory)
    rows += bench_fsdp_copies(device, scale, repeats, hbm, eff.memory)
    if device.type == "cuda" and gpu.peak_tflops.get("fp8"):
        fp8_eff = eff.gemm_fp8 or eff.gemm
        try:
            rows += bench_fp8(device, repeats, gpu.peak("fp8") * 1e12, fp8_eff, gpu.sms)
        except (RuntimeError, AttributeError) as exc:  # fp8 GEMMs need sm_89+ and a new torch
            print(f"fp8 GEMMs not measured: {str(exc).splitlines()[0]}")
    env = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "sdpa_flash": bool(torch.backends.cuda.flash_sdp_enabled()),
        "profile": args.profile,
        "constants": {
            "gemm": eff.gemm,
            "gemm_fp8": eff.gemm_fp8,
            "attention": eff.attention,
            "memory": eff.memory,
        },
        "quick": args.quick,
        "repeats": repeats,
    }
    print(
        f"{env['device']}, torch {env['torch']}, against {args.profile}: gemm {eff.gemm:.3f}, "
        f"attention {eff.attention:.3f}, memory {eff.memory:.3f}"
    )
    print(f"{'kernel':<52} {'shape':<20} {'ms':>8} {'measured':>9} {'assumed':>8} {'ratio':>6}")
    for r in rows:
        print(
            f"{r.label:<52} {r.shape:<20} {r.median_ms:8.3f} {r.measured:9.2f} "
            f"{r.assumed:8.2f} {r.ratio:6.2f}  {r.unit}"
        )
    if args.out:
        with open(args.out, "w") as f:
            rows_out = [asdict(r) | {"ratio": r.ratio} for r in rows]
            json.dump({"environment": env, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
