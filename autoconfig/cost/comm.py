"""Collective and point-to-point times, with bandwidth chosen by where a group's ranks sit.

Ring collectives over n ranks move 2(n-1)/n of the buffer per rank for all-reduce and (n-1)/n
for all-gather / reduce-scatter / all-to-all, in 2(n-1) resp. (n-1) latency steps (Thakur et
al. 2005, "Optimization of Collective Communication Operations in MPICH"; NCCL's "bus
bandwidth" convention, nccl-tests PERFORMANCE.md).

Rank order is Megatron-LM's: tp fastest, then cp, then dp (ep inside dp), then pp. A group of n
ranks spaced `stride` apart stays inside a node when n*stride <= gpus_per_node; otherwise it
crosses the network, where k = gpus_per_node/stride of its ranks share a node and NCCL drives
k NICs in parallel (rail-optimised fabric), so its bus bandwidth is k times one GPU's NIC,
never more than NVLink.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoconfig.cost import kernel_time
from autoconfig.cost.inputs import Col, CostInputs


@dataclass(frozen=True)
class Link:
    """Effective bus bandwidth (bytes/s) and per-step latency (s) of one group, and where the
    group sits inside one NVLink domain of a chip with measured NCCL times, those."""

    bandwidth: Col
    latency: Col
    # where the group stays inside the NVLink domain, whose collectives are looked up in the
    # measured NCCL tables of `x`'s rows (links built by hand carry neither)
    intra: Col | None = None
    x: CostInputs | None = None


def group_link(x: CostInputs, size: Col, stride: Col) -> Link:
    """The link a group of `size` ranks spaced `stride` apart communicates over."""
    intra = size * stride <= x.gpus_per_node
    nvlink = x.intra_bytes_s * x.eff_intra
    per_node = np.clip(np.floor(x.gpus_per_node / stride), 1.0, size)
    network = np.minimum(nvlink, per_node * x.inter_bytes_s * x.eff_inter)
    return Link(
        np.where(intra, nvlink, network),
        np.where(intra, x.lat_intra_s, x.lat_inter_s),
        intra,
        x,
    )


def _measured(op: str, nbytes: Col, size: Col, link: Link, modelled: Col) -> Col:
    """`modelled`, or inside an NVLink domain the chip's measured NCCL time for `op` (NCCL's
    own choice of ring or tree, protocol and channels at that size, nccl-tests' whole-buffer
    convention)."""
    x = link.x
    if x is None or link.intra is None or not x.kernels or not np.any(link.intra):
        return modelled
    measured = kernel_time.collective_time(x.kernels, x.kernel_chip, op, size, nbytes)
    if measured is None:
        return modelled
    use = np.asarray(link.intra) & np.isfinite(measured) & (np.asarray(size) > 1)
    return np.where(use, measured, modelled)


def all_reduce(nbytes: Col, size: Col, link: Link) -> Col:
    """Ring bandwidth; latency of the better of a ring (2(n-1) steps) and NCCL's double
    binary tree (2 log2 n steps), as NCCL picks per size. Measured inside an NVLink domain."""
    steps = 2.0 * (size - 1.0)
    latency = np.minimum(steps, 2.0 * np.log2(np.maximum(size, 1.0))) * link.latency
    modelled = np.where(size > 1, steps / size * nbytes / link.bandwidth + latency, 0.0)
    return _measured("all_reduce", nbytes, size, link, modelled)


def _ring_pass(nbytes: Col, size: Col, link: Link) -> Col:
    steps = size - 1.0
    return np.where(size > 1, steps / size * nbytes / link.bandwidth + steps * link.latency, 0.0)


def all_gather(nbytes: Col, size: Col, link: Link) -> Col:
    """All-gather producing a full buffer of `nbytes` (measured inside an NVLink domain)."""
    return _measured("all_gather", nbytes, size, link, _ring_pass(nbytes, size, link))


def reduce_scatter(nbytes: Col, size: Col, link: Link) -> Col:
    """Reduce-scatter consuming a full buffer of `nbytes` (measured inside an NVLink domain)."""
    return _measured("reduce_scatter", nbytes, size, link, _ring_pass(nbytes, size, link))


def expert_dispatch(x: CostInputs, copy_bytes: Col, copies: Col, size: Col, stride: Col) -> Col:
    """One MoE dispatch (or combine): each token sends `copies` copies of `copy_bytes` to the
    experts of `size` ranks spaced `stride` apart. Copies for ranks in the same NVLink domain
    move over NVLink; copies for other domains leave through this GPU's own NIC (all-to-all
    traffic cannot be spread over the node's other NICs the way ring collectives are). With
    deduplication (DeepEP, HybridEP) a token crosses the network once per remote domain its
    experts sit in, then fans out over NVLink (DeepSeek-AI 2025, DeepEP README)."""
    near = np.clip(np.floor(x.gpus_per_node / stride), 1.0, size)
    domains = np.maximum(size / near, 1.0)
    nvlink = x.intra_bytes_s * x.eff_intra
    nic = np.minimum(nvlink, x.inter_bytes_s * x.eff_inter)
    per_copy = (domains - 1.0) / domains
    remote_plain = copies * per_copy
    # Uniform routing: a remote domain receives the token when one of its copies lands there.
    remote_dedup = (domains - 1.0) * (1.0 - np.power(1.0 - 1.0 / domains, copies))
    remote = np.where(x.ep_dedup > 0, np.minimum(remote_dedup, remote_plain), remote_plain)
    local = copies * (near - 1.0) / size + np.where(x.ep_dedup > 0, copies * per_copy, 0.0)
    latency = np.where(domains > 1, x.lat_inter_s, x.lat_intra_s)
    time = (local / nvlink + remote / nic) * copy_bytes + latency
    return np.where(size > 1, time, 0.0)


def p2p(nbytes: Col, link: Link) -> Col:
    return nbytes / link.bandwidth + link.latency


def tp_link(x: CostInputs) -> Link:
    return group_link(x, x.tp, 1.0)


def cp_link(x: CostInputs) -> Link:
    return group_link(x, x.cp, x.tp)


def dp_link(x: CostInputs) -> Link:
    """Gradient reduction runs over dp*cp ranks (CP ranks hold the same weights)."""
    return group_link(x, x.dp * x.cp, x.tp)


def pp_link(x: CostInputs) -> Link:
    """Adjacent stages sit tp*cp*dp ranks apart; each GPU sends over its own link."""
    return group_link(x, 2.0, x.tp * x.cp * x.dp)


def group_links(x: CostInputs) -> dict[str, tuple[Col, Link, Col]]:
    """Per parallel group (tp, cp, ep, dp, edp, pp): its ranks, the link it communicates over
    and whether that link crosses the network (1.0) or stays in the NVLink domain (0.0). dp
    reduces the dense gradients over dp*cp ranks, edp the experts' over the ranks holding the
    same experts (tp*dp*cp / (ep*etp), spaced ep*etp apart). Expert dispatch leaves through
    each GPU's own NIC (see expert_dispatch)."""
    out: dict[str, tuple[Col, Link, Col]] = {}
    expert_dp = np.where(x.experts > 0, x.tp * x.dp * x.cp / (x.ep * x.etp), 1.0)
    # (group, ranks, ranks one collective spans, spacing): a stage talks to its neighbour only
    for name, size, reach, stride in (
        ("tp", x.tp, x.tp, 1.0),
        ("cp", x.cp, x.cp, x.tp),
        ("dp", x.dp * x.cp, x.dp * x.cp, x.tp),
        ("edp", expert_dp, expert_dp, x.ep * x.etp),
        ("pp", x.pp, 2.0, x.tp * x.cp * x.dp),
    ):
        out[name] = (size, group_link(x, reach, stride), (reach * stride > x.gpus_per_node) * 1.0)
    network = x.ep * x.etp > x.gpus_per_node
    nvlink = x.intra_bytes_s * x.eff_intra
    nic = np.minimum(nvlink, x.inter_bytes_s * x.eff_inter)
    own = Link(np.where(network, nic, nvlink), np.where(network, x.lat_inter_s, x.lat_intra_s))
    out["ep"] = (x.ep, own, network * 1.0)
    return out
