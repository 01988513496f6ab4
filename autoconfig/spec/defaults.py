"""The defaults every entry point shares, declared once: the Python API, the search and the
command line take the GPU, framework, precision and the settings of measured trials on CPU
ranks from here (the layout's own defaults are in autoconfig.spec.layout's DIMENSIONS)."""

from __future__ import annotations

from autoconfig.base.checks import MAX_COUNT
from autoconfig.spec import layout
from autoconfig.spec.vocab import Framework, Precision, Recompute, ServePrecision

GPU = "h100-sxm-80gb"  # a profile of autoconfig/profiles/gpus/
PRECISION = Precision.BF16
FRAMEWORK = Framework.MEGATRON
# The layout settings a command prints when it took them by default: the declaration's.
ZERO = int(layout.BY_NAME["zero"].default)  # a ZeroStage, as the plain number flags take
RECOMPUTE = Recompute(layout.BY_NAME["recompute"].default)
MEMORY_HEADROOM = 0.0  # fraction of GPU memory kept free

# Measured trials on CPU ranks (the bundled trainer over gloo): the profile that times them, a
# global batch of a few sequences per rank (the batch rule sizes batches for the model's
# published runs, far beyond a few CPU steps), and serving weights in fp32, as the bundled
# model runs on CPU.
CPU_TRIAL_GPU = "cpu-gloo"
CPU_TRIAL_SEQUENCES_PER_RANK = 4
CPU_TRIAL_SERVING_PRECISION = ServePrecision.FP32


def cpu_trial_gbs(ranks: int) -> int:
    """The global batch of a measured search on `ranks` CPU ranks when none is given."""
    return min(CPU_TRIAL_SEQUENCES_PER_RANK * ranks, MAX_COUNT)


def gpu_for(*, trials_on_cpu: bool) -> str:
    """The GPU profile a command takes when none is given: the CPU ranks' for trials on CPU."""
    return CPU_TRIAL_GPU if trials_on_cpu else GPU
