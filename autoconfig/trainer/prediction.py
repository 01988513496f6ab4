"""The cost model's view of trainer runs: the inputs of a run as it was configured (the model
as trained, the layout, the GPU profile) and the predicted figures metrics.json shows beside
what was measured."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig.columns.build import (
    Behaviour,
    Hardware,
    reduce_bits,
    serving_inputs,
    training_inputs,
)
from autoconfig.cost import CostInputs, evaluate, finetune
from autoconfig.cost.inference import evaluate_serving
from autoconfig.cost.memory import stage_params
from autoconfig.spec import catalog, layout
from autoconfig.spec.vocab import GIB, KvPrecision, ServePrecision
from autoconfig.trainer.config import TrainConfig

DEFAULT_PROFILE = "h100-sxm-80gb"  # when no profile is known (a run that never started)
CPU_PROFILE = "cpu-gloo"  # the bundled trainer's ranks on CPU cores, gloo over loopback

# What the cost model counts in 16 bits (activations, weights) or as fp32 master weights plus
# Adam's m and v (12 bytes/param), and what an fp32 run (CPU, precision auto or fp32) holds
# instead: every activation and weight in 4 bytes, m and v (8 bytes/param) and no master copy.
FP32_SCALE = {
    "act_bytes_per_layer": 2.0,
    "mem_activations_gib": 2.0,
    "mem_pipeline_in_flight_gib": 2.0,
    "mem_logits_embedding_gib": 2.0,
    "mem_transient_gib": 2.0,
    "mem_weights_gib": 2.0,
    "mem_optimizer_gib": 8.0 / 12.0,
}


def _plain(preds: dict, prefixes: tuple[str, ...]) -> dict:
    return {k: float(np.asarray(v).ravel()[0]) for k, v in preds.items() if k.startswith(prefixes)}


def predicted_serving(cfg: TrainConfig, profile: str | None) -> dict:
    """The serving model's figures for a generation run."""
    gpu = catalog.get_gpu(profile or "cpu-gloo")
    # The generator runs bf16 on GPU and fp32 on CPU unless told otherwise.
    bf16 = (profile and cfg.precision != "fp32") or cfg.precision == "bf16"
    weights = ServePrecision.BF16 if bf16 else ServePrecision.FP32
    deployment = pd.DataFrame(
        {
            "tp": [cfg.tp],
            "etp": [cfg.etp],
            "pp": [cfg.pp],
            "batch_size": [cfg.mbs],
            "input_len": [cfg.input_len],
            "output_len": [cfg.output_len],
            "replicas": [1],
            "precision": [weights.value],
            "kv_precision": [KvPrecision.AUTO.resolve(weights).value],
        }
    )
    with np.errstate(all="ignore"):
        preds = evaluate_serving(serving_inputs(cfg.spec(), (gpu, gpu.cluster), deployment))
    return _plain(preds, ("pred_", "mem_", "time_"))


def device_type_of(cfg: TrainConfig, profile: str) -> str:
    """Where a run's ranks ran: its --device, else CPU for the cpu-gloo profile, else GPU."""
    if cfg.device != "auto":
        return cfg.device
    return "cpu" if profile == CPU_PROFILE else "cuda"


def reductions_after_backward(configs: list[TrainConfig]) -> dict[str, np.ndarray]:
    """The ZeRO stages whose gradients the trainer reduces only after the whole backward
    (Behaviour.reduce_after_backward and pipeline_reduce_after_backward), per run. ZeRO-1's
    ShardedOptimizer reduce-scatters in its step. Under torch.distributed.pipelining, FSDP and
    `replicate` modules reduce after a stage's last backward (stage.py perform_reduce_grad),
    while DDP reduces in it; ZeRO-0 runs `replicate` where tensor parallelism or experts
    reduced apart rule DDP out (parallel.apply_dp)."""
    piped = [
        reduce_bits([1, 2, 3] + ([0] if cfg.tp > 1 or cfg.experts_apart else [])) for cfg in configs
    ]
    return {
        "reduce_after_backward": np.full(len(configs), reduce_bits([1])),
        "pipeline_reduce_after_backward": np.array(piped, float),
    }


