"""Applies a layout to a model with PyTorch's own APIs: TP/SP through DTensor
`parallelize_module` (experts sharded the same way), context and expert parallelism
(context.py, experts.py), recompute flags, and data parallelism (DDP, FSDP2 `replicate` and
`fully_shard`, ZeRO-1 through sharded_optimizer.py)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from autoconfig.trainer import lora
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.context import ContextParallel
from autoconfig.trainer.experts import LocalExperts, MoE, TokenDispatcher
from autoconfig.trainer.mesh import Meshes
from autoconfig.trainer.mlp import MLP
from autoconfig.trainer.model import Transformer
from autoconfig.trainer.sharded_optimizer import ShardedOptimizer


def apply_tp(
    model: Transformer, tp_mesh: DeviceMesh, sp: bool, whole_experts: bool = False
) -> None:
    """Megatron's layout: q/k/v and MLP up/gate column-parallel, out/down row-parallel,
    vocab-parallel embedding and head; with tp above the K/V heads, each K/V head on the
    tp/kv_heads ranks whose query heads use it. With SP, norms and residuals hold a sequence shard
    (Shard(1)) and the block inputs are all-gathered before the column-parallel linears.
    Experts (and shared experts) are sharded the same way (Megatron-LM's expert tensor
    parallelism equal to tp) and reduced over tp once per layer (experts.py); with
    `whole_experts` (etp 1) the routed experts stay whole on every tp rank, each routing its
    share of the tokens, and only the shared experts are sharded."""
    seq = Shard(1) if sp else Replicate()
    group = tp_mesh.get_group() if sp else None
    tp, rank = tp_mesh.size(), tp_mesh.get_local_rank()
    for block in model.layers.values():
        plan: dict[str, object] = {
            "attn.wq": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq),
        }
        head_dim = block.attn.head_dim
        kv = block.attn.wk.weight.shape[0] // head_dim
        if kv % tp == 0:
            plan["attn.wk"] = plan["attn.wv"] = ColwiseParallel()
        else:  # tp a multiple of kv: tp/kv ranks share each K/V head (model.Attention._kv)
            head = rank // (tp // kv)
            block.attn.kv_group = tp_mesh.get_group()
            block.attn.kv_rows = slice(head * head_dim, (head + 1) * head_dim)
        if sp:
            # (x, rope, mask): Block passes the packed documents' mask, None without
            plan["attn"] = PrepareModuleInput(
                input_layouts=(seq, None, None), desired_input_layouts=(Replicate(), None, None)
            )
        if isinstance(block.mlp, MoE):
            _shard_experts(block.mlp, tp_mesh, seq, whole_experts)
        else:
            plan["mlp.w1"] = ColwiseParallel()
            plan["mlp.w2"] = RowwiseParallel(output_layouts=seq)
            if block.mlp.w3 is not None:
                plan["mlp.w3"] = ColwiseParallel()
            if sp:
                plan["mlp"] = PrepareModuleInput(
                    input_layouts=(seq,), desired_input_layouts=(Replicate(),)
                )
        parallelize_module(block, tp_mesh, plan)
        # LoRA adapters: the factor on the base weight's sharded side split as it is
        lora.shard(block, tp, rank, tp_mesh.get_group(), sp)
        block.attn_norm.grad_group = group
        block.mlp_norm.grad_group = group
    top: dict[str, object] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    if model.tok_embeddings is not None:
        # DTensor's embedding backward yields a replicated gradient; keep it vocab-sharded
        # like the weight (a vocab-parallel embedding's gradient is sharded in Megatron too).
        weight = model.tok_embeddings.weight
        weight.register_hook(lambda g, p=weight.placements: g.redistribute(placements=p))
    if model.norm is not None:
        model.norm.grad_group = group
    if sp:
        model.seq_shard = (tp_mesh.get_local_rank(), tp_mesh.size())
        model.pos_grad_group = group


def _shard_experts(moe: MoE, tp_mesh: DeviceMesh, seq: Shard | Replicate, whole: bool) -> None:
    """Each expert MLP's up/gate rows and down columns split over tp (DTensor parameters the
    MoE computes with through their local shards). `whole`: the routed experts stay whole
    on every tp rank, which routes its 1/tp of the layer's tokens through them; their
    gradients are summed over the folded edp group, which spans tp (apply_dp)."""
    mlps: list[MLP] = [] if whole else [*moe.experts.experts.values()]
    if whole:
        moe.token_share = (tp_mesh.get_local_rank(), tp_mesh.size())
    if moe.shared is not None:
        mlps.append(moe.shared)
    for mlp in mlps:
        for name, dim in (("w1", 0), ("w3", 0), ("w2", 1)):
            linear = getattr(mlp, name)
            if linear is not None:
                # src_data_rank=None: every rank built the same full weight; no scatter.
                shard = distribute_tensor(
                    linear.weight.detach(), tp_mesh, [Shard(dim)], src_data_rank=None
                )
                linear.weight = nn.Parameter(shard)
    moe.tp_mesh, moe.seq_layout = tp_mesh, seq


def apply_cp(model: Transformer, cp_mesh: DeviceMesh, seq: int, dtype: torch.dtype) -> None:
    """This rank's share of the sequence (context.py) for the model and every attention;
    its rope tables become the rows of its positions."""
    device = next(model.parameters()).device
    context = ContextParallel(cp_mesh, seq, dtype, device)
    model.context = context
    for block in model.layers.values():
        block.attn.context = context
    if model.rope_cos is not None:
        # packed documents index these (buffers, which nn.Module.__getattr__ types Tensor | Module)
        model.rope_full = (cast(torch.Tensor, model.rope_cos), cast(torch.Tensor, model.rope_sin))
        model.rope_cos = model.rope_cos[context.positions]
        model.rope_sin = model.rope_sin[context.positions]


def apply_ep(model: Transformer, ep_mesh: DeviceMesh) -> None:
    """Rank i of the ep group keeps experts [i*E/ep, (i+1)*E/ep) and exchanges tokens with
    the group (experts.py)."""
    rank, size = ep_mesh.get_local_rank(), ep_mesh.size()
    for block in model.layers.values():
        if isinstance(block.mlp, MoE):
            local = block.mlp.num_experts // size
            block.mlp.experts.keep(rank * local, local)
            block.mlp.dispatcher = TokenDispatcher(block.mlp.num_experts, ep_mesh)


def apply_recompute(model: Transformer, cfg: TrainConfig) -> None:
    """full: the first k layers of the stage (all by default) keep only their input;
    selective: the attention core is recomputed (Megatron-LM's selective recompute)."""
    blocks = list(model.layers.values())
    if cfg.recompute == "full":
        k = min(cfg.recompute_layers or len(blocks), len(blocks))  # 0: every layer
        for block in blocks[:k]:
            block.recompute = True
            block.attn.in_recomputed_block = True
    elif cfg.recompute == "selective":
        for block in blocks:
            block.attn.selective = True


def _expert_modules(model: nn.Module) -> list[LocalExperts]:
    return [m for m in model.modules() if isinstance(m, LocalExperts)]


def reshards_after_forward(cfg: TrainConfig) -> bool:
    """Whether FSDP frees the gathered weights after each forward: ZeRO-3 without a pipeline.
    Under a pipeline they stay gathered from forward to backward, as torchtitan's default has
    it (distributed/fsdp.py get_fsdp_reshard_after_forward_policy) and the cost model charges
    it: resharding would gather every micro-batch twice, unhidden."""
    return cfg.zero == 3 and cfg.pp == 1


def apply_dp(model: Transformer, cfg: TrainConfig, meshes: Meshes, bf16: bool) -> nn.Module:
    """Gradients are reduced over the dp*cp ranks holding the same weights (CP ranks hold the
    same weights and see other tokens), expert gradients over the edp ranks holding the same
    experts. ZeRO-3: FSDP2 resharding after forward (not under a pipeline); ZeRO-2: FSDP2
    keeping the gathered weights through backward (gradients and optimizer states sharded);
    ZeRO-1: no wrapper, the sharded optimizer reduce-scatters (make_optimizer); ZeRO-0: DDP,
    or FSDP2's `replicate` (DDP semantics) where DDP cannot go: DTensor (tp > 1) parameters,
    or experts reduced over another group than the rest (`cfg.experts_apart`)."""
    separate_experts = cfg.experts_apart
    if cfg.zero == 1:
        return model
    if meshes.dp_cp.size() == 1:
        # Whole experts folded over tp: ranks of one replica can still hold the same experts.
        if separate_experts and meshes.edp.size() > 1:
            for experts in _expert_modules(model):
                _replicate(experts, mesh=meshes.edp)
                experts.set_gradient_divide_factor(1.0)  # the sum: one replica's tokens
        return model
    # Every rank's loss is the mean over its own tokens, and an expert's gradient sums what
    # the tokens of all ep ranks sent it: the mean over dp*cp is the sum over edp divided by
    # dp*cp, not by edp (Megatron-LM scales expert gradients by 1/dp as well).
    expert_divide = float(meshes.dp_cp.size())
    if cfg.zero >= 2:
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=torch.float32 if bf16 else None,
        )
        reshard = reshards_after_forward(cfg)
        for block in model.layers.values():
            if separate_experts and isinstance(block.mlp, MoE):
                fully_shard(
                    block.mlp.experts,
                    mesh=meshes.edp,
                    reshard_after_forward=reshard,
                    mp_policy=policy,
                )
                block.mlp.experts.set_gradient_divide_factor(expert_divide)
            fully_shard(block, mesh=meshes.dp_cp, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, mesh=meshes.dp_cp, reshard_after_forward=reshard, mp_policy=policy)
        return model
    if cfg.tp > 1 or separate_experts:
        if separate_experts:
            for experts in _expert_modules(model):
                _replicate(experts, mesh=meshes.edp)
                experts.set_gradient_divide_factor(expert_divide)
        _replicate(model, mesh=meshes.dp_cp)
        return model
    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    # No buffer broadcast: the buffers (rope tables) are constants, and with context
    # parallelism each rank holds the rows of its own positions.
    return DistributedDataParallel(
        model,
        process_group=meshes.dp_cp.get_group(),
        device_ids=device_ids,
        broadcast_buffers=False,
    )


