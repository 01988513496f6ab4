"""`autoconfig train`: check the layout, launch the ranks, print what was measured."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autoconfig.base.errors import UserError
from autoconfig.spec import catalog, machine
from autoconfig.spec.vocab import Device
from autoconfig.trainer.config import load_config, make_config
from autoconfig.trainer.hostmem import check_fits
from autoconfig.trainer.launch import launch_local
from autoconfig.trainer.metrics import RunMetrics


def run(
    config: Path | None,
    fields: dict,
    nproc: int | None,
    out: Path | None,
    on_accepted: Callable[[], None] = lambda: None,
) -> int:
    """Check the run, then (`on_accepted`: e.g. the defaults line, never before a refusal)
    launch it on local ranks and show what it measured beside the prediction."""
    if config is not None:
        cfg = load_config(config)
    else:
        if not fields.get("model"):
            raise UserError("model: required (a catalog name or a config.json path)")
        catalog.get_model(fields["model"])  # unknown names: closest names, before anything
        given = {k: v for k, v in fields.items() if v is not None}
        if nproc is not None:
            if nproc < 1:
                raise UserError(f"gpus: must be a positive integer (got {nproc})")
            given["world_size"] = nproc
        cfg = make_config(**given)
    if cfg.gpu:
        catalog.get_gpu(cfg.gpu)
    if machine.resolve(cfg.device) is Device.CPU:
        check_fits(cfg)  # before the ranks allocate: one line, not the OOM killer
    on_accepted()
    out = out or Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")
    console = Console(stderr=True)
    console.print(f"[dim]training on {cfg.world} rank(s), results in {out}[/dim]")
    code, metrics = launch_local(cfg, out)
    show(metrics, out)
    return code


def show(m: RunMetrics, out: Path) -> None:
    console = Console()
    if m.status == "interrupted":  # Ctrl-C: one line, and where the finished steps are
        print(f"interrupted: {m.message}; metrics: {out / 'metrics.json'}", file=sys.stderr)
        return
    if m.status != "ok":
        console.print(f"[red]{m.status}[/red]: {escape(m.message)}")
        console.print(f"metrics: {out / 'metrics.json'}")
        return
    table = Table(title=f"measured ({m.status})", show_header=True)
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column("predicted", justify="right")
    pred = m.predicted or {}
    # Time and capacity predictions need a profile (cpu-gloo for CPU ranks); bytes do not.
    on_gpu = pred if m.gpu_profile is not None else {}
    peak = max((r.peak_allocated_gib or 0.0) for r in m.memory) if m.memory else 0.0
    rows = [
        ("median step time (s)", m.median_step_time_s, on_gpu.get("pred_step_time_s")),
        ("tokens/s/GPU", m.tokens_per_s_per_gpu, on_gpu.get("pred_tokens_per_s_per_gpu")),
        ("model TFLOP/s/GPU", m.model_tflops_per_gpu, on_gpu.get("pred_model_tflops_per_gpu")),
        ("MFU %", _percent(m.mfu), _percent(on_gpu.get("pred_mfu"))),  # a % in every table
        ("peak allocated GiB (max rank)", peak or None, on_gpu.get("pred_peak_mem_gib")),
        (
            "saved activations / layer (MB)",
            max(r.saved_activation_bytes_per_layer for r in m.memory) / 1e6 if m.memory else None,
            (pred.get("act_bytes_per_layer") or 0) / 1e6 or None,
        ),
    ]
    for name, measured, predicted in rows:
        table.add_row(name, _fmt(measured), _fmt(predicted))
    console.print(table)
    if m.slice_layer:
        s = m.slice_layer
        fwd, bwd = pred.get("layer_forward_s"), pred.get("layer_backward_s")
        predicted = f" (predicted {fwd * 1e3:.2f} and {bwd * 1e3:.2f} ms)" if fwd and bwd else ""
        console.print(
            f"one layer with tp={s['tp_of_shapes']} shapes: forward {s['forward_ms']:.2f} ms, "
            f"backward {s['backward_ms']:.2f} ms{predicted}"
        )
    if m.losses:
        console.print(f"loss {m.losses[0]:.4f} -> {m.losses[-1]:.4f} over {len(m.losses)} steps")
    console.print(f"metrics: {out / 'metrics.json'}")


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}"
