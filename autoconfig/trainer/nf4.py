"""QLoRA's frozen NF4 base weights for the bundled trainer: quantize, dequantize, and the linear."""

# What is stored, as the cost model counts it (cost/finetune.py NF4_BYTES_PER_PARAM, from QLoRA,
# Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", Sec. 3):
# - 4-bit NormalFloat codes, two to a byte, one absmax per block of 64 weights;
# - double quantization: the block absmaxes minus their mean, in 8 bits, with one fp32 scale
#   per group of 256 blocks (and the mean, one fp32 per weight).
# Every forward dequantizes the weight to the compute dtype and backward does it again for the
# input's gradient: nothing but the quantized form lives between them (bitsandbytes' and
# torchao's NF4 linears work so, and cost/layer.py dequantize_op charges both passes).
#
# Blocks run along the hidden width: a column-parallel weight (q, k, v, MLP up and gate; out x
# hidden) is blocked along its input, a row-parallel one (attention out, MLP down; hidden x in)
# along its output. Tensor parallelism splits the other axis, so a rank's shard is whole
# hidden-width lines: its blocks are exactly the full weight's blocks of those lines, whatever
# tp divides (a 176-wide shard of tiny-llama's 352-wide MLP down projection would cut 64-blocks
# if they ran along it). Only the hidden width must be a multiple of 64 (TrainConfig.checked).

from __future__ import annotations

from itertools import pairwise
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Shard

from autoconfig.trainer.config import NF4_BLOCK

# The 16 NF4 values: QLoRA (Dettmers et al. 2023), Appendix E, "NormalFloat 4-bit data type"
# (quantiles of N(0, 1) scaled to [-1, 1], asymmetric so that zero is exact).
NF4_CODES = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)
BLOCK = NF4_BLOCK  # weights per absmax (QLoRA Sec. 3)
GROUP = 256  # absmaxes per second-level fp32 scale (QLoRA Sec. 3, double quantization)
# The paper quantizes the absmaxes to "8-bit Floats" (Sec. 3, Double Quantization), so fp8:
# e4m3 rather than e5m2, since the centered absmaxes are scaled to their group's largest and
# need mantissa bits, not range. It is stored as its uint8 bits, which every collective moves
# (DDP's first broadcast, FSDP's moves) where float8 may not be supported (gloo).
ABSMAX_DTYPE = torch.float8_e4m3fn
ABSMAX_MAX = float(torch.finfo(ABSMAX_DTYPE).max)  # 448

COLUMN, ROW = "column", "row"  # blocked along the input, or along the output (module notes)
_LINEARS = {"attn": {"wq": COLUMN, "wk": COLUMN, "wv": COLUMN, "wo": ROW},
            "mlp": {"w1": COLUMN, "w3": COLUMN, "w2": ROW}}  # fmt: skip


def codes_table(device: torch.device | None = None) -> torch.Tensor:
    return torch.tensor(NF4_CODES, dtype=torch.float32, device=device)


def largest_half_gap() -> float:
    """Half the widest gap between adjacent NF4 values: the most a weight divided by its
    block's absmax moves when rounded to the nearest one (0.152, between -1 and -0.696)."""
    return max(b - a for a, b in pairwise(NF4_CODES)) / 2


