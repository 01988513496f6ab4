"""The host side of a GPU: the link to host memory (PCIe or NVLink-C2C) and the host DRAM
bandwidth each GPU's share of the CPU sockets reaches, by GPU chip: what offloading (cost.offload)
and RL role switching (rl.sync) move data over. Every figure is GB/s (1e9 bytes/s) per GPU, one
direction, with its source; the shared place for them, so every caller reads the same numbers.

Host link (what pinned-memory copies reach, per GPU, one direction):
- PCIe Gen4 x16 (A100 HGX boards): 32 GB/s raw, ~25 effective; PCIe Gen5 x16 (H100, H200, B200,
  B300 HGX boards; MI300X/MI355X OAM platforms): 64 GB/s raw, ~50 effective (PCI-SIG
  specifications; NVIDIA HGX A100/H100/B200 datasheets). Copies reach about 80% of the link
  (an assumption, range 70-85%: the protocol's packet overhead and DMA engines).
- Grace NVLink-C2C (GH200, GB200, GB300): 900 GB/s both ways, 450 one way, ~360 effective at the
  same 80% (NVIDIA Grace Hopper and GB200 NVL72 datasheets). The GB200 datasheet gives the 900
  per superchip, one Grace and two GPUs: taken here per GPU, an upper bound (half of it when
  both GPUs copy at once).

Host DRAM (the memory-bound CPU Adam step of an offloaded optimizer, cost.offload):
- DGX A100: 2 x AMD EPYC 7742, 8 channels of DDR4-3200 each: 2 x 204.8 = 409.6 GB/s for 8
  GPUs, 51.2 per GPU (NVIDIA DGX A100 datasheet; AMD EPYC 7002 specifications).
- DGX H100 / H200: 2 x Intel Xeon Platinum 8480C, 8 channels of DDR5-4800 each: 2 x 307.2 =
  614.4 GB/s for 8 GPUs, 76.8 per GPU (NVIDIA DGX H100 datasheet; Intel Xeon 4th gen specs).
- DGX B200 / B300: 2 x Intel Xeon Platinum 8570, 8 channels of DDR5-5600 each: 2 x 358.4 =
  716.8 GB/s for 8 GPUs, 89.6 per GPU (NVIDIA DGX B200 datasheet; Intel Xeon 5th gen specs).
- AMD Instinct platforms (MI300X, MI355X): 2 x AMD EPYC 9004/9005, 12 channels of DDR5-4800:
  2 x 460.8 = 921.6 GB/s for 8 GPUs, 115.2 per GPU (AMD EPYC 9004 specifications; the OAM
  platforms' usual hosts, an assumption).
- Grace (GH200: one Grace per GPU; GB200, GB300: one per two GPUs): LPDDR5X up to 512 GB/s a
  Grace (NVIDIA Grace CPU datasheet): 256 per GPU on GB200/GB300.
A CPU streaming kernel reaches about 75% of the channels' peak (an assumption from STREAM
triad results on dual-socket servers, range 65-85%): HOST_DRAM_EFFICIENCY.
"""

from __future__ import annotations

# GB/s per GPU, one direction, reached by pinned host copies.
HOST_LINK_GB_S = {
    "a100": 25.0,
    "h100": 50.0,
    "b200": 50.0,
    "b300": 50.0,
    "cdna3": 50.0,
    "cdna4": 50.0,
}
GRACE_HOST_LINK_GB_S = 360.0
DEFAULT_HOST_LINK_GB_S = 25.0  # an unlisted chip: PCIe Gen4's
GRACE_GPUS = ("gb200", "gb300", "gh200")  # GPU names whose host is a Grace CPU over NVLink-C2C

# Host DRAM peak GB/s per GPU (the node's channels over its GPUs), by chip.
HOST_DRAM_GB_S = {
    "a100": 51.2,
    "h100": 76.8,
    "b200": 89.6,
    "b300": 89.6,
    "cdna3": 115.2,
    "cdna4": 115.2,
}
GRACE_HOST_DRAM_GB_S = 256.0  # one Grace's 512 GB/s over its two GPUs (GB200, GB300)
GH200_HOST_DRAM_GB_S = 512.0  # one Grace per GPU
DEFAULT_HOST_DRAM_GB_S = 51.2  # an unlisted chip: a DDR4-3200 dual-socket node over 8 GPUs
HOST_DRAM_EFFICIENCY = 0.75  # STREAM-like share of the peak a CPU streaming kernel reaches


def is_grace(gpu_name: str) -> bool:
    """Whether the GPU's host is a Grace CPU joined over NVLink-C2C."""
    return gpu_name.startswith(GRACE_GPUS)


def host_link_gb_s(gpu_name: str, chip: str) -> float:
    """Host-to-GPU bandwidth of one GPU (GB/s, one direction, effective)."""
    if is_grace(gpu_name):
        return GRACE_HOST_LINK_GB_S
    return HOST_LINK_GB_S.get(chip, DEFAULT_HOST_LINK_GB_S)


def host_dram_gb_s(gpu_name: str, chip: str) -> float:
    """Host DRAM bandwidth one GPU's share of the CPUs reaches (GB/s, effective)."""
    if gpu_name.startswith("gh200"):
        peak = GH200_HOST_DRAM_GB_S
    elif is_grace(gpu_name):
        peak = GRACE_HOST_DRAM_GB_S
    else:
        peak = HOST_DRAM_GB_S.get(chip, DEFAULT_HOST_DRAM_GB_S)
    return peak * HOST_DRAM_EFFICIENCY
