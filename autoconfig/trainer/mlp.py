"""The feed-forward block (GELU / SwiGLU / squared-ReLU, no bias) of dense layers and experts."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from autoconfig.trainer import lora, ops


def activation(kind: str, up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    if kind == "swiglu":
        return F.silu(gate) * up
    if kind == "squared_relu":
        return F.relu(up).square()
    return F.gelu(up, approximate="tanh")


class MLP(nn.Module):
    def __init__(self, hidden: int, width: int, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.w1 = nn.Linear(hidden, width, bias=False)  # up
        self.w3 = nn.Linear(hidden, width, bias=False) if kind == "swiglu" else None  # gate
        self.w2 = nn.Linear(width, hidden, bias=False)  # down
        self.adapters: nn.ModuleDict | None = None  # LoRA "up" and "down" (lora.attach)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w3(x) if self.w3 is not None else None
        up = self.w1(x)
        adapters = lora.by_name(self.adapters)
        if "up" in adapters:
            deltas = adapters["up"](lora.column_input(x, adapters["up"].group))
            up = up + deltas[0]
            gate = gate + deltas[1] if gate is not None else None
        hidden = activation(self.kind, up, gate)
        out = self.w2(hidden)
        if "down" in adapters:
            out = out + adapters["down"](hidden)[0]
        return out

    def local_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forward with this rank's weight shards on a plain tensor: under tensor
        parallelism (experts) the output is this rank's partial sum, which the caller
        reduces once for all experts instead of once per expert."""
        w1, w2 = ops.local_tensor(self.w1.weight), ops.local_tensor(self.w2.weight)
        gate = F.linear(x, ops.local_tensor(self.w3.weight)) if self.w3 is not None else None
        return F.linear(activation(self.kind, F.linear(x, w1), gate), w2)
