"""What the training task changes in the cost model: which weights are frozen, which linear
layers carry LoRA adapters, and how many bytes a QLoRA base weight takes.

Sources:
- LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", Sec. 4): the
  base weights are frozen, and a targeted linear layer W (k x n) gains B A with A (k x r) and
  B (r x n), trained; frozen weights have no gradients and no optimizer state.
- QLoRA (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs", Sec. 3): the
  frozen base weights are stored in 4-bit NormalFloat with one absmax per 64-element block,
  itself quantized to 8 bits with a second-level fp32 scale per 256 blocks: 4 + 8/64 +
  32/(64*256) = 4.127 bits per parameter. Every GEMM dequantizes them to bf16 first, in
  forward and again in backward (bitsandbytes' and torchao's NF4 linear keep only the NF4
  copy for backward).
"""

from __future__ import annotations

import numpy as np

from autoconfig.cost.inputs import Col, CostInputs
from autoconfig.spec.vocab import LoraTargets, Task

NF4_BITS_PER_PARAM = 4.0 + 8.0 / 64.0 + 32.0 / (64.0 * 256.0)  # 4.127 (QLoRA, Sec. 3)
NF4_BYTES_PER_PARAM = NF4_BITS_PER_PARAM / 8.0
DEQUANTIZED_BYTES = 2.0  # the bf16 copy each dequantization writes

LORA, QLORA = Task.LORA.code, Task.QLORA.code
QKV, ATTENTION, ALL = (t.code for t in LoraTargets)

# The base GEMMs (layer.py op names) each --lora-targets value adapts. Query, key and value run
# as separate GEMMs in the op list (q_proj; kv_proj), as the targets of Hugging Face PEFT,
# torchtune and torchtitan name them; Megatron's fused linear_qkv carries one adapter, whose A
# matrix is counted once more here (h x r, a few MB at most).
TARGET_OPS: dict[str, int] = {
    "latent_down": QKV,
    "q_proj": QKV,
    "kv_proj": QKV,
    "out_proj": ATTENTION,
    "mlp_up": ALL,
    "mlp_down": ALL,
    "shared_up": ALL,
    "shared_down": ALL,
    "mamba_in": ALL,
    "mamba_out": ALL,
}


def frozen(x: CostInputs) -> Col:
    """1 where the base weights are frozen (lora and qlora), 0 where every weight trains."""
    return np.where((x.task == LORA) | (x.task == QLORA), 1.0, 0.0)


def quantized(x: CostInputs) -> Col:
    """1 where the frozen base weights of the layers' linear layers are NF4 (qlora)."""
    return np.where(x.task == QLORA, 1.0, 0.0)


def any_frozen(x: CostInputs) -> bool:
    """Whether any candidate freezes its base: the pretraining paths skip the task's terms
    entirely, so their figures (and the search's speed) do not move."""
    return bool(np.any(np.asarray(x.task) >= LORA))


def adapts(x: CostInputs, op_name: str) -> Col:
    """1 where the op named `op_name` carries an adapter: its targets level is reached by the
    run's --lora-targets (qkv < attention < all)."""
    level = TARGET_OPS.get(op_name)
    if level is None:
        return np.float64(0.0)
    return np.where((x.lora_rank > 0) & (x.lora_targets >= level), 1.0, 0.0)


def base_weight_bytes(x: CostInputs) -> Col:
    """Bytes per parameter of a layer's linear weights as held: NF4 under qlora, else the
    framework's working precision."""
    return np.where(x.task == QLORA, NF4_BYTES_PER_PARAM, x.param_bytes)
