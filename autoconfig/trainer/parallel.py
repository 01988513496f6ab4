"""Applies a layout to a model with PyTorch's own APIs: the (pp, dp, tp) device mesh, TP/SP
through DTensor `parallelize_module`, recompute flags, and data parallelism (DDP, DDP +
ZeroRedundancyOptimizer, FSDP2 `fully_shard`)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel

from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.model import Transformer


def build_mesh(cfg: TrainConfig, device_type: str) -> DeviceMesh:
    """Ranks laid out pp-major, tp-minor: TP groups are neighbours (same node), as Megatron."""
    return init_device_mesh(
        device_type, (cfg.pp, cfg.resolved_dp, cfg.tp), mesh_dim_names=("pp", "dp", "tp")
    )


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sp: bool) -> None:
    """Megatron's layout: q/k/v and MLP up/gate column-parallel, out/down row-parallel,
    vocab-parallel embedding and head. With SP, norms and residuals hold a sequence shard
    (Shard(1)) and the block inputs are all-gathered before the column-parallel linears."""
    seq = Shard(1) if sp else Replicate()
    group = tp_mesh.get_group() if sp else None
    for block in model.layers.values():
        plan = {
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq),
            "mlp.w1": ColwiseParallel(),
            "mlp.w2": RowwiseParallel(output_layouts=seq),
        }
        if block.mlp.w3 is not None:
            plan["mlp.w3"] = ColwiseParallel()
        if sp:
            plan["attn"] = PrepareModuleInput(
                input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)
            )
            plan["mlp"] = PrepareModuleInput(
                input_layouts=(seq,), desired_input_layouts=(Replicate(),)
            )
        parallelize_module(block, tp_mesh, plan)
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


def apply_recompute(model: Transformer, cfg: TrainConfig) -> None:
    """full: the first k layers of the stage (all by default) keep only their input;
    selective: the attention core is recomputed (Megatron-LM's selective recompute)."""
    blocks = list(model.layers.values())
    if cfg.recompute == "full":
        k = min(cfg.recompute_layers or len(blocks), len(blocks))  # 0: every layer
        for block in blocks[:k]:
            block.recompute = True
    elif cfg.recompute == "selective":
        for block in blocks:
            block.attn.selective = True


def apply_dp(model: nn.Module, cfg: TrainConfig, mesh: DeviceMesh, bf16: bool) -> nn.Module:
    """ZeRO-3: FSDP2 resharding after forward; ZeRO-2: FSDP2 keeping the gathered weights
    through backward (gradients and optimizer states sharded); ZeRO-0/1: DDP (gradients
    all-reduced; ZeRO-1 adds ZeroRedundancyOptimizer in make_optimizer). DDP cannot wrap
    DTensor parameters, so with tp > 1 ZeRO-0 uses FSDP2's `replicate` (DDP semantics)."""
    dp_mesh = mesh["dp"]
    if cfg.resolved_dp == 1:
        return model
    if cfg.zero >= 2:
        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=torch.float32 if bf16 else None,
        )
        reshard = cfg.zero == 3
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
        return model
    if cfg.tp > 1:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        replicate(model, mesh=dp_mesh)
        return model
    device_ids = [torch.cuda.current_device()] if torch.cuda.is_available() else None
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids)


def make_optimizer(params: list[nn.Parameter], cfg: TrainConfig, mesh: DeviceMesh | None):
    """AdamW, or plain SGD (cfg.optimizer); with ZeRO-1 its states are sharded over DP by
    ZeroRedundancyOptimizer."""
    if cfg.optimizer == "sgd":
        optimizer_class, kwargs = torch.optim.SGD, {"lr": cfg.lr}
    else:
        optimizer_class = torch.optim.AdamW
        kwargs = {"lr": cfg.lr, "betas": (0.9, 0.95), "weight_decay": 0.1, "foreach": False}
    if cfg.zero == 1 and mesh is not None and cfg.resolved_dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(
            params,
            optimizer_class=optimizer_class,
            process_group=mesh["dp"].get_group(),
            **kwargs,
        )
    return optimizer_class(params, **kwargs)
