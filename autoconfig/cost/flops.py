"""Model FLOPs per token, the numerator of MFU and of model TFLOP/s.

Counted from the same op list as time and memory (evaluated unsharded), forward x3 (forward +
2x backward), no recomputation, attention over the full (non-causal) sequence or its sliding
window: for a GPT layer this is Narayanan et al. 2021's 72*B*s*l*h^2*(1 + s/(6h) + V/(12*l*h))
per iteration, the convention of Megatron-LM, torchtitan and the MFU figures in the reference
table. Multi-token-prediction blocks count as model compute.

The count is the model's whatever the task: a LoRA or QLoRA step skips the frozen weights'
weight-gradient GEMMs and adds its adapters', yet its model FLOPs stay 3x the base model's
forward without the adapters, so MFU compares runs of one model by tokens/s alone (NeMo's
performance tables count a LoRA step at 2/3 of that instead).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autoconfig.cost.inputs import Col, CostInputs
from autoconfig.cost.layer import Op, head_ops, layer_ops, mtp_ops, total


def model_flops_per_token(x: CostInputs) -> Col:
    """Training FLOPs per token of the whole model (all ranks of one replica together)."""
    one = np.ones_like(np.asarray(x.tp, dtype=float))
    whole = replace(x, tp=one, etp=one)  # per-token FLOPs of one unsharded model
    per_layer = total(_model_ops(layer_ops(whole)), "flops")
    head = total(head_ops(whole), "flops")
    mtp = whole.mtp * total(_model_ops(mtp_ops(whole)), "flops")
    return 3.0 * (x.layers * per_layer + head + mtp)


def _model_ops(ops: list[Op]) -> list[Op]:
    """The model's own ops: LoRA adapters are not model FLOPs."""
    return [op for op in ops if not op.adapter]
