"""What this machine has: whether a CUDA GPU is visible (where measured trials run)."""

from __future__ import annotations

from functools import cache

from autoconfig.spec.vocab import Device


@cache
def has_cuda() -> bool:
    # torch takes seconds to import: only commands that run or place trials ask.
    import torch

    return torch.cuda.is_available()


def resolve(device: Device | str) -> Device:
    """`auto` becomes cuda where a GPU is visible, else cpu."""
    device = Device.parse(device, "device")
    if device is not Device.AUTO:
        return device
    return Device.CUDA if has_cuda() else Device.CPU