@contextmanager
def reduce_on_last(model: nn.Module, last: bool) -> Iterator[None]:
    """ZeRO-0's gradient all-reduce in the last micro-batch's backward only: earlier ones
    accumulate locally (DDP's `no_sync`, `replicate`'s gradient sync turned off), as Megatron's
    DDP does under gradient accumulation and as the cost model charges it, once a step.
    FSDP (ZeRO-2/3) still reduce-scatters every micro-batch, which keeps the gradients sharded."""
    for module in model.modules():
        if module in _REPLICATED:
            module.set_requires_gradient_sync(last, recurse=False)
    if isinstance(model, DistributedDataParallel) and not last:
        with model.no_sync():
            yield
    else:
        yield


# Modules under `replicate`, whose gradient sync `reduce_on_last` turns off and on.
_REPLICATED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _replicate(module: nn.Module, mesh: DeviceMesh) -> None:
    """FSDP2's `replicate` (DDP semantics over `mesh`); imported here because torch marks its
    module private and may move it."""
    from torch.distributed._composable.replicate_with_fsdp import replicate

    replicate(module, mesh=mesh)
    _REPLICATED.add(module)


def make_optimizer(chunks: list[nn.Module], cfg: TrainConfig, meshes: Meshes | None):
    """AdamW (or plain SGD); with ZeRO-1 over dp*cp its states are sharded by
    ShardedOptimizer (expert parameters over their own edp group)."""

    def inner(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        if cfg.optimizer == "sgd":
            return torch.optim.SGD(params, lr=cfg.lr)
        # On CUDA the fused kernel updates every plain tensor in a few launches (a per-tensor
        # loop costs ~10% of a 1B model's step); DTensor shards and CPU ranks keep the loop,
        # whose per-element arithmetic the equivalence tests compare against one process.
        fused = all(p.is_cuda and type(p.data) is torch.Tensor for p in params)
        return torch.optim.AdamW(
            params,
            lr=cfg.lr,
            betas=(0.9, 0.95),
            weight_decay=0.1,
            foreach=False,
            fused=fused or None,
        )

    # LoRA: the frozen base weights take no optimizer state (lora.freeze_base)
    params = [p for m in chunks for p in m.parameters() if p.requires_grad]
    folded = meshes is not None and cfg.experts_apart and meshes.edp.size() > 1
    if cfg.zero != 1 or meshes is None or (meshes.dp_cp.size() == 1 and not folded):
        return inner(params)
    experts = (
        {id(p) for m in chunks for e in _expert_modules(m) for p in e.parameters()}
        if cfg.experts_apart
        else set()
    )
    dense = [p for p in params if id(p) not in experts]
    routed = [p for p in params if id(p) in experts]
    dp_cp = meshes.dp_cp.size()
    buckets = [(dense, meshes.dp_cp.get_group(), dp_cp)]
    if routed:
        # Summed over the ranks holding the same experts, divided by dp*cp (see apply_dp).
        buckets.append((routed, meshes.edp.get_group(), dp_cp))
    return ShardedOptimizer(buckets, inner)
