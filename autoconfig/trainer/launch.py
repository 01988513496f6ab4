"""Starting a run and collecting its result: local ranks through torchrun's launcher API
(`elastic_launch`), and metrics.json assembled from the ranks' own result files, so a run that
fails on any rank still ends with a metrics.json that says how."""

from __future__ import annotations

import json
import logging
import os
import sys
import uuid
from pathlib import Path

from autoconfig.trainer.config import TrainConfig
from autoconfig.trainer.metrics import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_OOM,
    RankMemory,
    RunMetrics,
    median_after_warmup,
    write_json_atomic,
)

GPU_PROFILES = (  # substring of torch.cuda.get_device_name -> GPU profile
    ("H200", "h200-sxm-141gb"),
    ("H100", "h100-sxm-80gb"),
    ("A100-SXM4-40GB", "a100-sxm-40gb"),
    ("A100", "a100-sxm-80gb"),
    ("B200", "b200-180gb"),
)


def gpu_profile(cfg: TrainConfig, device_names: list[str], device_type: str) -> str | None:
    if cfg.gpu:
        return cfg.gpu
    if device_type != "cuda" or not device_names:
        return None
    for key, profile in GPU_PROFILES:
        if key in device_names[0]:
            return profile
    return None


def predicted_serving(cfg: TrainConfig, profile: str | None) -> dict:
    """The serving model's figures for a generation run."""
    import pandas as pd

    from autoconfig.frame import model_columns_for_frame
    from autoconfig.serve.predict import predict_frame

    row = {
        **model_columns_for_frame(cfg.spec()),
        "gpu": profile or "cpu-gloo",
        "tp": cfg.tp,
        "pp": cfg.pp,
        "num_gpus": cfg.world,
        "batch_size": cfg.mbs,
        "input_len": cfg.input_len,
        "output_len": cfg.output_len,
        # The generator runs bf16 on GPU and fp32 on CPU unless told otherwise.
        "precision": "bf16"
        if (profile and cfg.precision != "fp32") or cfg.precision == "bf16"
        else "fp32",
    }
    out = predict_frame(pd.DataFrame([row])).iloc[0]
    if out["error"]:
        return {"error": out["error"]}
    keep = [c for c in out.index if c.startswith(("pred_", "mem_", "time_"))]
    return {c: (out[c].item() if hasattr(out[c], "item") else out[c]) for c in keep}


def predicted(cfg: TrainConfig, profile: str | None) -> dict | None:
    """The cost model's figures for this run (on CPU only the memory parts mean anything)."""
    from autoconfig import api

    if cfg.task == "generate":
        try:
            return predicted_serving(cfg, profile)
        except Exception as exc:  # a prediction must never cost the measurement
            return {"error": str(exc)}

    spec = cfg.trained_spec()
    try:
        row = api.estimate(
            spec,
            profile or "h100-sxm-80gb",
            cfg.world,
            tp=1 if cfg.slice else cfg.tp,
            pp=cfg.pp,
            vp=cfg.vp,
            dp=cfg.resolved_dp,
            sp=cfg.sp,
            mbs=cfg.mbs,
            gbs=cfg.global_batch,
            seq_len=cfg.seq(spec),
            recompute=cfg.recompute,
            recompute_layers=cfg.recompute_layers,
            zero=cfg.zero,
            sp_saves_gathered=True,  # DTensor SP keeps the all-gathered inputs
        ).iloc[0]
    except Exception as exc:  # a prediction must never cost the measurement
        return {"error": str(exc)}
    keep = [c for c in row.index if c.startswith(("pred_", "mem_", "time_", "act_"))]
    out = {c: (row[c].item() if hasattr(row[c], "item") else row[c]) for c in keep}
    out["gpu_profile"] = profile or "h100-sxm-80gb (no GPU: memory parts only)"
    return out


def assemble(cfg: TrainConfig, out: Path, world: int, failure: str = "") -> RunMetrics:
    """metrics.json from the ranks' rank{r}.json files (missing ranks count as crashed)."""
    ranks = []
    for r in range(world):
        path = out / f"rank{r}.json"
        ranks.append(json.loads(path.read_text()) if path.exists() else None)
    statuses = [r["status"] if r else "error" for r in ranks]
    if "oom" in statuses:
        status = "oom"
    elif all(s == "ok" for s in statuses) and not failure:
        status = "ok"
    else:
        status = "error"
    said = [f"rank {i}: {r['message']}" for i, r in enumerate(ranks) if r and r["message"]]
    messages = list(said)
    missing = [str(i) for i, r in enumerate(ranks) if r is None]
    if missing:
        messages.append(f"ranks {', '.join(missing)} wrote no result (killed or crashed)")
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
        predicted=predicted(cfg, profile),
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
                from autoconfig import catalog

                peak = catalog.get_gpu(profile).peak("bf16")
                metrics.mfu = metrics.model_tflops_per_gpu / peak
        metrics.slice_layer = ranks[0].get("slice_layer")
    write_json_atomic(out / "metrics.json", metrics.model_dump(mode="json"))
    return metrics


def launch_local(cfg: TrainConfig, out: Path, quiet: bool = True) -> tuple[int, RunMetrics]:
    """Run `cfg` on this machine with cfg.world local ranks; returns (exit code, metrics)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("rank*.json"):
        stale.unlink()
    config_path = out / "config.json"
    write_json_atomic(config_path, cfg.model_dump(mode="json"))
    if cfg.world == 1 and cfg.memory_limit_gb is None and not cfg.fault:
        # In this process; a memory cap or an injected fault needs a process of its own.
        from autoconfig.trainer.run import train

        os.environ.pop("RANK", None)
        os.environ.pop("WORLD_SIZE", None)
        code = train(cfg, out)
        return code, assemble(cfg, out, 1)
    if quiet:
        logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    launch = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=cfg.world,
        run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.2,
        logs_specs=DefaultLogsSpecs(log_dir=str(out / "logs")),
        start_method="spawn",
    )
    # Ranks share this machine's cores: one thread each, as torchrun does by default.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args = ["-m", "autoconfig.trainer", "--config", str(config_path), "--out", str(out)]
    failure = ""
    try:
        elastic_launch(launch, sys.executable)(*args)
    except ChildFailedError as exc:
        failure = _failure_line(exc)
    metrics = assemble(cfg, out, cfg.world, failure)
    codes = {"ok": EXIT_OK, "oom": EXIT_OOM}
    return codes.get(metrics.status, EXIT_ERROR), metrics


def _failure_line(exc: Exception) -> str:
    failures = getattr(exc, "failures", {})
    parts = []
    for local_rank, failure in sorted(failures.items()):
        parts.append(f"rank {local_rank} exited with code {failure.exitcode}")
    return "; ".join(parts) or str(exc).splitlines()[0]
