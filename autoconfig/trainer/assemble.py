"""metrics.json from the ranks' own result files (a rank that wrote none counts as crashed),
with the cost model's prediction for the same configuration beside what was measured."""

from __future__ import annotations

import json
from pathlib import Path

from autoconfig.base.fileio import write_json
from autoconfig.spec import catalog
from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import (
    LOST,
    RankMemory,
    RunMetrics,
    is_collateral,
    median_after_warmup,
)
from autoconfig.trainer.prediction import CPU_PROFILE, predicted

GPU_PROFILES = (  # substring of torch.cuda.get_device_name -> GPU profile
    ("H200", "h200-sxm-141gb"),
    ("H100", "h100-sxm-80gb"),
    ("A100-SXM4-40GB", "a100-sxm-40gb"),
    ("A100", "a100-sxm-80gb"),
    ("B200", "b200-180gb"),
)


def gpu_profile(cfg: TrainConfig, device_names: list[str], device_type: str) -> str | None:
    """The profile the run is predicted and its MFU taken with: --gpu, else the detected GPU,
    else cpu-gloo for CPU ranks."""
    if cfg.gpu:
        return cfg.gpu
    if device_type == "cpu":
        return CPU_PROFILE
    if device_type != "cuda" or not device_names:
        return None
    for key, profile in GPU_PROFILES:
        if key in device_names[0]:
            return profile
    return None


def assemble(
    cfg: TrainConfig, out: Path, world: int, failure: str = "", interrupted: bool = False
) -> RunMetrics:
    """metrics.json from the ranks' rank{r}.json files (missing ranks count as crashed). A run
    stopped by Ctrl-C (`interrupted`, or a rank that says so) keeps the steps it finished."""
    ranks = []
    for r in range(world):
        path = out / f"rank{r}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else None)
    statuses = [r["status"] if r else "error" for r in ranks]
    if "oom" in statuses:
        status = "oom"
    elif interrupted or "interrupted" in statuses:
        status = "interrupted"
    elif all(s == "ok" for s in statuses) and not failure:
        status = "ok"
    else:
        status = "error"
    if status == "interrupted":
        return _interrupted(cfg, out, ranks)
    said = [f"rank {i}: {r['message']}" for i, r in enumerate(ranks) if r and r["message"]]
    # Ranks' own failures first, then the ranks that left nothing, then the peers that only
    # lost them: the message is cut at 2,000 characters, and the causes must survive the cut.
    messages = [m for m in said if not is_collateral(m)]
    missing = [str(i) for i, r in enumerate(ranks) if r is None]
    if missing:
        messages.append(f"ranks {', '.join(missing)} {LOST} (killed or crashed)")
    messages += [m for m in said if is_collateral(m)]
    if failure and not said:  # the launcher's exit codes, when no rank said why
        messages.append(failure)
    first = next((r for r in ranks if r), None)
    env = first.get("environment") if first else None
    profile = gpu_profile(cfg, env["device_names"], env["device_type"]) if env else None
    metrics = RunMetrics(
        status=status,
        message="; ".join(messages)[:2000],
        config=cfg.model_dump(mode="json"),
        environment=env,
        gpu_profile=profile,
        predicted=predicted(cfg, profile, env["device_type"] if env else "cuda"),
    )
    if status == "ok":
        times = ranks[0]["step_times_s"]
        median = median_after_warmup(times, cfg.warmup)
        # Generation counts output tokens of the batch; training the tokens of a step.
        generate = cfg.task == "generate"
        tokens = cfg.mbs * (cfg.output_len or 0) if generate else cfg.global_batch * cfg.seq()
        if generate:
            metrics.ttft_ms = ranks[0]["ttft_ms"]
            metrics.tpot_ms = ranks[0]["tpot_ms"]
        metrics.step_times_s = times
        metrics.median_step_time_s = median
        metrics.tokens_per_step = tokens
        metrics.tokens_per_s_per_gpu = tokens / median / world
        metrics.losses = ranks[0].get("losses", [])
        metrics.memory = [RankMemory(**r["memory"]) for r in ranks]
        pred = metrics.predicted or {}
        if "pred_model_tflops_per_gpu" in pred and not cfg.slice and not generate:
            # Model FLOPs per GPU per step from the cost model's count (no recompute).
            flops = pred["pred_model_tflops_per_gpu"] * pred["pred_step_time_s"] * 1e12
            metrics.model_tflops_per_gpu = flops / median / 1e12
            if profile:
                peak = catalog.get_gpu(profile).peak("bf16")
                metrics.mfu = metrics.model_tflops_per_gpu / peak
        metrics.slice_layer = ranks[0].get("slice_layer")
        metrics.routing = ranks[0].get("routing")
    write_json(out / "metrics.json", metrics.model_dump(mode="json"))
    return metrics


def _interrupted(cfg: TrainConfig, out: Path, ranks: list[dict | None]) -> RunMetrics:
    """metrics.json of a run stopped by Ctrl-C: the steps every rank finished (their times
    and losses, as rank 0 or the first rank with a result measured them), nothing else."""
    said = [r for r in ranks if r and r.get("status") == "interrupted"]
    finished = min((len(r.get("losses", [])) for r in said), default=0)
    first = said[0] if said else {}
    env = next((r.get("environment") for r in ranks if r), None)
    metrics = RunMetrics(
        status="interrupted",
        message=f"interrupted after {finished} of {cfg.steps} steps",
        config=cfg.model_dump(mode="json"),
        environment=env,
        step_times_s=first.get("step_times_s", [])[:finished],
        losses=first.get("losses", [])[:finished],
    )
    if finished and cfg.trains:
        metrics.median_step_time_s = median_after_warmup(metrics.step_times_s, cfg.warmup)
        metrics.tokens_per_step = cfg.global_batch * cfg.seq()
        metrics.tokens_per_s_per_gpu = (
            metrics.tokens_per_step / metrics.median_step_time_s / len(ranks)
        )
    write_json(out / "metrics.json", metrics.model_dump(mode="json"))
    return metrics
