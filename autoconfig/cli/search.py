"""`autoconfig search`: rank every layout; with --measure, confirm the best with profiled runs
of the bundled trainer; write the report set; print launch flags."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.cli import defaults
from autoconfig.cli.app import app
from autoconfig.cli.options import (
    AMOUNT,
    COUNT,
    COUNT0,
    MEASURE,
    OUT_FOLDER,
    SEED,
    claimed,
    framework_named,
    measure_options,
    on_cpu,
)
from autoconfig.layout_search import run as search_run
from autoconfig.layout_search.result import SearchResult
from autoconfig.layout_search.space import load_space
from autoconfig.measure.result import STUDY_FILE
from autoconfig.report import exports, files, terminal
from autoconfig.spec import catalog, layout
from autoconfig.spec.defaults import (
    CPU_TRIAL_GPU,
    CPU_TRIAL_SEQUENCES_PER_RANK,
    cpu_trial_gbs,
    gpu_for,
)

if TYPE_CHECKING:  # optuna and submitit load only when a measured search runs
    from autoconfig.measure.session import MeasureOptions

from autoconfig.spec.documents import doc_lengths as read_doc_lengths
from autoconfig.spec.task import task_spec
from autoconfig.spec.vocab import Device, Executor, Framework, Precision, Sampler


@app.command()
def search(
    ctx: typer.Context,
    model: str = typer.Option(..., help="catalog name or path to a Hugging Face config.json"),
    gpus: int = typer.Option(
        ..., help="total number of GPUs (with --measure: ranks)", callback=COUNT
    ),
    gpu: str = defaults.gpu(f" ({CPU_TRIAL_GPU} for CPU trials)"),
    profile: str = defaults.profile(),
    seq_len: int = typer.Option(
        None, help="sequence length (default: the model's)", callback=COUNT
    ),
    gbs: int = defaults.gbs(),
    precision: Precision = defaults.precision(),
    space: Path = typer.Option(None, help="search-space YAML overriding the default space"),
    fix: list[str] = typer.Option(
        None, help="fix dimensions, e.g. --fix tp=2 or --fix tp=8,pp=8 (repeatable)"
    ),
    max_tp: int = typer.Option(None, help="largest tensor-parallel degree", callback=COUNT),
    max_pp: int = typer.Option(None, help="largest pipeline degree", callback=COUNT),
    min_dp: int = typer.Option(None, help="smallest data-parallel degree", callback=COUNT),
    max_memory_gib: float = defaults.max_memory_gib(),
    memory_headroom: float = defaults.memory_headroom(),
    gpus_per_node: int = typer.Option(
        None,
        help="GPUs per node (default: the GPU's cluster); with slurm: ranks per node",
        callback=COUNT,
    ),
    top: int = typer.Option(10, help="rows to show", callback=COUNT),
    tokens: float = typer.Option(
        None, help="training tokens: show days (and cost) to train", callback=AMOUNT
    ),
    gpu_hour_usd: float = typer.Option(
        None, help="price of one GPU-hour, with --tokens", callback=AMOUNT
    ),
    out: Path = typer.Option(
        None,
        parser=str,  # the text as typed: Path('') would read as '.', hiding an empty --out
        help="folder for results.csv, best.json, report.html",
        callback=OUT_FOLDER,
    ),
    framework: Framework = defaults.framework(
        "the framework that will run it: its layouts, overlaps and fused kernels "
        "(the --emit framework when only --emit is given)"
    ),
    emit: Framework = typer.Option(
        None,
        parser=str,
        callback=framework_named,
        help="print the best as that framework's settings (its name, or an alias)",
    ),
    task: str = defaults.task(),
    lora_rank: str = defaults.lora_rank(),
    lora_targets: str = defaults.lora_targets(),
    doc_lengths: str = defaults.doc_lengths(),
    padded: bool = defaults.padded(),
    measure: bool = typer.Option(False, help="confirm the best candidates with profiled runs"),
    trials: int = typer.Option(
        8, help="finished trials to run", rich_help_panel=MEASURE, callback=COUNT
    ),
    sampler: Sampler = typer.Option(
        Sampler.MODEL, help="after the analytical top-k", rich_help_panel=MEASURE
    ),
    enqueue_top: int = typer.Option(
        3, help="analytical best measured first", rich_help_panel=MEASURE, callback=COUNT0
    ),
    candidates: int = typer.Option(
        200,
        help="best predicted layouts the study chooses among",
        rich_help_panel=MEASURE,
        callback=COUNT,
    ),
    executor: Executor = typer.Option(
        Executor.LOCAL,
        help="where trials run: local processes, one SLURM job each, or a Ray placement group "
        "each (pip install 'autoconfig[ray]')",
        rich_help_panel=MEASURE,
    ),
    device: Device = typer.Option(Device.AUTO, rich_help_panel=MEASURE),
    parallel: int = typer.Option(1, help="trials at once", rich_help_panel=MEASURE, callback=COUNT),
    steps: int = typer.Option(
        10, help="training steps per trial", rich_help_panel=MEASURE, callback=COUNT
    ),
    warmup: int = typer.Option(
        2, help="steps left out of the timing", rich_help_panel=MEASURE, callback=COUNT0
    ),
    trial_timeout_min: float = typer.Option(15.0, rich_help_panel=MEASURE, callback=AMOUNT),
    budget_gpu_hours: float = typer.Option(None, rich_help_panel=MEASURE, callback=AMOUNT),
    trial_memory_gib: float = defaults.trial_memory_gib(),
    capacity_factor: float = typer.Option(
        None,
        help="MoE trials: tokens an expert takes, as a multiple of its even share (default: all)",
        rich_help_panel=MEASURE,
    ),
    storage: str = typer.Option(
        None, help="Optuna storage URL (default sqlite in --out)", rich_help_panel=MEASURE
    ),
    resume: bool = typer.Option(False, help="continue the study in --out", rich_help_panel=MEASURE),
    seed: int = typer.Option(0, help="sampler seed", rich_help_panel=MEASURE, callback=SEED),
    slurm_partition: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_account: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_option: list[str] = typer.Option(
        None, help="extra sbatch option key=value (repeatable)", rich_help_panel=MEASURE
    ),
    ray_address: str = typer.Option(
        None,
        help="with --executor ray: the cluster's host:port (default: RAY_ADDRESS's when set, "
        "else a local cluster started for the search)",
        rich_help_panel=MEASURE,
    ),
) -> None:
    """Rank every valid parallel layout of a model on N GPUs by predicted throughput; with
    --measure, confirm the best with short profiled runs of the bundled trainer."""
    fixed = layout.parse_fix(fix)
    what = task_spec(task, lora_rank, lora_targets)  # a bad task is one line before any work
    # a bad lengths file is one line before any work
    docs = read_doc_lengths(doc_lengths) if doc_lengths is not None else None
    if measure and docs is not None:
        raise UserError(
            "doc-lengths: the bundled trainer that --measure runs trains whole sequences"
        )
    if measure and what.adapters:
        raise UserError(
            f"task: the bundled trainer that --measure runs trains every weight, not {what.task}"
        )
    if resume and not measure:
        raise UserError("resume: --resume continues a measured study; it needs --measure")
    if profile is not None and not defaults.defaulted(ctx, "gpu"):
        raise UserError("profile: give --profile or --gpu, not both")
    cpu = on_cpu(measure, device)
    if defaults.defaulted(ctx, "gpu"):
        gpu = gpu_for(trials_on_cpu=cpu)
    # --profile is always a file, whatever its name (catalog.get_gpu reads paths as files).
    profile = str(Path(profile).absolute()) if profile is not None else None
    gpu = profile or gpu
    if measure and trial_memory_gib is not None and max_memory_gib is None:
        max_memory_gib = trial_memory_gib  # predict against the cap the trials will run under
    cpu_batch = cpu and gbs is None
    if cpu_batch:
        gbs = cpu_trial_gbs(gpus)
    if measure and out is None:
        if resume:
            raise UserError("out: --resume needs the --out folder of the search to continue")
        out = Path("runs") / time.strftime("measure-%Y%m%d-%H%M%S")
    if emit is not None and defaults.defaulted(ctx, "framework"):
        framework = emit
    spec = catalog.get_model(model)  # an unknown name is one line before any work starts
    catalog.get_gpu(gpu)  # the framework was resolved by its flag's callback
    # a fixed optimizer state, offload or dynamic CP the framework or the other fixed values
    # cannot run: one line before any work starts
    fw = catalog.get_framework(framework.value)
    search_run.check_state(fw, fixed.get("optimizer_state"))
    search_run.check_offload(fw, fixed.get("offload"))
    packed = what.with_documents(docs, seq_len or spec.seq_len, not padded)
    search_run.check_hybrid_cp(fw, spec, packed, fixed.get("hybrid_cp"), fixed)
    search_space = load_space(space) if space is not None else None  # a bad file: one line
    opts = measure_options(locals(), cpu) if measure else None
    if opts is not None:
        _check_measure(opts)  # before the search: a bad trial option costs nothing
    elif out is not None and (Path(out) / STUDY_FILE).exists():
        # A plain search would replace the set that holds the measured search's trials.csv
        # and measured.csv: what was measured stays the folder's until the user says otherwise.
        raise UserError(
            f"out: {out} holds a measured search ({STUDY_FILE}); add to it with --measure "
            "--resume, or choose another --out"
        )
    with claimed(out):
        print(f"searching {model} on {gpus} GPUs ...", file=sys.stderr)
        result = api.search(
            model,
            gpus,
            gpu,
            seq_len=seq_len,
            gbs=gbs,
            precision=precision.value,
            space=search_space,
            fix=fixed,
            max_tp=max_tp,
            max_pp=max_pp,
            min_dp=min_dp,
            max_memory_gib=max_memory_gib,
            memory_headroom=memory_headroom,
            gpus_per_node=gpus_per_node,
            framework=framework.value,
            task=what.task.value,
            lora_rank=what.lora_rank,
            lora_targets=what.lora_targets.value,
            doc_lengths=docs,
            packed=not padded,
        )
        defaults.announce(
            ctx,
            {
                "gpu": gpu,
                "gbs": f"{gbs} sequences, {CPU_TRIAL_SEQUENCES_PER_RANK} per rank for CPU trials"
                if cpu_batch
                else "",
                "precision": precision.value,
                "framework": framework.value,
            },
        )
        if opts is not None:
            raise typer.Exit(_measure(result, model, gpu, opts))
        terminal.print_view(terminal.search_view(result, top, tokens, gpu_hour_usd))
        if out is not None:
            files.write_search(result, out, tokens=tokens, gpu_hour_usd=gpu_hour_usd)
            print(f"wrote {out}/results.csv, best.json and report.html", file=sys.stderr)
    if emit is not None and result.best is not None:
        r = result.request
        print(
            exports.export(
                emit, result.best, r.model.layers, r.gbs, r.seq_len, r.precision,
                experts=r.model.num_experts, mtp=r.model.mtp_layers, task=r.task,
                gpus_per_node=r.cluster.gpus_per_node,
            )
        )  # fmt: skip
    if not result.feasible:
        sys.exit(1)


def _check_measure(opts: MeasureOptions) -> None:
    # optuna and submitit take about a second to import: only a measured search pays for them.
    from autoconfig.measure import session

    session.check_options(opts)


def _measure(result: SearchResult, model: str, gpu: str, opts: MeasureOptions) -> int:
    """The measured search and its report; the exit code (0: something was measured)."""
    # optuna and submitit take about a second to import: only a measured search pays for them.
    from autoconfig.measure import session
    from autoconfig.report.measured import measured_view

    measured = session.run(result, model, gpu, opts)
    files.write_search(result, opts.out, measured)
    terminal.print_view(measured_view(measured, 10))
    print(f"wrote {opts.out}/trials.csv, measured.csv and report.html", file=sys.stderr)
    return 0 if measured.any_ok else 1
