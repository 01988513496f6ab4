"""The RL frameworks a plan is written for, and what each one's defaults change in the plan's
timing: the share of a GPU's memory its rollout engine (vLLM) may take, which sizes the K/V
cache and so how many sequences decode at once.

Defaults (vLLM's gpu_memory_utilization as each framework sets it; the fraction of the GPU's
whole memory for the engine's weights, activations and K/V cache):
- none named: vLLM's own default, from its engine profile (autoconfig/profiles/engines);
- verl 0.9.1: 0.5 (trainer/config/ppo_trainer.yaml, actor_rollout_ref.rollout.
  gpu_memory_utilization);
- OpenRLHF 0.11.2: 0.95 (openrlhf/cli/train_ppo_ray.py, --vllm.gpu_memory_utilization);
- NeMo-RL: 0.6 (examples/configs/grpo_math_1B.yaml, policy.generation.vllm_cfg.
  gpu_memory_utilization, the config its published GRPO recipes start from; as recalled, no
  NeMo-RL release ships on PyPI to check it against).
"""

from __future__ import annotations

from autoconfig.spec.engines import engine
from autoconfig.spec.vocab import Choice


class RLFramework(Choice):
    """The RL frameworks a plan can be written for."""

    NEMO_RL = "nemo-rl"
    VERL = "verl"
    OPENRLHF = "openrlhf"


ENGINE_MEMORY_FRACTION = {
    RLFramework.NEMO_RL: 0.6,
    RLFramework.VERL: 0.5,
    RLFramework.OPENRLHF: 0.95,
}


def engine_memory_fraction(framework: RLFramework | None) -> float:
    """The share of each rollout GPU's memory the engine takes under `framework` (vLLM's own
    default when none is named)."""
    if framework is None:
        return float(str(engine("vllm").kv_cache.memory_fraction.value))
    return ENGINE_MEMORY_FRACTION[framework]
