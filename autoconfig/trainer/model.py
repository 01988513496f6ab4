"""The bundled decoder-only transformer: every architecture feature of the catalog.

LayerNorm/RMSNorm, GELU/SwiGLU/squared-ReLU, learned or rotary positions, MHA/GQA through
SDPA (flash on GPU and CPU), tied or untied embeddings, dropout, and top-k routed MoE
(experts.py). Linear layers carry no bias, as in Llama and as the cost model counts parameters.

Modules are plain `nn.Module`s working on rank-local tensors: the TP plan (parallel.py) turns
the linears into DTensor-sharded ones, attention infers its local head count from the sharded
projection width, and with context parallelism (context.py) a rank holds its share of the
sequence, so one code path serves every layout.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from autoconfig.spec.schema import ModelSpec
from autoconfig.trainer import lora, nf4, ops
from autoconfig.trainer.context import ContextParallel
from autoconfig.trainer.experts import MoE
from autoconfig.trainer.mlp import MLP
from autoconfig.trainer.packing import document_mask, positions_in_documents


def rope_tables(seq: int, head_dim: int, base: float = 500000.0) -> tuple[torch.Tensor, ...]:
    """cos/sin tables of rotary embeddings (Su et al. 2021), shape (seq, head_dim)."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, seq, heads, head_dim); cos, sin: (seq, head_dim), or (batch, seq, head_dim)
    when every sequence has its own positions (packed documents)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos.to(x.dtype)[..., None, :], sin.to(x.dtype)[..., None, :]
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, d = spec.hidden, spec.dhead
        self.head_dim = d
        self.dropout = 0.1 if spec.dropout else 0.0
        self.wq = nn.Linear(h, spec.heads * d, bias=False)
        self.wk = nn.Linear(h, spec.kv * d, bias=False)
        self.wv = nn.Linear(h, spec.kv * d, bias=False)
        self.wo = nn.Linear(spec.heads * d, h, bias=False)
        self.selective = False  # recompute the attention core in backward (set by the plan)
        self.in_recomputed_block = False  # the whole layer is recomputed (set by the plan)
        self.context: ContextParallel | None = None  # set with context parallelism
        # tp above the K/V heads (set by the plan): wk/wv stay whole on every tp rank, which
        # projects the one K/V head its query heads share (`kv_rows`) and sums the weights'
        # and the input's gradients over the tp group (Megatron-LM replicates K/V heads too).
        self.kv_group: torch.distributed.ProcessGroup | None = None
        self.kv_rows = slice(None)
        self.adapters: nn.ModuleDict | None = None  # LoRA "q", "kv", "o" (lora.attach)

    def core(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q, k, v: (batch, seq, heads, head_dim) -> (batch, heads, seq, head_dim). `mask`:
        packed documents' block-diagonal causal mask (packing.document_mask), else causal."""
        dropout = self.dropout if self.training else 0.0
        if self.context is not None:
            keep_shards = not (self.selective or self.in_recomputed_block)
            return self.context.attention(q, k, v, dropout, keep_shards, mask)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            dropout_p=dropout,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    def _kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V projections of this rank's K/V heads."""
        if self.kv_group is None:
            return self.wk(x), self.wv(x)
        # Each rank's share of the input's gradient comes from its own K/V head only: a
        # partial sum over tp (under sp the input arrives as a replicated DTensor).
        if isinstance(x, DTensor):
            local = x.to_local(grad_placements=[Partial()])
        else:
            local = ops.AllReduceGrad.apply(x, self.kv_group)
        if isinstance(self.wk, nf4.NF4Linear) and isinstance(self.wv, nf4.NF4Linear):
            # qlora: frozen NF4 weights, whose gradient there is none to sum
            return self.wk.project_rows(local, self.kv_rows), self.wv.project_rows(
                local, self.kv_rows
            )
        wk = ops.AllReduceGrad.apply(self.wk.weight, self.kv_group)[self.kv_rows]
        wv = ops.AllReduceGrad.apply(self.wv.weight, self.kv_group)[self.kv_rows]
        return F.linear(local, wk), F.linear(local, wv)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x)
        k, v = self._kv(x)
        adapters = lora.by_name(self.adapters)
        if "q" in adapters or "kv" in adapters:
            any_adapter = adapters["q"] if "q" in adapters else adapters["kv"]
            local = lora.column_input(x, any_adapter.group)  # once for q and kv
            if "q" in adapters:
                q = q + adapters["q"](local)[0]
            if "kv" in adapters:
                dk, dv = adapters["kv"](local)
                k, v = k + dk, v + dv
        # -1: the local head count, heads/tp under tensor parallelism.
        q = q.view(b, s, -1, self.head_dim)
        k, v = k.view(b, s, -1, self.head_dim), v.view(b, s, -1, self.head_dim)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.selective:
            out = ops.checkpointed(self.core, q, k, v, mask)
        else:
            out = self.core(q, k, v, mask)
        heads = out.transpose(1, 2).reshape(b, s, -1)
        if "o" in adapters:
            return self.wo(heads) + adapters["o"](heads)[0]
        return self.wo(heads)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, capacity_factor: float | None = None) -> None:
        super().__init__()
        self.attn_norm = ops.Norm(spec.hidden, spec.norm)
        self.attn = Attention(spec)
        self.mlp_norm = ops.Norm(spec.hidden, spec.norm)
        self.mlp = (
            MoE(spec, capacity_factor) if spec.is_moe else MLP(spec.hidden, spec.ffn, spec.mlp)
        )
        self.dropout = 0.1 if spec.dropout else 0.0
        self.recompute = False  # full recompute of this layer (set by the plan)

    def _forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
        mask: torch.Tensor | None = None,
    ):
        rope = (cos, sin) if cos is not None else None
        x = x + F.dropout(self.attn(self.attn_norm(x), rope, mask), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.mlp_norm(x)), self.dropout, self.training)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor | None = None,
    ):
        """`mask`: packed documents' attention mask (Transformer.forward), else causal."""
        cos, sin = rope if rope is not None else (None, None)
        if self.recompute:
            return ops.checkpointed(self._forward, x, cos, sin, mask)
        return self._forward(x, cos, sin, mask)


