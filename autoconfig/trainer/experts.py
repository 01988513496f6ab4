"""Mixture of experts: top-k routing with an optional capacity per expert, tokens moved to their
experts' ranks with all-to-all (expert parallelism), and experts sharded over tp.

Follows Megatron-LM's MoE (docs "Mixture of Experts", token dispatcher "alltoall"): ep ranks
are taken within dp*cp, each holding num_experts/ep experts; the expert tensor-parallel size
equals tp (expert weights column/row-sharded like a dense MLP), so the tp ranks of a group
route the same (sequence-gathered) tokens and the expert outputs are summed over tp once per
layer. With an expert tensor-parallel size of 1 the experts stay whole, each tp rank routes
its share of the gathered tokens, and ep is folded over tp*dp*cp (mesh.py). With a capacity
factor c, an expert takes at most ceil(c * tokens * topk / experts) of a rank's token
assignments, the earliest first (GShard, Lepikhin et al. 2020); the others are dropped (their
routed output is zero, the residual carries them) and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate

from autoconfig.spec.schema import ModelSpec
from autoconfig.trainer import ops
from autoconfig.trainer.mlp import MLP


@dataclass
class RoutingCounts:
    """Token-to-expert assignments of this rank's forward passes (recomputation excluded)."""

    routed: int = 0
    dropped: int = 0


class LocalExperts(nn.Module):
    """The experts this rank holds, keyed by global expert index (all of them until
    expert parallelism keeps a rank's share)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.experts = nn.ModuleDict(
            {str(e): MLP(spec.hidden, spec.expert_ffn, spec.mlp) for e in range(spec.num_experts)}
        )

    def keep(self, first: int, count: int) -> None:
        for e in list(self.experts):
            if not first <= int(e) < first + count:
                del self.experts[e]

    def forward(self, tokens: torch.Tensor, counts: list[list[int]]) -> torch.Tensor:
        """Rows grouped by source rank, then by local expert (`counts[source][expert]` rows
        each) -> this rank's (partial, under tp) outputs in the same order. Running each
        expert once per source keeps the rows where they arrived: no permutation, and no
        index saved for it."""
        experts = list(self.experts.values())
        pieces = tokens.split([n for per_source in counts for n in per_source])
        # Piece i comes from source i // len(experts) for local expert i % len(experts).
        return torch.cat([experts[i % len(experts)].local_forward(p) for i, p in enumerate(pieces)])


@dataclass(frozen=True)
class _Exchange:
    """How one dispatch moved rows, so combine can move them back."""

    send: list[int]  # rows sent to each ep rank
    recv: list[int]  # rows received from each ep rank


class TokenDispatcher:
    """Sends each token assignment to the ep rank holding its expert and brings the outputs
    back, with `all_to_all_single` (autograd: backward is the reverse all-to-all)."""

    def __init__(self, num_experts: int, mesh: DeviceMesh | None = None) -> None:
        self.num_experts = num_experts
        self.group = mesh.get_group() if mesh is not None else None
        self.ep = mesh.size() if mesh is not None else 1
        self.local = num_experts // self.ep

    def dispatch(
        self, tokens: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, list[list[int]], _Exchange | None]:
        """tokens: rows sorted by expert, `counts` per expert -> (the rows for this rank's
        experts, by source rank then expert; their counts [source][local expert]; the
        exchange)."""
        if self.group is None:
            return tokens, [counts.tolist()], None
        received = torch.empty_like(counts)
        # Each rank tells every other how many rows it sends to each of its local experts.
        dist.all_to_all_single(received, counts, group=self.group)
        send = counts.view(self.ep, self.local).sum(1).tolist()
        per_source = received.view(self.ep, self.local)
        recv = per_source.sum(1).tolist()
        rows = funcol.all_to_all_single_autograd(tokens, recv, send, self.group)
        return funcol.wait_tensor(rows), per_source.tolist(), _Exchange(send, recv)

    def combine(self, out: torch.Tensor, exchange: _Exchange | None) -> torch.Tensor:
        """The experts' output rows back on the ranks (and in the order) they came from."""
        if exchange is None:
            return out
        back = funcol.all_to_all_single_autograd(out, exchange.send, exchange.recv, self.group)
        return funcol.wait_tensor(back)


