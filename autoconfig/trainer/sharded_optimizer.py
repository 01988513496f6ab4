"""ZeRO-1 for any parameters (plain or DTensor shards): optimizer states sharded over the ranks
holding the same weights, as Megatron-LM's distributed optimizer does.

Each group's local tensors (a DTensor's rank-local shard, so tensor-parallel layouts work) are
laid end to end in one flat buffer, padded to a multiple of the group size; rank i owns the
i-th contiguous range. A step reduce-scatters the gradients (the mean over the group) into the
owned range, runs the optimizer there (its states exist for that range only), and all-gathers
the updated weights back into every local tensor (Megatron-LM docs, "Distributed Optimizer";
Rajbhandari et al. 2020, ZeRO stage 1). The optimizers used (AdamW, SGD) are elementwise, so a
range may cut a tensor anywhere. `torch.distributed.optim.ZeroRedundancyOptimizer` cannot
shard DTensor parameters, and expert parameters reduce over another group than dense ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from autoconfig.trainer import ops

# torch 2.12 renamed the flat-tensor collectives (the old names warn there); older releases
# have only the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Bucket:
    """The parameters reduced over one process group, and this rank's range of them."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup, divide: int) -> None:
        self.params, self.group, self.divide = params, group, divide
        self.size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.numels = [ops.local_tensor(p).numel() for p in params]
        total = sum(self.numels)
        self.shard = -(-total // self.size)  # ceil: the last range is padded
        self.padded = self.shard * self.size
        flat = self._flat([ops.local_tensor(p).detach() for p in params])
        owned = flat[rank * self.shard : (rank + 1) * self.shard].clone()
        self.master = nn.Parameter(owned)

    def _flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return nn.functional.pad(flat, (0, self.padded - flat.numel()))

    def reduce_gradients(self) -> None:
        grads = [
            ops.local_tensor(p.grad)
            if p.grad is not None
            else torch.zeros_like(ops.local_tensor(p))
            for p in self.params
        ]
        flat = self._flat([g.detach() for g in grads])
        owned = torch.empty(self.shard, dtype=flat.dtype, device=flat.device)
        _reduce_scatter(owned, flat, group=self.group)  # gloo has no AVG: sum, then divide
        self.master.grad = owned.div_(self.divide)

    @torch.no_grad()
    def gather_weights(self) -> None:
        flat = torch.empty(self.padded, dtype=self.master.dtype, device=self.master.device)
        _all_gather(flat, self.master.detach(), group=self.group)
        pieces = flat[: sum(self.numels)].split(self.numels)
        for p, piece in zip(self.params, pieces, strict=True):
            local = ops.local_tensor(p)
            local.copy_(piece.view_as(local))


class ShardedOptimizer:
    """`make_inner` (e.g. AdamW) over this rank's ranges of every bucket: (parameters, the
    group reducing their gradients, what the summed gradients are divided by)."""

    def __init__(
        self,
        buckets: Sequence[tuple[list[nn.Parameter], dist.ProcessGroup, int]],
        make_inner: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    ) -> None:
        self.buckets = [_Bucket(*bucket) for bucket in buckets if bucket[0]]
        self.optim = make_inner([b.master for b in self.buckets])

    @property
    def state(self):
        """The inner optimizer's states: this rank's ranges only."""
        return self.optim.state

    def step(self) -> None:
        for bucket in self.buckets:
            bucket.reduce_gradients()
        self.optim.step()
        for bucket in self.buckets:
            bucket.gather_weights()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for bucket in self.buckets:
            for p in bucket.params:
                p.grad = None
        self.optim.zero_grad(set_to_none=set_to_none)
