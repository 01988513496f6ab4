"""The device meshes of a layout: ranks as (pp, dp, cp, tp), the dp*cp ranks that hold the same
weights, and the expert view of those ranks as (edp, ep).

Rank order is Megatron-LM's: tp fastest, then cp, then dp, then pp (TP groups are neighbours,
on one node). Expert parallelism takes its ep ranks within dp*cp (Megatron-LM MoE docs), so a
dp*cp group splits into ep consecutive ranks exchanging tokens and dp*cp/ep ranks (edp) holding
the same experts; with whole experts under tp (etp 1) the same split runs over tp*dp*cp.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoconfig.trainer.config import TrainConfig


@dataclass(frozen=True)
class Meshes:
    world: DeviceMesh  # (pp, dp, cp, tp)
    dp_cp: DeviceMesh  # ranks with the same dense weights: gradients are reduced over it
    ep: DeviceMesh | None  # ranks exchanging tokens for experts (MoE models only)
    edp: DeviceMesh | None  # ranks with the same experts: expert gradients are reduced over it

    def __getitem__(self, name: str) -> DeviceMesh:
        return self.world[name]


def build_meshes(cfg: TrainConfig, device_type: str, moe: bool) -> Meshes:
    pp, dp, cp, tp = cfg.pp, cfg.resolved_dp, cfg.cp, cfg.tp
    world = init_device_mesh(device_type, (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
    # Views of the same ranks, each a mesh of its own (a flattened dimension sliced from the
    # root mesh is being deprecated; these are built with public APIs only).
    dp_cp = init_device_mesh(device_type, (pp, dp * cp, tp), mesh_dim_names=("pp", "dp_cp", "tp"))[
        "dp_cp"
    ]
    if not moe:
        return Meshes(world, dp_cp, None, None)
    ep = cfg.ep
    if cfg.whole_experts:
        # Whole experts under tp (etp 1): Megatron-Core's MoE parallel folding lays the expert
        # grid (edp, ep) over all tp*dp*cp ranks, ep consecutive (tp fastest): ep may take
        # tp ranks, and the ranks holding the same experts span tp as well.
        folded = init_device_mesh(
            device_type, (pp, tp * dp * cp // ep, ep), mesh_dim_names=("pp", "edp", "ep")
        )
        return Meshes(world, dp_cp, folded["ep"], folded["edp"])
    experts = init_device_mesh(
        device_type, (pp, dp * cp // ep, ep, tp), mesh_dim_names=("pp", "edp", "ep", "tp")
    )
    return Meshes(world, dp_cp, experts["ep"], experts["edp"])