def training_inputs_of_runs(
    configs: list[TrainConfig], profiles: list[str], device_types: list[str] | None = None
) -> CostInputs:
    """The cost model's inputs for trainer runs: the model as trained (slice shapes in slice
    mode), the layout that ran, on the given GPU profiles, and the device type each ran on
    (default: `device_type_of`), which decides whether its layers ran under autocast."""
    if device_types is None:
        device_types = [device_type_of(c, p) for c, p in zip(configs, profiles, strict=True)]
    autocast = [runs_autocast(c, d) for c, d in zip(configs, device_types, strict=True)]
    specs = [cfg.trained_spec() for cfg in configs]
    gpus = [catalog.get_gpu(p) for p in profiles]
    # The task (LoRA freezes the base: cost/finetune.py) and the packed documents of each run.
    tasks = [cfg.task_spec().columns() for cfg in configs]
    task_columns = {name: np.array([t[name] for t in tasks], float) for name in tasks[0]}
    dims = []
    for cfg in configs:
        d = layout.plain(cfg.model_dump())
        dims.append(d | {"tp": 1, "etp": 1, "sp": False} if cfg.slice else d)
    return training_inputs(
        specs,
        [Hardware(g, g.cluster) for g in gpus],
        layout.frame_of(dims),
        np.array([cfg.global_batch for cfg in configs], float),
        np.array([cfg.seq(s) for cfg, s in zip(configs, specs, strict=True)], float),
        # DTensor SP keeps the all-gathered inputs; an interleave that divides only with the
        # embedding and the head counted as layers is split so (TrainConfig.stage_layer_ids);
        # FSDP's ZeRO-2 reduce-scatters every micro-batch, DDP and ZeRO-1 once a step
        # (parallel.reduce_on_last, sharded_optimizer)
        Behaviour(
            sp_saves_gathered=1.0,
            ends_split_to_interleave=1.0,
            reduce_every_micro_batch=reduce_bits([2]),
            zero2_gathers_every_micro_batch=1.0,  # fully_shard reshards after backward
            fsdp_copies=1.0,  # fully_shard copies out its gathers and copies in its reductions
            **reductions_after_backward(configs),
            autocast_fp32=np.array(autocast, float),
            # trainer/ops.py's norm: plain tensor ops under autograd, which --compile fuses
            eager_rmsnorm=np.array([not c.compile for c in configs], float),
            # On GPU a step's fixed cost is the optimizer's passes alone (measured: the
            # intercept of step time against micro-batches, docs/gpu_measurements.md); CPU
            # ranks keep cpu-gloo's. Measured on one GPU; a multi-rank run's communication is
            # charged as modelled.
            profile_step_overhead=np.array([d != "cuda" for d in device_types], float),
            grads_freed_each_step=1.0,  # run.py: optimizer.zero_grad(set_to_none=True)
            **gradient_passes(configs, device_types),
            **task_columns,
        ),
    )


def gradient_passes(configs: list[TrainConfig], device_types: list[str]) -> dict[str, np.ndarray]:
    """The Behaviour columns `grad_pass_bytes` and `grad_accumulate_bytes` of trainer runs:
    what the trainer moves per parameter of a rank, every micro-batch and every one but the
    first, to accumulate weight gradients (`grad_bytes_of_run`)."""
    pairs = [grad_bytes_of_run(c, d) for c, d in zip(configs, device_types, strict=True)]
    passes, adds = zip(*pairs, strict=True)
    return {
        "grad_pass_bytes": np.array(passes, float),
        "grad_accumulate_bytes": np.array(adds, float),
    }


def grad_bytes_of_run(cfg: TrainConfig, device_type: str) -> tuple[float, float]:
    """(every micro-batch, every one but the first) bytes per parameter of a rank, from the
    size of a weight gradient as backward makes it (g: 2 under GPU mixed precision or for bf16
    weights on CPU, else 4) and as it is accumulated (a: 4 under GPU mixed precision, else g).

    - Without FSDP: under autocast each bf16 gradient is cast to fp32 (g + a), and from the
      second micro-batch on autograd adds it to the `.grad` it holds (3a: read both, write
      one).
    - FSDP (ZeRO-2/3 over several ranks) without pipelining: from the second micro-batch on
      it adds the reduced shard to the sharded `.grad` (3a / (dp cp)). Its copy of the
      unsharded gradients into the reduce-scatter buffer every micro-batch is one of FSDP's
      copies (Behaviour.fsdp_copies), not counted here.
    - FSDP under a pipeline schedule (gradient sync off until the last micro-batch): under
      GPU mixed precision the first gradient is upcast into an unsharded accumulator in the
      reduce dtype (g + a) and every later one added to it (2a + g), so (g + a, a) make
      g + a in the first micro-batch and 2a + g in each later one; without a reduce dtype
      autograd adds into `.grad` (3a).

    The embedding's gradient, which autocast leaves in fp32, skips the cast; the model charges
    every parameter alike."""
    mixed = device_type == "cuda" and not runs_fp32(cfg, device_type)
    bf16_weights = device_type != "cuda" and cfg.precision == "bf16"
    grad = 2.0 if mixed or bf16_weights else 4.0
    held = 4.0 if mixed else grad
    if not runs_fsdp(cfg):
        return (grad + held if grad != held else 0.0), 3.0 * held
    if cfg.pp > 1:
        return (grad + held, held) if grad != held else (0.0, 3.0 * held)
    return 0.0, 3.0 * held / (cfg.resolved_dp * cfg.cp)


