"""LoRA adapters (Hu et al. 2021) on the bundled model's frozen linear layers, laid out as the
cost model counts them (cost/layer.py adapter_ops, cost/finetune.py TARGET_OPS).

One adapter per base GEMM of the cost model's op list: the query projection, the key and value
projections (one adapter, A shared, B producing both), the attention output, the MLP's up (and
gate) projection (one adapter) and its down projection; `lora_targets` picks qkv, those and the
output (attention), or all. The LM head, the embeddings and the norms carry none and, with every
base weight, are frozen (`requires_grad_(False)`: no gradient, no optimizer state). An adapter
adds (alpha / r) * B A x with A (r x in) Kaiming-uniform and B (out x r) zero, so the first
step's loss is the base model's.

Under tensor parallelism the factor on the sharded side of the base weight is split as the base
is and the other kept whole (Megatron-Core's and torchtitan's LoRA under TP, as the cost model
counts them: r (k + n) per rank for a GEMM of k inputs and n outputs per rank):
- column-parallel base (q, k, v, up/gate): A whole, B's rows split; each rank's B gives its
  output columns from the full-width r-vector, so A's weight gradient and the input's gradient
  through the adapter are partial sums over tp (summed as `Attention._kv` sums them);
- row-parallel base (attention out, MLP down): A's columns split, B whole; the rank's partial
  r-vectors are summed over tp before B (r values a token, not the hidden width); with sequence
  parallelism a rank keeps its sequence shard of B's output, so B's gradient is summed too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial

from autoconfig.spec.vocab import LoraTargets
from autoconfig.trainer import ops

if TYPE_CHECKING:  # model.py and mlp.py import this module
    from autoconfig.trainer.mlp import MLP
    from autoconfig.trainer.model import Attention, Block, Transformer

# The adapters of a layer: name -> (module holding it, its target level, column or row).
COLUMN, ROW = "column", "row"
ATTENTION_ADAPTERS = {"q": LoraTargets.QKV, "kv": LoraTargets.QKV, "o": LoraTargets.ATTENTION}
MLP_ADAPTERS = {"up": LoraTargets.ALL, "down": LoraTargets.ALL}
LEVEL = {LoraTargets.QKV: 1, LoraTargets.ATTENTION: 2, LoraTargets.ALL: 3}

# Offsets the adapters' generators from the base weights' (model.Transformer.init_weights keys
# each layer's stream by its global index + 1).
ADAPTER_STREAM = 500009


class Adapter(nn.Module):
    """B A beside one base GEMM whose output is `parts` (e.g. K and V) laid end to end."""

    def __init__(self, in_features: int, parts: list[int], rank: int, alpha: float, kind: str):
        super().__init__()
        self.kind, self.rank, self.scale = kind, rank, alpha / rank
        self.parts = list(parts)  # the local widths of the outputs B produces
        self.a = nn.Parameter(torch.empty(rank, in_features))
        self.b = nn.Parameter(torch.zeros(sum(parts), rank))
        # Set by the TP plan (shard): the tp group, whether the output is a sequence shard
        # (row-parallel under sequence parallelism), and for K/V heads kept whole on every tp
        # rank (tp above the K/V heads) the rows of B this rank's heads use.
        self.group: dist.ProcessGroup | None = None
        self.seq_shard: tuple[int, int] | None = None
        self.rows: torch.Tensor | None = None

    def init(self, gen: torch.Generator) -> None:
        """A as nn.Linear and PEFT draw it (Kaiming-uniform, a = sqrt(5): bound 1/sqrt(in));
        B zero."""
        bound = 1.0 / math.sqrt(self.a.shape[1])
        with torch.no_grad():
            self.a.copy_(torch.empty(self.a.shape).uniform_(-bound, bound, generator=gen))
            self.b.zero_()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The scaled B A x of every part. Column: `x` is the full-width input prepared by
        `column_input`; row: the rank's input shard (a plain tensor)."""
        if self.kind == COLUMN:
            a = ops.AllReduceGrad.apply(self.a, self.group) if self.group is not None else self.a
            b = self.b
            if self.rows is not None:
                b = ops.AllReduceGrad.apply(b, self.group)[self.rows]
            out = F.linear(F.linear(x, a), b) * self.scale
            return list(out.split(self._local_parts(), dim=-1))
        z = F.linear(x, self.a)
        b = self.b
        if self.group is not None:
            sharded = self.seq_shard is not None
            z = ops.AllReduceForward.apply(z, self.group, sharded)
            if self.seq_shard is not None:  # sharded
                rank, size = self.seq_shard
                local = z.shape[1] // size
                z = z[:, rank * local : (rank + 1) * local]
                b = ops.AllReduceGrad.apply(b, self.group)  # each rank saw its shard only
        return [F.linear(z, b) * self.scale]

    def _local_parts(self) -> list[int]:
        if self.rows is None:
            return self.parts
        return [len(self.rows) // len(self.parts)] * len(self.parts)


def by_name(adapters: nn.ModuleDict | None) -> dict[str, Adapter]:
    """The adapters an Attention or MLP holds (its `adapters`, set by `attach`) by name; none
    without LoRA."""
    if adapters is None:
        return {}
    return {name: cast(Adapter, adapter) for name, adapter in adapters.items()}


def column_input(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The input of column-parallel adapters as a plain tensor whose gradient (a partial sum
    per tp rank, since each rank's B holds its own output columns) is summed over tp: under
    sequence parallelism it arrives as a replicated DTensor, whose gradient DTensor reduces."""
    if isinstance(x, DTensor):
        return x.to_local(grad_placements=[Partial()])
    if group is None:
        return x
    return ops.AllReduceGrad.apply(x, group)


def targeted(targets: LoraTargets, names: dict[str, LoraTargets]) -> list[str]:
    return [n for n, level in names.items() if LEVEL[targets] >= LEVEL[level]]


def attach(model: Transformer, rank: int, alpha: float, targets: LoraTargets, seed: int) -> None:
    """Adapters on every layer of `model` (a Transformer stage, full widths, before any
    layout), each drawn from a generator keyed by its global layer index, so every split
    starts from the same adapters."""
    owner: Attention | MLP
    for name, layer in model.layers.items():
        gen = torch.Generator().manual_seed(seed * 100003 + ADAPTER_STREAM + int(name))
        block = cast("Block", layer)
        # a dense layer's MLP: MoE layers take no adapters (refused by TrainConfig.checked)
        attn, mlp = block.attn, cast("MLP", block.mlp)
        h = attn.wq.weight.shape[1]
        shapes = {
            "q": (h, [attn.wq.weight.shape[0]], COLUMN),
            "kv": (h, [attn.wk.weight.shape[0], attn.wv.weight.shape[0]], COLUMN),
            "o": (attn.wo.weight.shape[1], [h], ROW),
        }
        up = [mlp.w1.weight.shape[0]] + ([mlp.w3.weight.shape[0]] if mlp.w3 is not None else [])
        mlp_shapes = {"up": (h, up, COLUMN), "down": (mlp.w2.weight.shape[1], [h], ROW)}
        device, dtype = attn.wq.weight.device, attn.wq.weight.dtype
        for owner, names, table in (
            (attn, ATTENTION_ADAPTERS, shapes),
            (mlp, MLP_ADAPTERS, mlp_shapes),
        ):
            chosen = targeted(targets, names)
            adapters = nn.ModuleDict()
            for adapter_name in chosen:  # drawn in a fixed order: q, kv, o, up, down
                in_features, parts, kind = table[adapter_name]
                adapter = Adapter(in_features, parts, rank, alpha, kind)
                adapter.init(gen)
                adapters[adapter_name] = adapter.to(device=device, dtype=dtype)
            owner.adapters = adapters if chosen else None


def adapters_of(model: nn.Module) -> Iterator[Adapter]:
    return (m for m in model.modules() if isinstance(m, Adapter))


def shard(layer: nn.Module, tp: int, rank: int, group: dist.ProcessGroup, sp: bool) -> None:
    """The TP layout of one layer's adapters (module docstring): B's rows of a column-parallel
    base and A's columns of a row-parallel one split into tp equal shares, rank `rank` keeping
    its own; K/V heads kept whole (tp above the K/V heads) keep B whole and use their rows."""
    block = cast("Block", layer)
    kv_whole = block.attn.kv_group is not None
    for owner in (block.attn, block.mlp):
        # an MoE layer has no adapters (refused by TrainConfig.checked) nor the attribute
        for name, adapter in (getattr(owner, "adapters", None) or {}).items():
            adapter.group = group
            with torch.no_grad():
                if adapter.kind == ROW:
                    adapter.a = nn.Parameter(adapter.a.chunk(tp, dim=1)[rank].clone())
                    adapter.seq_shard = (rank, tp) if sp else None
                elif name == "kv" and kv_whole:
                    rows = block.attn.kv_rows
                    width = adapter.parts[0]
                    index = torch.arange(width)[rows]
                    adapter.rows = torch.cat([index, index + width]).to(adapter.b.device)
                else:
                    pieces = adapter.b.split(adapter.parts, dim=0)
                    mine = [p.chunk(tp, dim=0)[rank] for p in pieces]
                    adapter.b = nn.Parameter(torch.cat(mine).clone())
                    adapter.parts = [p.shape[0] for p in mine]


def freeze_base(model: nn.Module) -> None:
    """Every parameter but the adapters' stops training: no gradient, no optimizer state."""
    trained = {id(p) for adapter in adapters_of(model) for p in adapter.parameters()}
    for p in model.parameters():
        if id(p) not in trained:
            p.requires_grad_(False)
