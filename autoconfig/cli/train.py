"""`autoconfig train`: run the bundled trainer on this machine's ranks for a few steps."""

from __future__ import annotations

from pathlib import Path

import typer

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.cli import defaults
from autoconfig.cli.app import app
from autoconfig.cli.options import AMOUNT, COUNT, COUNT0, OUT_FOLDER, SEED, checked
from autoconfig.spec.task import task_spec
from autoconfig.spec.vocab import Device, Offload, OptimizerState, Recompute, Task

ZERO = checked(checks.integer, low=0, high=3)


@app.command()
def train(
    ctx: typer.Context,
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    config: Path = typer.Option(
        None, help="a trainer configuration JSON instead of flags (only --out goes beside it)"
    ),
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
    etp: int = defaults.size("etp", follows="tp on MoE models (Megatron-Core's default)"),
    sp: bool = defaults.sp(),
    mbs: int = typer.Option(1, help="micro-batch size", callback=COUNT),
    gbs: int = typer.Option(
        None, help="global batch (default dp*mbs, x pp with pipelining)", callback=COUNT
    ),
    recompute: Recompute = defaults.recompute(),
    recompute_layers: int = typer.Option(
        None, help="with full: layers per stage recomputed", callback=COUNT0
    ),
    zero: int = defaults.zero(),
    optimizer_state: OptimizerState = typer.Option(
        OptimizerState.FP32.value, help="Adam state precision (the bundled trainer runs fp32)"
    ),
    offload: Offload = typer.Option(
        Offload.NONE.value, help="CPU offload (the bundled trainer keeps everything on the GPU)"
    ),
    hybrid_cp: bool = typer.Option(
        False,
        "--hybrid-cp/--no-hybrid-cp",
        help="dynamic context parallelism (the bundled trainer runs static CP)",
    ),
    activation_offload: bool = typer.Option(
        False,
        "--activation-offload/--no-activation-offload",
        help="activation offload (the bundled trainer keeps activations on the GPU)",
    ),
    capacity_factor: float = typer.Option(
        None, help="MoE: tokens an expert takes, as a multiple of its even share (default: all)"
    ),
    precision: str = defaults.trainer_precision(),
    device: Device = typer.Option(Device.AUTO),
    steps: int = typer.Option(10, callback=COUNT),
    warmup: int = typer.Option(2, help="steps left out of the median step time", callback=COUNT0),
    seed: int = typer.Option(1234, callback=SEED),
    compile: bool = typer.Option(False, help="torch.compile each layer"),
    slice: bool = typer.Option(False, help="one device with the per-rank shapes of --tp"),
    task: str = typer.Option(
        Task.PRETRAIN.value,
        help="pretrain or sft (every weight trains), lora (rank-r adapters on the frozen "
        "base: no gradients or optimizer state for it) or qlora (the same on an NF4 base)",
    ),
    lora_rank: str = defaults.lora_rank(),
    lora_alpha: float = typer.Option(
        None,
        show_default="2 x rank",
        help="with --task lora: adapter outputs scale by alpha / rank",
        parser=str,  # the text as typed, checked as a finite positive number in one line
        callback=AMOUNT,
    ),
    lora_targets: str = defaults.lora_targets(),
    doc_lengths: str = typer.Option(
        None,
        help="pack documents into each sequence: a preset (squad), a length in tokens or a CSV "
        "of lengths; attention stays within each document, positions restart at each",
    ),
    gpu: str = typer.Option(
        None, show_default="the GPU detected", help="GPU profile for MFU (training runs here)"
    ),
    gpus: int = typer.Option(
        None, help="local ranks to spawn (default tp*pp*cp*dp)", callback=COUNT
    ),
    nproc: int = typer.Option(None, hidden=True, help="the old name of --gpus", callback=COUNT),
    out: Path = typer.Option(
        None,
        help="run folder (default runs/train-<time>)",
        parser=str,  # the text as typed: Path('') would read as '.', hiding an empty --out
        callback=OUT_FOLDER,
    ),
) -> None:
    """Run the bundled trainer for a few steps and write metrics.json."""
    # torch takes seconds to import: only `train` pays for it.
    from autoconfig.trainer import cli_train

    what = task_spec(task, lora_rank, lora_targets)  # a bad value is one line naming it
    if gpus is not None and nproc is not None and gpus != nproc:
        raise UserError("gpus: give --gpus (or its old name --nproc), not both")
    if config is not None:  # the file states the whole run: a flag beside it would be lost
        beside = [
            name
            for name in ctx.params
            if name not in ("config", "out") and not defaults.defaulted(ctx, name)
        ]
        if beside:
            flag = beside[0].replace("_", "-")
            key = "world_size" if beside[0] in ("gpus", "nproc") else beside[0]
            raise UserError(
                f"{flag}: --config states the whole run; set {key} in {config} "
                f"instead of giving --{flag} beside it"
            )
    if defaults.defaulted(ctx, "precision"):
        precision = "auto"  # bf16 on a GPU; a CPU trains in fp32 unless asked
    if sp is None:  # a slice runs one device: its tp shapes have no sequence to split
        sp = tp > 1 and not slice

    def announce_defaults() -> None:  # once the layout is accepted: a refusal is one line
        if config is None:
            defaults.announce(
                ctx,
                {
                    "sp": "on" if sp else "off",
                    "zero": zero,
                    "recompute": recompute.value,
                    "precision": "bf16 (fp32 on CPU)",
                },
            )

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
            "etp": etp,
            "sp": sp,
            "mbs": mbs,
            "gbs": gbs,
            "recompute": recompute.value,
            "recompute_layers": recompute_layers,
            "zero": zero,
            "optimizer_state": optimizer_state.value,
            "offload": offload.value,
            "hybrid_cp": hybrid_cp,
            "activation_offload": activation_offload,
            "capacity_factor": capacity_factor,
            "precision": precision,
            "device": device.value,
            "steps": steps,
            "warmup": warmup,
            "seed": seed,
            "compile": compile,
            "slice": slice,
            "gpu": gpu,
            # sft is pretraining's step on other data: it runs as is
            "task": what.task.value,
            "lora_rank": what.lora_rank,
            "lora_alpha": lora_alpha,
            "lora_targets": what.lora_targets.value,
            "doc_lengths": doc_lengths,
        },
        nproc=gpus if gpus is not None else nproc,
        out=out,
        on_accepted=announce_defaults,
    )
    raise typer.Exit(code)