class Transformer(nn.Module):
    """A stage-able decoder: `first`/`last` say whether this copy holds the embedding and the
    head, and `layer_ids` which global layers it keeps (pipeline stages drop the others)."""

    def __init__(
        self,
        spec: ModelSpec,
        seq_len: int,
        layer_ids: list[int] | None = None,
        first: bool = True,
        last: bool = True,
        capacity_factor: float | None = None,
    ) -> None:
        super().__init__()
        self.spec, self.first, self.last = spec, first, last
        ids = list(range(spec.layers)) if layer_ids is None else layer_ids
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden) if first else None
        learned = spec.position == "learned"
        self.pos_embeddings = nn.Embedding(seq_len, spec.hidden) if first and learned else None
        self.layers = nn.ModuleDict({str(i): Block(spec, capacity_factor) for i in ids})
        self.norm = ops.Norm(spec.hidden, spec.norm) if last else None
        tie_here = spec.tied_embeddings and first and last
        self.output = (
            None if tie_here or not last else nn.Linear(spec.hidden, spec.vocab, bias=False)
        )
        cos, sin = rope_tables(seq_len, spec.dhead) if not learned else (None, None)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # The whole sequence's rope tables where rope_cos/rope_sin hold a context-parallel
        # rank's rows (set by apply_cp): packed documents index them by position in document.
        self.rope_full: tuple[torch.Tensor, torch.Tensor] | None = None
        self.dropout = 0.1 if spec.dropout else 0.0
        # Set by the TP plan with sequence parallelism: this rank's sequence shard.
        self.seq_shard: tuple[int, int] = (0, 1)
        self.pos_grad_group = None
        # Set with context parallelism: the rank's share of the sequence (its rope tables
        # are then the rows of its positions).
        self.context: ContextParallel | None = None

    def init_weights(self, seed: int) -> None:
        """Deterministic init with one generator per tensor (keyed by global layer index, or
        by embedding / positions / head), so every pipeline split and every layout starts from
        the same weights (std 0.02, output projections scaled by depth)."""
        std = 0.02
        out_std = std / math.sqrt(2 * self.spec.layers)

        def generator(key: int) -> torch.Generator:
            return torch.Generator().manual_seed(seed * 100003 + key)

        def normal(key: int, shape: torch.Size, scale: float = std) -> torch.Tensor:
            return torch.empty(shape).normal_(0, scale, generator=generator(key))

        vocab = torch.Size([self.spec.vocab, self.spec.hidden])
        with torch.no_grad():
            if self.tok_embeddings is not None:
                self.tok_embeddings.weight.copy_(normal(-1, vocab))
            if self.pos_embeddings is not None:
                self.pos_embeddings.weight.copy_(normal(-2, self.pos_embeddings.weight.shape))
            if self.output is not None:
                self.output.weight.copy_(normal(-1 if self.spec.tied_embeddings else -3, vocab))
            for name, block in self.layers.items():
                gen = generator(int(name) + 1)  # one stream per layer, drawn in name order
                for pname, p in sorted(block.named_parameters()):
                    if p.dim() == 1:
                        p.fill_(1.0)
                    else:
                        scale = out_std if pname.endswith(("wo.weight", "w2.weight")) else std
                        p.copy_(torch.empty(p.shape).normal_(0, scale, generator=gen))

    def forward(self, x: torch.Tensor, docs: torch.Tensor | None = None) -> torch.Tensor:
        """`x`: tokens on the first stage, else the previous stage's hidden states. `docs`:
        with packed documents, (batch, seq) document ids of the micro-batch's whole sequences
        (every rank, whatever its context-parallel share): attention stays within each
        document and positions restart at each one."""
        in_doc = positions_in_documents(docs) if docs is not None else None
        if self.first:
            tokens = x
            x = self.tok_embeddings(tokens)
            if self.pos_embeddings is not None:
                x = x + self._positions(tokens.shape[1], tokens.device, in_doc)
            x = F.dropout(x, self.dropout, self.training)
        rope, mask = None, None
        if self.rope_cos is not None:
            # With sequence parallelism a rank holds a contiguous sequence shard between
            # blocks, but attention always sees the rank's whole sequence (TP all-gathers it).
            # (buffers, which nn.Module.__getattr__ types Tensor | Module)
            rope = (cast(torch.Tensor, self.rope_cos), cast(torch.Tensor, self.rope_sin))
        if docs is not None:
            assert in_doc is not None  # computed from docs above
            local = self.context.positions if self.context is not None else None
            mask = document_mask(docs, local)
            ops.not_activation(mask)
            if rope is not None:
                cos, sin = self.rope_full or rope
                mine = in_doc if local is None else in_doc[:, local]
                rope = (cos[mine], sin[mine])
                ops.not_activation(rope[0])
                ops.not_activation(rope[1])
        for block in self.layers.values():
            x = block(x, rope, mask)
        if not self.last:
            return x
        return self.head(self.norm(x))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the final-norm output `x`: the output layer, or the tied embedding."""
        if self.output is not None:
            return self.output(x)
        return self._tied_head(x)

    def _positions(
        self, seq: int, device: torch.device, in_doc: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Learned position embeddings of this rank's tokens (its CP share, its SP shard);
        with packed documents (`in_doc`: each token's position in its document, whole
        sequences) the positions restart at every document."""
        rank, size = self.seq_shard
        local = seq // size
        weight = self.pos_embeddings.weight
        if self.pos_grad_group is not None:
            weight = ops.AllReduceGrad.apply(weight, self.pos_grad_group)
        mine = self.context.positions if self.context is not None else torch.arange(seq)
        shard = mine[rank * local : (rank + 1) * local].to(device)
        if in_doc is not None:
            return F.embedding(in_doc[:, shard], weight)
        return F.embedding(shard, weight)

    def _tied_head(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.tok_embeddings.weight
        if not isinstance(weight, DTensor):
            return F.linear(x, weight)
        # TP: the vocab-sharded embedding is the head; gather the sequence, then the logits.
        layout = [Shard(1)] if self.seq_shard[1] > 1 else [Replicate()]
        x = DTensor.from_local(x, weight.device_mesh, layout).redistribute(placements=[Replicate()])
        return F.linear(x, weight).full_tensor()
