"""`autoconfig train`: run the bundled trainer on this machine's ranks for a few steps."""

from __future__ import annotations

from pathlib import Path

import typer

from autoconfig import checks
from autoconfig.cli.app import app
from autoconfig.cli.options import COUNT, COUNT0, OUT_FOLDER, SEED, checked
from autoconfig.vocab import Device, Recompute

ZERO = checked(checks.integer, low=0, high=3)


@app.command()
def train(
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    config: Path = typer.Option(None, help="a trainer configuration JSON instead of flags"),
    layers: int = typer.Option(None, help="keep only this many layers", callback=COUNT),
    seq_len: int = typer.Option(
        None, help="sequence length (default: the model's)", callback=COUNT
    ),
    tp: int = typer.Option(1, callback=COUNT),
    pp: int = typer.Option(1, callback=COUNT),
    vp: int = typer.Option(
        1, help="virtual stages per pipeline rank (interleaved 1F1B)", callback=COUNT
    ),
    dp: int = typer.Option(None, help="default: nproc / (tp*pp*cp)", callback=COUNT),
    cp: int = typer.Option(1, help="context parallel degree", callback=COUNT),
    ep: int = typer.Option(1, help="expert parallel degree", callback=COUNT),
    sp: bool = typer.Option(False, help="sequence parallelism (with tp > 1)"),
    mbs: int = typer.Option(1, help="micro-batch size", callback=COUNT),
    gbs: int = typer.Option(
        None, help="global batch (default dp*mbs, x pp with pipelining)", callback=COUNT
    ),
    recompute: Recompute = typer.Option(Recompute.NONE),
    recompute_layers: int = typer.Option(
        None, help="with full: layers per stage recomputed", callback=COUNT0
    ),
    zero: int = typer.Option(0, help="0 DDP, 1 +sharded optimizer, 2/3 FSDP2", callback=ZERO),
    capacity_factor: float = typer.Option(
        None, help="MoE: tokens an expert takes, as a multiple of its even share (default: all)"
    ),
    precision: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp32"),
    device: Device = typer.Option(Device.AUTO),
    steps: int = typer.Option(10, callback=COUNT),
    warmup: int = typer.Option(2, help="steps left out of the median step time", callback=COUNT0),
    seed: int = typer.Option(1234, callback=SEED),
    compile: bool = typer.Option(False, help="torch.compile each layer"),
    slice: bool = typer.Option(False, help="one device with the per-rank shapes of --tp"),
    gpu: str = typer.Option(None, help="GPU profile for MFU (default: detected)"),
    nproc: int = typer.Option(None, help="local ranks to spawn (default tp*pp*dp)", callback=COUNT),
    out: Path = typer.Option(
        None, help="run folder (default runs/train-<time>)", callback=OUT_FOLDER
    ),
) -> None:
    """Run the bundled trainer for a few steps and write metrics.json."""
    # torch takes seconds to import: only `train` pays for it.
    from autoconfig.trainer import cli_train

    code = cli_train.run(
        config=config,
        fields={
            "model": model,
            "layers": layers,
            "seq_len": seq_len,
            "tp": tp,
            "pp": pp,
            "vp": vp,
            "dp": dp,
            "cp": cp,
            "ep": ep,
            "sp": sp,
            "mbs": mbs,
            "gbs": gbs,
            "recompute": recompute.value,
            "recompute_layers": recompute_layers,
            "zero": zero,
            "capacity_factor": capacity_factor,
            "precision": precision,
            "device": device.value,
            "steps": steps,
            "warmup": warmup,
            "seed": seed,
            "compile": compile,
            "slice": slice,
            "gpu": gpu,
        },
        nproc=nproc,
        out=out,
    )
    raise typer.Exit(code)
