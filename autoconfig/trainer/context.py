"""Context parallelism: the sequence split over cp ranks in load-balanced causal chunks, and
attention over K/V all-gathered in every layer (Llama 3, Dubey et al. 2024, Sec. 3.3.2).

Rank r holds chunks r and 2cp-1-r of 2cp equal chunks, so every rank has the same causal work
(the load balancing of Megatron-LM's context parallelism and of Llama 3). Its queries attend
to the whole gathered sequence through an additive causal mask for its own positions. The
gather is the functional all-gather with autograd, whose backward reduce-scatters dK and dV,
so the gradients are exact. Only the local K/V shard is kept for backward: a saved-tensor hook swaps
the gathered K/V for the shard and gathers again when backward needs them, so a rank keeps what
ring attention keeps (what the cost model assumes), at the price of one more all-gather per
layer in backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh

from autoconfig.trainer import ops

# torch 2.12 renamed these (the old names warn there); older releases have only the old names.
_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_gather_autograd = (
    getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd
)


def chunk_positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions of the tokens rank `rank` holds: chunks rank and 2cp-1-rank."""
    chunk = seq // (2 * cp)
    late = 2 * cp - 1 - rank
    return torch.cat(
        [
            torch.arange(rank * chunk, (rank + 1) * chunk),
            torch.arange(late * chunk, (late + 1) * chunk),
        ]
    )


def causal_mask(positions: torch.Tensor, seq: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask (local queries x all keys): a query sees the keys at or before it."""
    visible = torch.arange(seq, device=positions.device)[None, :] <= positions[:, None]
    mask = torch.zeros(visible.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill(~visible, float("-inf"))


def _global_order(gathered: torch.Tensor, cp: int) -> torch.Tensor:
    """(cp*b, 2c, ...) stacked by rank -> (b, 2cp*c, ...) in sequence order: rank r's first
    chunk is chunk r, its second chunk is chunk 2cp-1-r."""
    per_rank = gathered.chunk(cp, dim=0)
    early = [part.chunk(2, dim=1)[0] for part in per_rank]
    late = [part.chunk(2, dim=1)[1] for part in reversed(per_rank)]
    return torch.cat(early + late, dim=1)


@dataclass(frozen=True)
class _Shard:
    """What backward keeps of a gathered K or V: the local shard and the saved view's shape."""

    local: torch.Tensor
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class ContextParallel:
    """One rank's share of the sequence, and attention over the gathered K/V."""

    def __init__(self, mesh: DeviceMesh, seq: int, dtype: torch.dtype, device: torch.device):
        self.group = mesh.get_group()
        self.size = mesh.size()
        self.rank = mesh.get_local_rank()
        self.seq = seq
        self.positions = chunk_positions(seq, self.size, self.rank).to(device)
        # A constant of the layout, like the rope tables, built once and shared by all layers.
        self.mask = causal_mask(self.positions, seq, dtype)

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """(b, local seq, heads, d) -> (b, seq, heads, d); backward reduce-scatters."""
        return _global_order(_gather_autograd(t, 0, self.group), self.size)

    def _regather(self, shard: _Shard) -> torch.Tensor:
        full = _global_order(_gather(shard.local, 0, self.group), self.size)
        return full.as_strided(shard.size, shard.stride, shard.offset)

    def attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float,
        keep_shards: bool,
        doc_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q, k, v: (b, local seq, heads, d) -> (b, heads, local seq, d). `keep_shards`: keep
        only the local K/V for backward (off inside a recomputed region, whose checkpoint
        already keeps only its inputs). `doc_mask`: packed documents' mask of the local
        queries against all keys (packing.document_mask), in place of the causal one."""
        k_full, v_full = self.gather(k), self.gather(v)
        q_t, k_t, v_t = (t.transpose(1, 2) for t in (q, k_full, v_full))
        attn_mask = self.mask if doc_mask is None else doc_mask

        def attend() -> torch.Tensor:
            return F.scaled_dot_product_attention(
                q_t,
                k_t,
                v_t,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                enable_gqa=q_t.shape[1] != k_t.shape[1],
            )

        if not keep_shards:
            return attend()
        shards = {_storage(k_full): k.detach(), _storage(v_full): v.detach()}
        mask = _storage(attn_mask)

        def pack(t: torch.Tensor) -> torch.Tensor | _Shard:
            local = shards.get(_storage(t))
            if local is None:
                if _storage(t) != mask:  # a layout constant, not an activation
                    ops.record_saved(t)
                return t
            ops.record_saved(local)
            return _Shard(local, t.size(), t.stride(), t.storage_offset())

        def unpack(saved: torch.Tensor | _Shard) -> torch.Tensor:
            return self._regather(saved) if isinstance(saved, _Shard) else saved

        # These hooks replace the outer ones (the saved-bytes counter) for this call, so
        # pack reports to the counter itself what stays alive.
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return attend()


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()
