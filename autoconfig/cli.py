"""The command line: parse flags, call the Python API, render. No modelling happens here."""

from __future__ import annotations

import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import typer

from autoconfig import api, catalog
from autoconfig.errors import UserError
from autoconfig.report import exports, files, terminal

if TYPE_CHECKING:
    from autoconfig.measure.session import MeasureOptions

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the fastest parallel configuration to train a transformer.",
)


class RecomputeOpt(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"
    op = "op"


class PrecisionOpt(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


@app.command()
def estimate(
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    gpu: str = typer.Option("h100-sxm-80gb", help="GPU profile name (see `autoconfig gpus`)"),
    gpus: int = typer.Option(None, help="total number of GPUs"),
    tp: int = typer.Option(1, help="tensor-parallel degree"),
    pp: int = typer.Option(1, help="pipeline stages"),
    vp: int = typer.Option(1, help="virtual stages per pipeline rank (interleaved 1F1B)"),
    cp: int = typer.Option(1, help="context-parallel degree"),
    ep: int = typer.Option(1, help="expert-parallel degree (MoE)"),
    dp: int = typer.Option(None, help="data-parallel degree (default: gpus / (tp*pp*cp))"),
    sp: bool = typer.Option(None, "--sp/--no-sp", help="sequence parallel (default: on if tp>1)"),
    mbs: int = typer.Option(1, help="micro-batch size in sequences"),
    gbs: int = typer.Option(None, help="global batch size in sequences (default: dp*mbs)"),
    seq_len: int = typer.Option(None, help="sequence length (default: the model's)"),
    recompute: RecomputeOpt = typer.Option("none", help="activation recompute"),
    recompute_layers: int = typer.Option(None, help="with full recompute: layers per stage"),
    zero: int = typer.Option(1, min=0, max=3, help="0, 1 (distributed optimizer), 2, 3 (FSDP)"),
    precision: PrecisionOpt = typer.Option("bf16", help="training precision"),
    flash: bool = typer.Option(True, "--flash/--no-flash", help="flash attention"),
    gpus_per_node: int = typer.Option(None, help="GPUs per node (default: the GPU's cluster)"),
    runs: Path = typer.Option(None, help="CSV of runs (reference columns) to estimate in batch"),
    out: Path = typer.Option(None, help="with --runs: where to write predictions CSV"),
) -> None:
    """Predict memory and step time of one configuration (or every row of --runs)."""
    if runs is not None:
        _estimate_batch(runs, out)
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
    )
    row = result.iloc[0]
    terminal.print_view(terminal.estimate_view(row, row))


def _estimate_batch(runs: Path, out: Path | None) -> None:
    _write_batch(api.estimate_frame(_read_csv(runs)), out)


class EmitOpt(str, Enum):
    megatron = "megatron"
    nemo = "nemo"
    torchtitan = "torchtitan"


class SamplerOpt(str, Enum):
    tpe = "tpe"
    gp = "gp"
    grid = "grid"
    random = "random"
    model = "model"


class ExecutorOpt(str, Enum):
    local = "local"
    slurm = "slurm"


class DeviceOpt(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


MEASURE = "measured search (--measure)"


@app.command()
def search(
    model: str = typer.Option(..., help="catalog name or path to a Hugging Face config.json"),
    gpus: int = typer.Option(..., help="total number of GPUs (with --measure: ranks)"),
    gpu: str = typer.Option(
        None, help="GPU profile name or YAML (default h100-sxm-80gb; cpu-gloo for CPU trials)"
    ),
    profile: str = typer.Option(None, help="a GPU profile YAML, e.g. from autoconfig calibrate"),
    seq_len: int = typer.Option(None, help="sequence length (default: the model's)"),
    gbs: int = typer.Option(None, help="global batch in sequences (default: ~2-4M tokens)"),
    precision: PrecisionOpt = typer.Option("bf16", help="training precision"),
    space: Path = typer.Option(None, help="search-space YAML overriding search_spaces/"),
    fix: list[str] = typer.Option(None, help="fix a dimension, e.g. --fix tp=2 (repeatable)"),
    max_tp: int = typer.Option(None, help="largest tensor-parallel degree"),
    max_pp: int = typer.Option(None, help="largest pipeline degree"),
    min_dp: int = typer.Option(None, help="smallest data-parallel degree"),
    max_memory_gb: float = typer.Option(None, help="per-GPU memory limit, GiB"),
    memory_headroom: float = typer.Option(0.0, help="fraction of GPU memory to keep free"),
    gpus_per_node: int = typer.Option(
        None, help="GPUs per node (default: the GPU's cluster); with slurm: ranks per node"
    ),
    top: int = typer.Option(10, help="rows to show"),
    tokens: float = typer.Option(None, help="training tokens: show days (and cost) to train"),
    gpu_hour_usd: float = typer.Option(None, help="price of one GPU-hour, with --tokens"),
    out: Path = typer.Option(None, help="folder for results.csv, best.json, report.html"),
    emit: EmitOpt = typer.Option(None, help="print the best as megatron/nemo/torchtitan"),
    measure: bool = typer.Option(False, help="confirm the best candidates with profiled runs"),
    trials: int = typer.Option(8, help="finished trials to run", rich_help_panel=MEASURE),
    sampler: SamplerOpt = typer.Option(
        SamplerOpt.model, help="after the analytical top-k", rich_help_panel=MEASURE
    ),
    enqueue_top: int = typer.Option(
        3, help="analytical best measured first", rich_help_panel=MEASURE
    ),
    candidates: int = typer.Option(
        200, help="best predicted layouts the study chooses among", rich_help_panel=MEASURE
    ),
    executor: ExecutorOpt = typer.Option(ExecutorOpt.local, rich_help_panel=MEASURE),
    device: DeviceOpt = typer.Option(DeviceOpt.auto, rich_help_panel=MEASURE),
    parallel: int = typer.Option(1, help="trials at once", rich_help_panel=MEASURE),
    steps: int = typer.Option(10, help="training steps per trial", rich_help_panel=MEASURE),
    warmup: int = typer.Option(2, help="steps left out of the timing", rich_help_panel=MEASURE),
    trial_timeout_min: float = typer.Option(15.0, rich_help_panel=MEASURE),
    budget_gpu_hours: float = typer.Option(None, rich_help_panel=MEASURE),
    trial_memory_gb: float = typer.Option(
        None, help="per-rank memory cap of each trial", rich_help_panel=MEASURE
    ),
    storage: str = typer.Option(
        None, help="Optuna storage URL (default sqlite in --out)", rich_help_panel=MEASURE
    ),
    resume: bool = typer.Option(False, help="continue the study in --out", rich_help_panel=MEASURE),
    seed: int = typer.Option(0, help="sampler seed", rich_help_panel=MEASURE),
    slurm_partition: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_account: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_option: list[str] = typer.Option(
        None, help="extra sbatch option key=value (repeatable)", rich_help_panel=MEASURE
    ),
) -> None:
    """Rank every valid parallel layout of a model on N GPUs by predicted throughput; with
    --measure, confirm the best with short profiled runs of the bundled trainer."""
    fixed = _pairs(fix, "fix")
    if tokens is not None and tokens <= 0:
        raise UserError(f"tokens: must be positive (got {tokens})")
    if gpu_hour_usd is not None and gpu_hour_usd <= 0:
        raise UserError(f"gpu-hour-usd: must be positive (got {gpu_hour_usd})")
    if profile is not None and gpu is not None:
        raise UserError("profile: give --profile or --gpu, not both")
    on_cpu = measure and (device == DeviceOpt.cpu or (device == DeviceOpt.auto and not _has_cuda()))
    gpu = profile or gpu or ("cpu-gloo" if on_cpu else "h100-sxm-80gb")
    if measure and trial_memory_gb is not None and max_memory_gb is None:
        max_memory_gb = trial_memory_gb  # predict against the cap the trials will run under
    if on_cpu and gbs is None:
        gbs = 4 * gpus  # CPU trials: a few sequences per rank, not a GPU cluster's ~2-4M tokens
    if measure and out is None:
        if resume:
            raise UserError("out: --resume needs the --out folder of the search to continue")
        out = Path("runs") / time.strftime("measure-%Y%m%d-%H%M%S")
    print(f"searching {model} on {gpus} GPUs ...", file=sys.stderr)
    ranked = api.search(
        model,
        gpus,
        gpu,
        seq_len=seq_len,
        gbs=gbs,
        precision=precision.value,
        space=space,
        fix=fixed,
        max_tp=max_tp,
        max_pp=max_pp,
        min_dp=min_dp,
        max_memory_gb=max_memory_gb,
        memory_headroom=memory_headroom,
        gpus_per_node=gpus_per_node,
    )
    if measure:
        from autoconfig.measure import session

        opts = _measure_options(locals(), on_cpu)
        raise typer.Exit(session.run(ranked, model, gpu, opts))
    terminal.print_view(terminal.search_view(ranked, top, tokens, gpu_hour_usd))
    if out is not None:
        files.write_search(ranked, out)
        print(f"wrote {out}/results.csv, best.json and report.html", file=sys.stderr)
    if emit is not None and ranked.attrs["feasible"]:
        a = ranked.attrs
        print(
            exports.EXPORTERS[emit.value](
                ranked.iloc[0], a["layers"], a["gbs"], a["seq_len"], a["precision"]
            )
        )
    if not ranked.attrs["feasible"]:
        sys.exit(1)


class ObjectiveOpt(str, Enum):
    throughput = "throughput"
    latency = "latency"


class ServePrecisionOpt(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    fp32 = "fp32"


class KvPrecisionOpt(str, Enum):
    auto = "auto"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    fp32 = "fp32"


SERVE = "budget"


@app.command()
def infer(
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    gpu: str = typer.Option(
        None, help="GPU profile name or YAML (default h100-sxm-80gb; cpu-gloo for CPU trials)"
    ),
    gpus: int = typer.Option(None, help="GPUs of the deployment (with --measure: the most ranks)"),
    input_len: int = typer.Option(None, help="prompt tokens per request"),
    output_len: int = typer.Option(None, help="generated tokens per request"),
    max_ttft_ms: float = typer.Option(None, help="time to first token, ms", rich_help_panel=SERVE),
    max_tpot_ms: float = typer.Option(
        None, help="time per output token, ms", rich_help_panel=SERVE
    ),
    max_latency_ms: float = typer.Option(
        None, help="end-to-end latency of a request, ms", rich_help_panel=SERVE
    ),
    min_throughput: float = typer.Option(
        None, help="output tokens/s of the whole deployment", rich_help_panel=SERVE
    ),
    objective: ObjectiveOpt = typer.Option(
        ObjectiveOpt.throughput, help="throughput per GPU, or end-to-end latency"
    ),
    precision: ServePrecisionOpt = typer.Option(
        None, help="weights: bf16, fp16, fp8, int8 (weight-only), fp32 (default bf16; fp32 on CPU)"
    ),
    kv_precision: KvPrecisionOpt = typer.Option(KvPrecisionOpt.auto, help="K/V cache elements"),
    max_batch: int = typer.Option(1024, help="largest static batch tried"),
    batch: list[int] = typer.Option(None, help="try exactly these batch sizes (repeatable)"),
    gpus_per_node: int = typer.Option(None, help="GPUs per node (default: the GPU's cluster)"),
    allow_tp_across_nodes: bool = typer.Option(False, help="let a TP group span nodes"),
    top: int = typer.Option(15, help="rows to show"),
    out: Path = typer.Option(None, help="folder for results.csv, best.json, report.html"),
    runs: Path = typer.Option(None, help="CSV of serving points (inference_runs.csv columns)"),
    measure: bool = typer.Option(False, help="generate with the bundled model to measure"),
    trials: int = typer.Option(4, help="finished trials to run", rich_help_panel=MEASURE),
    sampler: SamplerOpt = typer.Option(SamplerOpt.model, rich_help_panel=MEASURE),
    enqueue_top: int = typer.Option(3, rich_help_panel=MEASURE),
    candidates: int = typer.Option(50, rich_help_panel=MEASURE),
    executor: ExecutorOpt = typer.Option(ExecutorOpt.local, rich_help_panel=MEASURE),
    device: DeviceOpt = typer.Option(DeviceOpt.auto, rich_help_panel=MEASURE),
    parallel: int = typer.Option(1, rich_help_panel=MEASURE),
    steps: int = typer.Option(4, help="generations per trial", rich_help_panel=MEASURE),
    warmup: int = typer.Option(1, help="generations left out", rich_help_panel=MEASURE),
    trial_timeout_min: float = typer.Option(15.0, rich_help_panel=MEASURE),
    budget_gpu_hours: float = typer.Option(None, rich_help_panel=MEASURE),
    trial_memory_gb: float = typer.Option(None, rich_help_panel=MEASURE),
    storage: str = typer.Option(None, rich_help_panel=MEASURE),
    resume: bool = typer.Option(False, rich_help_panel=MEASURE),
    seed: int = typer.Option(0, rich_help_panel=MEASURE),
    slurm_partition: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_account: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_option: list[str] = typer.Option(None, rich_help_panel=MEASURE),
) -> None:
    """Rank every (tp, pp, batch, replicas) way to serve a model on N GPUs by predicted output
    tokens/s per GPU within TTFT / TPOT / latency budgets; with --measure, generate the best
    points with the bundled model and time them."""
    if runs is not None:
        _infer_batch(runs, out)
        return
    for name, value in (
        ("model", model),
        ("gpus", gpus),
        ("input-len", input_len),
        ("output-len", output_len),
    ):
        if value is None:
            raise UserError(f"{name}: required (or give --runs CSV)")
    on_cpu = measure and (device == DeviceOpt.cpu or (device == DeviceOpt.auto and not _has_cuda()))
    gpu = gpu or ("cpu-gloo" if on_cpu else "h100-sxm-80gb")
    weights = precision.value if precision else ("fp32" if on_cpu else "bf16")
    if measure and out is None:
        if resume:
            raise UserError("out: --resume needs the --out folder of the search to continue")
        out = Path("runs") / time.strftime("infer-%Y%m%d-%H%M%S")
    from autoconfig.report import serving

    result = api.infer(
        model,
        gpu,
        gpus,
        input_len=input_len,
        output_len=output_len,
        max_ttft_ms=max_ttft_ms,
        max_tpot_ms=max_tpot_ms,
        max_latency_ms=max_latency_ms,
        min_throughput=min_throughput,
        objective=objective.value,
        precision=weights,
        kv_precision=kv_precision.value,
        max_batch=max_batch,
        batches=tuple(batch) if batch else None,
        gpus_per_node=gpus_per_node,
        allow_tp_across_nodes=allow_tp_across_nodes,
    )
    terminal.print_view(serving.terminal_view(result, top))
    if measure:
        from autoconfig.serve import measure as serve_measure

        opts = _measure_options(locals(), on_cpu)
        raise typer.Exit(serve_measure.run(result, model, gpu, opts))
    if out is not None:
        serving.write(result, out)
        print(f"wrote {out}/results.csv, best.json and report.html", file=sys.stderr)
    if not result.attrs["feasible"]:
        sys.exit(1)


def _infer_batch(runs: Path, out: Path | None) -> None:
    frame = _read_csv(runs)
    result = api.infer_frame(frame)
    _write_batch(result, out)


def _read_csv(runs: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(runs, dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise UserError(f"runs: no such file '{runs}'") from None
    except IsADirectoryError:
        raise UserError(f"runs: '{runs}' is a folder, not a CSV file") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"runs: '{runs}' is not a readable CSV ({str(exc).strip()})") from None


def _write_batch(result: pd.DataFrame, out: Path | None) -> None:
    bad = int((result["error"] != "").sum())
    if out is None:
        result.to_csv(sys.stdout, index=False)
    else:
        tmp = out.with_suffix(out.suffix + ".tmp")
        result.to_csv(tmp, index=False)
        tmp.replace(out)  # never leave a half-written file behind
        print(f"wrote {len(result)} rows to {out} ({bad} with an error)", file=sys.stderr)


def _measure_options(flags: dict[str, Any], on_cpu: bool) -> MeasureOptions:
    """The measured-trial options from a command's flags (`search` and `infer` name them alike,
    so both pass their locals())."""
    from autoconfig.measure.launcher import SlurmOptions
    from autoconfig.measure.session import MeasureOptions

    f = flags
    node = f["gpus_per_node"]
    return MeasureOptions(
        out=f["out"],
        trials=f["trials"],
        sampler=f["sampler"].value,
        executor=f["executor"].value,
        device=f["device"].value,
        parallel=f["parallel"],
        steps=f["steps"],
        warmup=f["warmup"],
        timeout_min=f["trial_timeout_min"],
        budget_gpu_hours=f["budget_gpu_hours"],
        top_k=f["enqueue_top"],
        candidates=f["candidates"],
        storage=f["storage"],
        resume=f["resume"],
        trial_memory_gb=f["trial_memory_gb"],
        seed=f["seed"],
        slurm=SlurmOptions(
            partition=f["slurm_partition"],
            account=f["slurm_account"],
            gpus_per_node=(node or 8) if not on_cpu else 0,
            ranks_per_node=node or 8,
            options=_pairs(f["slurm_option"], "slurm-option"),
        ),
    )


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"{flag}: expected key=value (got '{item}')")
        out[key.strip()] = value.strip()
    return out


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@app.command()
def calibrate(
    run: Path = typer.Argument(..., help="a measured search's --out folder"),
    write: Path = typer.Option(None, help="where to write the calibrated profile YAML"),
    storage: str = typer.Option(None, help="the study's Optuna storage URL, if not in RUN"),
) -> None:
    """Fit the GPU profile's efficiency constants to a measured search's trials."""
    from autoconfig.measure import calibrate as calib

    calib.run(run, write, storage)


@app.command()
def models() -> None:
    """List the catalog models with their parameter counts."""
    unique = {id(m): m for m in catalog.models().values()}
    terminal.print_view(terminal.models_table(sorted(unique.values(), key=lambda m: m.name)))


@app.command()
def gpus() -> None:
    """List the GPU profiles: datasheet figures and calibrated efficiency."""
    terminal.print_view(terminal.gpus_table(list(catalog.gpus().values())))


@app.command()
def train(
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    config: Path = typer.Option(None, help="a trainer configuration JSON instead of flags"),
    layers: int = typer.Option(None, help="keep only this many layers"),
    seq_len: int = typer.Option(None, help="sequence length (default: the model's)"),
    tp: int = typer.Option(1),
    pp: int = typer.Option(1),
    vp: int = typer.Option(1, help="virtual stages per pipeline rank (interleaved 1F1B)"),
    dp: int = typer.Option(None, help="default: nproc / (tp*pp*cp)"),
    cp: int = typer.Option(1, help="context parallel degree"),
    ep: int = typer.Option(1, help="expert parallel degree"),
    sp: bool = typer.Option(False, help="sequence parallelism (with tp > 1)"),
    mbs: int = typer.Option(1, help="micro-batch size"),
    gbs: int = typer.Option(None, help="global batch (default dp*mbs, x pp with pipelining)"),
    recompute: RecomputeOpt = typer.Option(RecomputeOpt.none),
    recompute_layers: int = typer.Option(None, help="with full: layers per stage recomputed"),
    zero: int = typer.Option(0, help="0 DDP, 1 +sharded optimizer, 2/3 FSDP2"),
    precision: str = typer.Option("auto", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp32"),
    device: DeviceOpt = typer.Option(DeviceOpt.auto),
    steps: int = typer.Option(10),
    warmup: int = typer.Option(2, help="steps left out of the median step time"),
    seed: int = typer.Option(1234),
    compile: bool = typer.Option(False, help="torch.compile each layer"),
    slice: bool = typer.Option(False, help="one device with the per-rank shapes of --tp"),
    gpu: str = typer.Option(None, help="GPU profile for MFU (default: detected)"),
    nproc: int = typer.Option(None, help="local ranks to spawn (default tp*pp*dp)"),
    out: Path = typer.Option(None, help="run folder (default runs/train-<time>)"),
) -> None:
    """Run the bundled trainer for a few steps and write metrics.json."""
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


def main() -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as exc:  # usage errors: unknown flag, bad number, ...
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        hint = getattr(exc, "param_hint", None) or getattr(
            getattr(exc, "param", None), "name", None
        )
        where = f"{hint}: " if isinstance(hint, str) and hint not in message else ""
        print(f"error: {where}{' '.join(message.split())}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