def runs_fp32(cfg: TrainConfig, device_type: str) -> bool:
    """Whether the ranks hold activations and weights in fp32: on CPU unless asked for bf16
    (on GPU, precision auto and bf16 are autocast to bf16)."""
    return cfg.precision == "fp32" or (device_type != "cuda" and cfg.precision != "bf16")


def runs_autocast(cfg: TrainConfig, device_type: str) -> bool:
    """Whether the layers run bf16 under torch.autocast over fp32 weights: on GPU at precision
    auto or bf16, unless FSDP holds them (ZeRO-2/3 over more than one rank: its mixed-precision
    policy gathers bf16 weights and casts each block's input to bf16, so the layers run in 16
    bits). On CPU, bf16 stores the weights themselves in bf16."""
    return device_type == "cuda" and not runs_fp32(cfg, device_type) and not runs_fsdp(cfg)


def runs_fsdp(cfg: TrainConfig) -> bool:
    """Whether FSDP shards the weights and gradients: ZeRO-2/3 over more than one rank."""
    return cfg.zero >= 2 and cfg.resolved_dp * cfg.cp > 1


def _nf4_gib(cfg: TrainConfig, inputs: CostInputs) -> float:
    """GiB of QLoRA's NF4 base weights on the busiest rank (cost.finetune), 0 otherwise."""
    if not cfg.quantized:
        return 0.0
    linear = stage_params(inputs).busiest_linear
    return float(np.asarray(linear).ravel()[0]) * finetune.NF4_BYTES_PER_PARAM / GIB


def as_fp32(out: dict, profile: str, nf4_gib: float = 0.0) -> dict:
    """The cost model's 16-bit memory figures as an fp32 run holds them (FP32_SCALE); the
    peak grows by the difference plus the profile's proportional overhead on it. `nf4_gib`
    of the weights are QLoRA's NF4 base, whose bytes do not depend on the run's precision."""
    scaled = dict(out)
    for key, factor in FP32_SCALE.items():
        if key in scaled:
            kept = nf4_gib if key == "mem_weights_gib" else 0.0
            scaled[key] = (out[key] - kept) * factor + kept
    grown = sum(scaled[k] - out[k] for k in FP32_SCALE if k.endswith("_gib") and k in out)
    if "pred_peak_mem_gib" in out:
        overhead = catalog.get_gpu(profile).efficiency.memory_overhead
        scaled["pred_peak_mem_gib"] = out["pred_peak_mem_gib"] + grown * (1.0 + overhead)
    return scaled


def predicted(cfg: TrainConfig, profile: str | None, device_type: str = "cuda") -> dict | None:
    """The cost model's figures for this run as it ran: its layout (cp and ep included), the
    GPU profile (cpu-gloo for CPU ranks) and the precision its ranks held (FP32_SCALE)."""
    if profile is None:
        profile = CPU_PROFILE if device_type == "cpu" else DEFAULT_PROFILE
    try:
        if cfg.task == "generate":
            return predicted_serving(cfg, profile if device_type == "cuda" else None)
        inputs = training_inputs_of_runs([cfg], [profile], [device_type])
        with np.errstate(all="ignore"):
            out = _plain(evaluate(inputs), ("pred_", "mem_", "time_", "act_", "layer_"))
            nf4_gib = _nf4_gib(cfg, inputs)
    except Exception as exc:  # a prediction must never cost the measurement
        return {"error": str(exc)}
    fp32 = runs_fp32(cfg, device_type)
    if fp32:
        out = as_fp32(out, profile, nf4_gib)
    out["gpu_profile"] = profile
    out["precision"] = "fp32" if fp32 else "bf16"
    return out
