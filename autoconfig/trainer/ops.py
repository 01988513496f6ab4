"""Building blocks whose saved-for-backward tensors match the cost model's op list.

A memory-lean RMSNorm (keeps only its input and the fp32 inverse RMS, like Apex/TE fused
kernels, instead of the fp32 copies the unfused `nn.RMSNorm` keeps; its arithmetic is still
eager tensor ops, which cost.layer.eager_norm_passes charges), activation checkpointing that
records what it keeps alive, and a counter of the bytes autograd saves per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):  # type: ignore[override]
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (x.float() * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, rstd, weight = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        dw = (grad.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx.to(x.dtype), dw.to(weight.dtype), None


class Norm(nn.Module):
    """RMSNorm (saves input + fp32 rstd, computed by eager ops) or LayerNorm (native: input +
    mean + rstd).

    With sequence parallelism the weight gradient is a partial sum per TP rank; `grad_group`
    (set by the TP plan) all-reduces it, as Megatron-LM does for its norm weights."""

    def __init__(self, dim: int, kind: str, eps: float = 1e-5) -> None:
        super().__init__()
        self.kind, self.eps = kind, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.grad_group: dist.ProcessGroup | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if self.grad_group is not None:
            weight = AllReduceGrad.apply(weight, self.grad_group)
        if self.kind == "rmsnorm":
            return _RMSNormFn.apply(x, weight, self.eps)
        return F.layer_norm(x, (x.shape[-1],), weight, None, self.eps)


class AllReduceGrad(torch.autograd.Function):
    """Identity whose backward sums the gradient over a process group."""

    @staticmethod
    def forward(ctx, t, group):  # type: ignore[override]
        ctx.group = group
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class AllReduceForward(torch.autograd.Function):
    """Sums partial results over a process group in forward (Megatron-LM's "reduce from the
    tensor-parallel region"). Backward hands each rank the output's gradient as it is when
    every rank holds the same one (`sum_backward` False: a replicated consumer), or sums it
    too when each rank's consumer used only its own part of the sum (`sum_backward` True: a
    sequence shard under sequence parallelism), since then every rank's partial input fed every
    rank's output."""

    @staticmethod
    def forward(ctx, t, group, sum_backward):  # type: ignore[override]
        ctx.group, ctx.sum_backward = group, sum_backward
        t = t.contiguous().clone()
        dist.all_reduce(t, group=group)
        return t

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if ctx.sum_backward:
            grad = grad.contiguous().clone()
            dist.all_reduce(grad, group=ctx.group)
        return grad, None, None


def not_activation(t: torch.Tensor | None) -> None:
    """Tells the counters measuring now that `t` is a constant of the micro-batch (a packed
    batch's attention mask or per-token rope rows, built once and shared by every layer), not
    an activation a layer saves: the cost model's variable-length attention keeps neither."""
    if t is None:
        return
    for counter in ACTIVE:
        counter.ignore(t)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor of a DTensor (what actually occupies this rank's memory)."""
    return t.to_local() if hasattr(t, "to_local") else t


def storages(t: torch.Tensor) -> list[tuple[int, int]]:
    """(data pointer, bytes) of the real storages behind `t`, looking through tensor
    subclasses (DTensor, the async collective wrappers) to the tensors they hold."""
    if t.device.type == "meta":
        return []
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is not None and type(t) is not torch.nn.Parameter:
        names, _ = flatten()
        inner = [getattr(t, name) for name in names]
        return [s for x in inner if isinstance(x, torch.Tensor) for s in storages(x)]
    storage = t.untyped_storage()
    return [(storage.data_ptr(), storage.nbytes())]


# Autograd nodes a linear may put between a weight's cached cast and what it saves (F.linear
# saves the transposed copy); a few are enough.
VIEW_DEPTH = 3


def is_weight_cast(t: torch.Tensor) -> bool:
    """Whether `t` is (a view of) autocast's 16-bit copy of a parameter: a cast node whose
    input is the parameter itself. Autocast caches only such copies, for the whole step, every
    micro-batch reusing them: the working weight copy the cost model counts with the weights,
    not an activation. A cast of anything computed from a parameter (a slice, a reduction's
    output) is made afresh at each call and stays an activation."""
    fn = t.grad_fn
    for _ in range(VIEW_DEPTH + 1):
        if fn is None or getattr(fn, "variable", None) is not None:
            return False
        inputs = [source for source, _ in fn.next_functions if source is not None]
        if fn.name() == "ToCopyBackward0":
            leaf = getattr(inputs[0], "variable", None) if len(inputs) == 1 else None
            return isinstance(leaf, nn.Parameter)
        if len(inputs) != 1:
            return False
        fn = inputs[0]
    return False


class SavedBytes:
    """Counts the distinct storages autograd saves for backward into every region on
    `stack` (e.g. "all" and "layer3"). Storages are counted once (q/k/v linears share one
    saved input); parameters and autocast's copies of them are not activations and are
    skipped."""

    def __init__(self) -> None:
        self.by_region: dict[str, int] = {}
        self.stack: list[str] = []
        self._seen: dict[str, set[int]] = {}
        self._params: set[int] = set()
        self.transient_params: set[int] = set()  # the running layer's gathered weights

    def ignore_parameters(self, module: nn.Module) -> None:
        for p in [*module.parameters(), *module.buffers()]:  # buffers: rope tables
            self._params.update(ptr for ptr, _ in storages(p.data))

    def ignore(self, t: torch.Tensor) -> None:
        """`t` is not an activation (ops.not_activation)."""
        self._params.update(ptr for ptr, _ in storages(t))

    def add(self, t: object) -> None:
        if not self.stack or not isinstance(t, torch.Tensor) or isinstance(t, nn.Parameter):
            return  # parameters (also FSDP's gathered ones) are not activations
        if is_weight_cast(t):
            return
        for ptr, nbytes in storages(t):
            if ptr in self._params or ptr in self.transient_params or ptr == 0:
                continue
            for region in self.stack:
                seen = self._seen.setdefault(region, set())
                if ptr not in seen:
                    seen.add(ptr)
                    self.by_region[region] = self.by_region.get(region, 0) + nbytes

    @contextmanager
    def hooks(self):
        """Count while inside (packing keeps the tensor itself: no copies, no extra memory)."""

        def pack(t: torch.Tensor) -> torch.Tensor:
            self.add(t)
            return t

        ACTIVE.append(self)
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                yield
        finally:
            ACTIVE.remove(self)


# The counters measuring right now (checkpointed regions report the inputs they keep).
ACTIVE: list[SavedBytes] = []


def record_saved(t: object) -> None:
    """Reports a tensor kept for backward to the counter measuring now, for code whose own
    saved-tensor handling hides it from the counter's hooks."""
    if ACTIVE:
        ACTIVE[-1].add(t)


def checkpointed(fn: Callable[..., torch.Tensor], *args: torch.Tensor | None) -> torch.Tensor:
    """Activation checkpointing (non-reentrant): only the inputs stay alive until backward,
    so those are what the counter records. A None argument (an absent mask or rope table)
    passes through."""
    for a in args:
        record_saved(a)
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True)