class MoE(nn.Module):
    """Top-k routed experts (softmax router, weights renormalised over the top k) plus
    optional shared experts, on this rank's experts; tensor and expert parallelism are set by
    the layout (parallel.py)."""

    def __init__(self, spec: ModelSpec, capacity_factor: float | None = None) -> None:
        super().__init__()
        self.topk, self.num_experts = spec.topk, spec.num_experts
        self.capacity_factor = capacity_factor
        self.router = nn.Linear(spec.hidden, spec.num_experts, bias=False)
        self.experts = LocalExperts(spec)
        width = spec.expert_ffn * spec.shared_experts
        self.shared = MLP(spec.hidden, width, spec.mlp) if spec.shared_experts else None
        self.dispatcher = TokenDispatcher(spec.num_experts)
        self.tp_mesh: DeviceMesh | None = None  # set with tensor parallelism
        self.seq_layout: Placement = Replicate()  # Shard(1) with sequence parallelism
        # (rank, tp) with whole experts under tp (etp 1): this tp rank routes its share of
        # the layer's tokens; the others' rows of its routed output are zero (a partial sum).
        self.token_share: tuple[int, int] | None = None
        self.counts = RoutingCounts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_mesh is not None:
            # Every tp rank routes the same tokens; its expert shards give a partial sum, so
            # the input's gradient is partial too (summed over tp by the DTensor backward).
            x = DTensor.from_local(x, self.tp_mesh, [self.seq_layout])
            x = x.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial()])
        flat = x.reshape(-1, x.shape[-1])
        start, stop = 0, flat.shape[0]
        if self.token_share is not None:
            rank, size = self.token_share
            start, stop = stop * rank // size, stop * (rank + 1) // size
        mine = flat[start:stop]
        assignment, weight, counts = self._route(mine)
        token = assignment // self.topk  # one index tensor for the gather and the scatter
        rows, local_counts, exchange = self.dispatcher.dispatch(mine[token], counts)
        out_rows = self.dispatcher.combine(self.experts(rows, local_counts), exchange)
        # scatter_add's backward keeps only the index (index_add's would keep its source too).
        index = token[:, None].expand_as(out_rows)
        out = torch.zeros_like(mine).scatter_add(0, index, out_rows * weight[:, None])
        if self.token_share is not None:  # zero rows for the tokens other tp ranks route
            out = F.pad(out, (0, 0, start, flat.shape[0] - stop))
        if self.shared is not None:
            out = out + self.shared.local_forward(flat)
        out = out.view_as(x)
        if self.tp_mesh is None:
            return out
        out = DTensor.from_local(out, self.tp_mesh, [Partial()])
        return out.redistribute(placements=[self.seq_layout]).to_local()

    def _route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kept assignments sorted by expert, as token*topk + slot; their gate weights;
        kept assignments per expert)."""
        router = self.router.weight
        if self.tp_mesh is not None:
            # The gate weights multiply partial (per tp rank) expert outputs: the router's
            # weight gradient is a partial sum over tp.
            router = ops.AllReduceGrad.apply(router, self.tp_mesh.get_group())
        probs = F.linear(flat, router).float().softmax(-1)
        weight, chosen = probs.topk(self.topk, dim=-1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(flat.dtype).reshape(-1)
        expert = chosen.reshape(-1)
        order = torch.argsort(expert, stable=True)  # token order within each expert
        counts = torch.bincount(expert, minlength=self.num_experts)
        routed = expert.numel()
        if self.capacity_factor is not None:
            capacity = math.ceil(self.capacity_factor * routed / self.num_experts)
            first = torch.cumsum(counts, 0) - counts
            place = torch.arange(routed, device=flat.device) - first[expert[order]]
            order = order[place < capacity]
            counts = counts.clamp(max=capacity)
        if torch._C._current_graph_task_id() == -1:  # not a recomputation inside backward
            self.counts.routed += routed
            self.counts.dropped += routed - order.numel()
        return order, weight[order], counts