def quantize_blocks(lines: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes, fp32 absmax per block) of `lines`, whose rows are cut into blocks of 64:
    each weight divided by its block's absmax and rounded to the nearest NF4 value; two 4-bit
    codes a byte, the first in the high nibble."""
    blocks = lines.detach().float().reshape(-1, BLOCK)
    absmax = blocks.abs().amax(dim=1)
    # an all-zero block keeps absmax 0 (it dequantizes to zeros); only the division needs > 0
    scaled = blocks / absmax.clamp(min=torch.finfo(torch.float32).tiny)[:, None]
    table = codes_table(lines.device)
    codes = torch.bucketize(scaled.flatten(), (table[1:] + table[:-1]) / 2).to(torch.uint8)
    return (codes[0::2] << 4) | codes[1::2], absmax


def double_quantize(absmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(fp8 bits, fp32 scale per 256 blocks, fp32 mean) of the block absmaxes: they are all
    positive, so their mean is taken off first and the symmetric 8-bit code spends its range
    on their spread (QLoRA Sec. 3)."""
    # float64: the same mean whatever the summation order (a tp rank gathers the full vector)
    mean = absmax.double().mean().float()
    centered = absmax - mean
    groups = -(-centered.numel() // GROUP)
    padded = F.pad(centered, (0, groups * GROUP - centered.numel())).view(groups, GROUP)
    largest = padded.abs().amax(dim=1)
    scales = torch.where(largest > 0, largest / ABSMAX_MAX, torch.ones_like(largest))
    q = (padded / scales[:, None]).clamp(-ABSMAX_MAX, ABSMAX_MAX).to(ABSMAX_DTYPE)
    return q.flatten()[: absmax.numel()].view(torch.uint8), scales, mean


def dequantize_absmax(
    bits: torch.Tensor, scales: torch.Tensor, mean: torch.Tensor, first: int = 0
) -> torch.Tensor:
    """The fp32 absmaxes back; `first`: the position of the first one in its 256-group (a tp
    shard that starts inside a group; `scales` then starts at that group)."""
    group = (torch.arange(bits.numel(), device=bits.device) + first) // GROUP
    return bits.view(ABSMAX_DTYPE).float() * scales[group] + mean


def dequantize_blocks(packed: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """fp32 weights, one row per block, from packed codes and the blocks' absmaxes."""
    codes = torch.stack([packed >> 4, packed & 15], dim=-1).flatten().to(torch.int32)
    return codes_table(packed.device)[codes].view(-1, BLOCK) * absmax[:, None]


def round_trip(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (rows a multiple of 64 wide) quantized and dequantized, in fp32."""
    packed, absmax = quantize_blocks(weight)
    scaled = dequantize_absmax(*double_quantize(absmax))
    return dequantize_blocks(packed, scaled).view(weight.shape)


class _NF4Matmul(torch.autograd.Function):
    """x W^T with W dequantized from `linear`'s NF4 storage in forward and again in backward
    (the weight is frozen: backward needs only the input's gradient, so neither x nor W is
    kept; the storage is reached through ctx, not saved, since it is the weight, not an
    activation)."""

    @staticmethod
    def forward(ctx, x, linear, dtype, rows):  # type: ignore[override]
        ctx.linear, ctx.dtype, ctx.rows, ctx.x_dtype = linear, dtype, rows, x.dtype
        return F.linear(x.to(dtype), linear.dequantized(dtype, rows))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        weight = ctx.linear.dequantized(ctx.dtype, ctx.rows)
        return grad.to(ctx.dtype).matmul(weight).to(ctx.x_dtype), None, None, None


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """What the GEMM runs in: autocast's dtype (bf16 on GPU), else the input's."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


class NF4Linear(nn.Linear):
    """A frozen linear layer whose weight is held in NF4 (module notes). `quantize_linear`
    makes one from a built nn.Linear, TP-sharded or not, by swapping its class in place (as
    fully_shard swaps classes), so the TP plan's input and output hooks stay on it."""

    codes: torch.Tensor  # uint8, two codes a byte
    absmax_bits: torch.Tensor  # fp8 bits (ABSMAX_DTYPE) of the centered absmax per block
    absmax_scales: torch.Tensor  # fp32 per group of 256 blocks this rank's blocks fall in
    absmax_mean: torch.Tensor  # fp32 scalar
    role: str  # COLUMN: blocked along the input (the lines are W's rows); ROW: along the output
    lines: tuple[int, int]  # (lines, hidden) of the rank's shard
    first: int  # the first block's position in its 256-group
    sharded: str | None  # COLUMN or ROW under tensor parallelism (DTensor in and out)
    represented: int  # weights the shard stands for

    def dequantized(self, dtype: torch.dtype, rows: slice | None = None) -> torch.Tensor:
        """The rank's weight (out x in) in `dtype`; `rows`: only those output rows."""
        absmax = dequantize_absmax(
            self.absmax_bits, self.absmax_scales, self.absmax_mean, self.first
        )
        lines = dequantize_blocks(self.codes, absmax).view(self.lines).to(dtype)
        weight = lines if self.role == COLUMN else lines.t()
        return weight if rows is None else weight[rows]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(x)
        if not isinstance(x, DTensor):
            return cast(torch.Tensor, _NF4Matmul.apply(x, self, dtype, None))
        mesh = x.device_mesh
        if self.sharded == COLUMN:
            # the rank's output columns: its share of the input's gradient is a partial sum
            local = x.to_local(grad_placements=[Partial()])
            out = _NF4Matmul.apply(local, self, dtype, None)
            return DTensor.from_local(out, mesh, [Shard(-1)], run_check=False)
        # row-parallel: the input is the rank's feature shard, the output a partial sum
        out = _NF4Matmul.apply(x.to_local(), self, dtype, None)
        return DTensor.from_local(out, mesh, [Partial()], run_check=False)

    def project_rows(self, x: torch.Tensor, rows: slice) -> torch.Tensor:
        """x times the transpose of the weight's output rows `rows` (a K/V head kept whole on
        every tp rank: model.Attention._kv)."""
        return cast(torch.Tensor, _NF4Matmul.apply(x, self, compute_dtype(x), rows))

    def held_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.buffers())


def quantize_linear(linear: nn.Linear, role: str) -> NF4Linear:
    """`linear` (built, tensor-parallel or not) turned into an NF4Linear in place: its weight
    (the rank's shard) quantized and dropped. Under tensor parallelism the shard is quantized
    on its own; only the absmaxes are gathered over tp for their second level (the mean and
    the 256-groups of the whole weight, which a shard of a small weight cuts), so every rank
    holds exactly its slice of what one process holds."""
    weight = linear.weight.detach()
    sharded: str | None = None
    if isinstance(weight, DTensor):
        sharded = COLUMN if weight.placements[0] == Shard(0) else ROW
        mesh, rank = weight.device_mesh, weight.device_mesh.get_local_rank()
        weight = weight.to_local()
        # the TP plan splits the axis the blocks do not run along (module notes)
        assert sharded == role, f"a {role}-blocked weight sharded as {sharded}"
    lines = weight if role == COLUMN else weight.t()
    packed, absmax = quantize_blocks(lines)
    start, count = 0, absmax.numel()
    if sharded is not None:
        start = rank * count  # tp splits the lines evenly (TrainConfig.checked)
        absmax = DTensor.from_local(absmax, mesh, [Shard(0)], run_check=False).full_tensor()
    bits, scales, mean = double_quantize(absmax)
    groups = slice(start // GROUP, (start + count - 1) // GROUP + 1)
    del linear.weight
    linear.__class__ = NF4Linear
    quantized = cast(NF4Linear, linear)
    quantized.register_buffer("codes", packed)
    quantized.register_buffer("absmax_bits", bits[start : start + count].clone())
    quantized.register_buffer("absmax_scales", scales[groups].clone())
    quantized.register_buffer("absmax_mean", mean)
    quantized.role, quantized.sharded = role, sharded
    quantized.lines = (lines.shape[0], lines.shape[1])
    quantized.first = start % GROUP
    quantized.represented = weight.numel()
    return quantized


def quantize_base(model: nn.Module) -> None:
    """Every layer's linear weights (attention q, k, v, out; MLP up, gate, down) held in NF4,
    whatever the LoRA targets: the cost model counts all of them so (cost/memory.py: a layer's
    linear weights, `base_weight_bytes`). The embeddings, the LM head and the norms stay as
    they are, as there."""
    for layer in cast(nn.ModuleDict, model.layers).values():
        for part, names in _LINEARS.items():
            owner = getattr(layer, part)
            for name, role in names.items():
                linear = getattr(owner, name, None)
                if isinstance(linear, nn.Linear) and not isinstance(linear, NF4Linear):
                    quantize_linear(linear, role)


def quantized_linears(model: nn.Module) -> list[NF4Linear]:
    return [m for m in model.modules() if isinstance(m, NF4Linear)]
