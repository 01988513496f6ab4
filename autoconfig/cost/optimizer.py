"""Bytes per parameter the Adam optimizer keeps, by the run's optimizer state
(vocab.OptimizerState): what memory charges and what the optimizer step reads and writes.

Sources:
- Megatron-Core 0.16.1 optimizer/optimizer_config.py: `use_precision_aware_optimizer` with
  `exp_avg_dtype`, `exp_avg_sq_dtype` and `main_params_dtype`, only with the distributed
  optimizer and Adam, run by Transformer Engine's FusedAdam (optimizer/__init__.py).
- Transformer Engine 2.20 pytorch/optimizers/fused_adam.py: moments in fp32, fp16, bf16 or
  fp8 (torch.uint8, one fp32 scale per tensor: a few bytes per tensor, left out); main
  parameters in fp32 or fp16 (no bf16); `store_param_remainders` keeps fp32 main parameters as
  the 16 bits their bf16 working copy lacks, which Megatron-Core turns on by default
  (OptimizerConfig.store_param_remainders, distrib_optimizer.py: an int16 `master_param`).
  Where the working copy is not bf16 (fp8 parameters), the fp32 main parameters stay whole.
- torchtitan 0.3.0 `fused_opt_states_bf16`: bf16 moments beside fp32 parameters (kept whole).
- The fp8 choice keeps the second moment in bf16: fp8's range is too narrow for it (Peng et
  al. 2023, "FP8-LM", Sec. 3.2, keeps it in 16 bits); the first moment is fp8.
"""

from __future__ import annotations

import numpy as np

from autoconfig.cost.inputs import Col, CostInputs
from autoconfig.spec.vocab import OptimizerState

FP32_STATE, BF16_STATE, FP8_STATE = (s.code for s in OptimizerState)
# (first moment, second moment) bytes per parameter of each lighter state
MOMENT_BYTES: dict[int, tuple[float, float]] = {BF16_STATE: (2.0, 2.0), FP8_STATE: (1.0, 2.0)}
FP32_BYTES = 4.0
REMAINDER_BYTES = 2.0  # the low 16 bits of an fp32 main parameter beside its bf16 copy


def main_param_bytes(x: CostInputs) -> Col:
    """Bytes per parameter of the fp32 main parameters beside lighter moments: 16-bit
    remainders where the framework keeps them and the working copy is 2 bytes, else 4."""
    remainders = (x.main_param_remainders > 0) & (x.param_bytes == 2.0)
    return np.where(remainders, REMAINDER_BYTES, FP32_BYTES)


def state_bytes(x: CostInputs) -> Col:
    """Optimizer bytes per trained parameter: the framework's fp32 figure (`optim_bytes`:
    master copy and both moments) for fp32 state, else the main parameters and the moments at
    their own precision."""
    state = np.asarray(x.optimizer_state)
    if not np.any(state != FP32_STATE):
        return x.optim_bytes  # the default path: pretraining figures stay what they were
    main = main_param_bytes(x)
    lighter = [main + sum(MOMENT_BYTES[code]) for code in (BF16_STATE, FP8_STATE)]
    return np.select([state == BF16_STATE, state == FP8_STATE], lighter, x.optim_bytes)
