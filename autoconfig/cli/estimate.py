"""`autoconfig estimate`: one configuration's memory and step-time breakdown, or predictions
for every row of a CSV of runs."""

from __future__ import annotations

from pathlib import Path

import typer

from autoconfig import api
from autoconfig.cli.app import app
from autoconfig.cli.options import COUNT, COUNT0, OUT_FILE, read_csv
from autoconfig.errors import UserError
from autoconfig.report import files, terminal
from autoconfig.vocab import Framework, Precision, Recompute, ZeroStage


@app.command()
def estimate(
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    gpu: str = typer.Option("h100-sxm-80gb", help="GPU profile name (see `autoconfig gpus`)"),
    gpus: int = typer.Option(None, help="total number of GPUs", callback=COUNT),
    tp: int = typer.Option(1, help="tensor-parallel degree", callback=COUNT),
    pp: int = typer.Option(1, help="pipeline stages", callback=COUNT),
    vp: int = typer.Option(
        1, help="virtual stages per pipeline rank (interleaved 1F1B)", callback=COUNT
    ),
    cp: int = typer.Option(1, help="context-parallel degree", callback=COUNT),
    ep: int = typer.Option(1, help="expert-parallel degree (MoE)", callback=COUNT),
    dp: int = typer.Option(
        None, help="data-parallel degree (default: gpus / (tp*pp*cp))", callback=COUNT
    ),
    sp: bool = typer.Option(None, "--sp/--no-sp", help="sequence parallel (default: on if tp>1)"),
    mbs: int = typer.Option(1, help="micro-batch size in sequences", callback=COUNT),
    gbs: int = typer.Option(
        None, help="global batch size in sequences (default: dp*mbs)", callback=COUNT
    ),
    seq_len: int = typer.Option(
        None, help="sequence length (default: the model's)", callback=COUNT
    ),
    recompute: Recompute = typer.Option(Recompute.NONE, help="activation recompute"),
    recompute_layers: int = typer.Option(
        None, help="with full recompute: layers per stage", callback=COUNT0
    ),
    zero: int = typer.Option(
        int(ZeroStage.OPTIMIZER), min=0, max=3, help="0, 1 (distributed optimizer), 2, 3 (FSDP)"
    ),
    precision: Precision = typer.Option(Precision.BF16, help="training precision"),
    flash: bool = typer.Option(True, "--flash/--no-flash", help="flash attention"),
    framework: Framework = typer.Option(
        Framework.MEGATRON, help="the framework that runs it (what it overlaps and fuses)"
    ),
    gpus_per_node: int = typer.Option(
        None, help="GPUs per node (default: the GPU's cluster)", callback=COUNT
    ),
    runs: Path = typer.Option(None, help="CSV of runs (reference columns) to estimate in batch"),
    out: Path = typer.Option(
        None, help="with --runs: where to write predictions CSV", callback=OUT_FILE
    ),
) -> None:
    """Predict memory and step time of one configuration (or every row of --runs)."""
    if runs is not None:
        files.write_batch(api.estimate_frame(read_csv(runs)), out)
        return
    if model is None or gpus is None:
        raise UserError("estimate: give --model and --gpus (or --runs CSV)")
    result = api.estimate(
        model,
        gpu,
        gpus,
        tp=tp,
        pp=pp,
        vp=vp,
        cp=cp,
        ep=ep,
        dp=dp,
        sp=sp,
        mbs=mbs,
        gbs=gbs,
        seq_len=seq_len,
        recompute=recompute.value,
        recompute_layers=recompute_layers,
        zero=zero,
        precision=precision.value,
        flash_attention=flash,
        gpus_per_node=gpus_per_node,
        framework=framework.value,
    )
    terminal.print_view(terminal.estimate_view(result.iloc[0]))
