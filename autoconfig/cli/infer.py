"""`autoconfig infer`: rank every way to serve a model on N GPUs within latency and throughput
budgets, or predict every row of a CSV of serving points; with --measure, generate the best
points with the bundled model."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from autoconfig import api
from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.cli import defaults
from autoconfig.cli.app import app
from autoconfig.cli.options import (
    AMOUNT,
    COUNT,
    COUNT0,
    MEASURE,
    SEED,
    SERVE,
    checked,
    claimed,
    measure_options,
    on_cpu,
    read_csv,
)
from autoconfig.report import files, serving, terminal
from autoconfig.serve import fewest as fewest_gpus
from autoconfig.serve.features import MAX_SPECULATIVE_TOKENS, MODELLED_METHODS
from autoconfig.serve.features import checked as features_checked
from autoconfig.serve.result import ServingResult
from autoconfig.serve.workload import DEFAULT_REQUESTS, MAX_REQUESTS, MIN_REQUESTS

if TYPE_CHECKING:  # optuna and submitit load only when a measured search runs
    from autoconfig.measure.session import MeasureOptions

from autoconfig.report.deploy_files import write_deploy_files
from autoconfig.report.serving_flags import launch_flags
from autoconfig.spec import engines
from autoconfig.spec.defaults import CPU_TRIAL_SERVING_PRECISION, PRECISION, gpu_for
from autoconfig.spec.vocab import (
    Batching,
    Device,
    Engine,
    Executor,
    KvPrecision,
    Objective,
    Sampler,
    ServePrecision,
)

# Simulated requests: each is a column of the simulation's [deployments x requests] arrays.
REQUESTS = checked(checks.integer, low=MIN_REQUESTS, high=MAX_REQUESTS)
SHARE = checked(checks.number, high=1.0)  # a share in (0, 1]
HIT_RATE = checked(checks.fraction)  # a share in [0, 1)
DRAFTS = checked(checks.integer, low=0, high=MAX_SPECULATIVE_TOKENS)
ACCEPTANCE = checked(checks.number, low=0.0, high=1.0, low_inclusive=True)  # in [0, 1]
FEATURES = "prefix caching and speculative decoding"


@app.command()
def infer(
    ctx: typer.Context,
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    gpu: str = defaults.trial_gpu(),
    gpus: int = typer.Option(
        None,
        help="GPUs of the deployment (with --measure: the most ranks); left out with "
        "--request-rate: the fewest GPUs that take that rate within the limits",
        callback=COUNT,
    ),
    max_gpus: int = typer.Option(
        None,
        help=f"fewest-GPU search (--gpus left out): the most GPUs tried (default "
        f"{fewest_gpus.DEFAULT_MAX_GPUS})",
        callback=COUNT,
    ),
    decode_gpu: str = typer.Option(
        None,
        help="mixed pools: the decode pool's GPU type (the prefill pool runs on --gpu); only "
        "disaggregated deployments are searched",
    ),
    decode_gpus: int = typer.Option(
        None, help="mixed pools: the most GPUs of --decode-gpu the decode pool uses", callback=COUNT
    ),
    gpu_hour_usd: list[float] = typer.Option(
        None,
        help="USD per GPU-hour: for the fewest-GPU search one for all --gpu types or one per "
        "type in order (ranks the types by cost per hour; without it, by GPU count); with "
        "--decode-gpu one for both pools or the prefill type's then the decode type's "
        "(adds requests per USD)",
        callback=AMOUNT,
    ),
    input_len: str = typer.Option(
        None, help="prompt tokens per request: N, or LOW:HIGH uniform (default: a chat turn)"
    ),
    output_len: str = typer.Option(
        None, help="generated tokens per request: N, or LOW:HIGH uniform (default: a chat turn)"
    ),
    workload: Path = typer.Option(
        None, help="CSV of requests: input_len, output_len[, arrival_s] (a trace if timed)"
    ),
    max_ttft_ms: float = typer.Option(
        None, help="time to first token, ms", rich_help_panel=SERVE, callback=AMOUNT
    ),
    max_tpot_ms: float = typer.Option(
        None, help="time per output token, ms", rich_help_panel=SERVE, callback=AMOUNT
    ),
    max_latency_ms: float = typer.Option(
        None, help="end-to-end latency of a request, ms", rich_help_panel=SERVE, callback=AMOUNT
    ),
    min_throughput: float = typer.Option(
        None, help="output tokens/s of the whole deployment", rich_help_panel=SERVE, callback=AMOUNT
    ),
    percentile: float = typer.Option(
        90.0, help="the latency limits hold for this percentile of requests", rich_help_panel=SERVE
    ),
    request_rate: float = typer.Option(
        None,
        help="requests/s the deployment must take (default: find the most)",
        rich_help_panel=SERVE,
        callback=AMOUNT,
    ),
    max_goodput: bool = typer.Option(
        False,
        help="rank by the most requests/s within the limits (the default without a rate)",
        rich_help_panel=SERVE,
    ),
    batching: Batching = typer.Option(
        Batching.CONTINUOUS, help="continuous (vLLM/SGLang/TensorRT-LLM) or static batches"
    ),
    objective: Objective = typer.Option(
        Objective.THROUGHPUT, help="static batching: throughput per GPU or end-to-end latency"
    ),
    precision: list[ServePrecision] = typer.Option(
        None,
        help="weights to try (repeatable): bf16, fp16, fp8, nvfp4, int8/int4 weight-only, fp32 "
        "(default: bf16 plus fp8/nvfp4 where the GPU has them; fp32 on CPU)",
    ),
    kv_precision: list[KvPrecision] = typer.Option(
        None,
        help="K/V-cache formats to try (repeatable; default: 16-bit, and fp8 where the GPU has it)",
    ),
    max_num_seqs: list[int] = typer.Option(
        None, help="running-batch limits to try (repeatable; default 16..512)", callback=COUNT
    ),
    max_num_batched_tokens: list[int] = typer.Option(
        None,
        help="tokens per iteration (chunked-prefill size) to try (default 2048, 8192)",
        callback=COUNT,
    ),
    kv_cache_fraction: float = typer.Option(
        0.9,
        help="share of the memory left after weights and activations given to K/V (0 < f <= 1)",
        callback=SHARE,
    ),
    disaggregation: bool = typer.Option(True, help="try separate prefill and decode pools"),
    prefix_hit_rate: float = typer.Option(
        None,
        help="share of each prompt's tokens already in the prefix cache (0 <= F < 1)",
        rich_help_panel=FEATURES,
        callback=HIT_RATE,
    ),
    speculative_tokens: int = typer.Option(
        None,
        help=f"draft tokens verified per decode step (0..{MAX_SPECULATIVE_TOKENS}; needs "
        "--acceptance-rate)",
        rich_help_panel=FEATURES,
        callback=DRAFTS,
    ),
    acceptance_rate: float = typer.Option(
        None,
        help="chance each draft token is accepted (0 <= a <= 1): a step emits "
        "(1 - a^(K+1)) / (1 - a) tokens",
        rich_help_panel=FEATURES,
        callback=ACCEPTANCE,
    ),
    speculative_method: str = typer.Option(
        None,
        help=f"the drafter: {', '.join(MODELLED_METHODS)} (default eagle; sets its cost)",
        rich_help_panel=FEATURES,
    ),
    requests: int = typer.Option(
        None,
        help=f"requests simulated per point (default {DEFAULT_REQUESTS}, "
        f"{MIN_REQUESTS}..{MAX_REQUESTS:,})",
        callback=REQUESTS,
    ),
    engine: str = typer.Option(
        "vllm",
        help="the serving engine, vllm, sglang or trtllm: its all-reduce kernels, CUDA graphs "
        "and formats (docs/engines.md)",
    ),
    emit: Engine = typer.Option(
        None,
        help="print the best deployment's launch flags; with --out (continuous batching) also "
        "write k8s.yaml (vLLM / SGLang; Dynamo for a disaggregated winner) and bench.sh",
    ),
    max_batch: int = typer.Option(
        1024, help="static batching: largest batch tried", callback=COUNT
    ),
    batch: list[int] = typer.Option(
        None, help="static batching: these batch sizes (repeatable)", callback=COUNT
    ),
    gpus_per_node: int = typer.Option(
        None, help="GPUs per node (default: the GPU's cluster)", callback=COUNT
    ),
    allow_tp_across_nodes: bool = typer.Option(False, help="let a TP group span nodes"),
    top: int = typer.Option(15, help="rows to show", callback=COUNT),
    out: str = typer.Option(
        None,
        parser=str,  # the text as typed: Path('') would read as '.', hiding an empty --out
        help="folder for results.csv, best.json, report.html (with --runs: a CSV file)",
    ),
    runs: Path = typer.Option(None, help="CSV of serving points (inference_runs.csv columns)"),
    measure: bool = typer.Option(False, help="generate with the bundled model to measure"),
    trials: int = typer.Option(
        4, help="finished trials to run", rich_help_panel=MEASURE, callback=COUNT
    ),
    sampler: Sampler = typer.Option(Sampler.MODEL, rich_help_panel=MEASURE),
    enqueue_top: int = typer.Option(3, rich_help_panel=MEASURE, callback=COUNT0),
    candidates: int = typer.Option(50, rich_help_panel=MEASURE, callback=COUNT),
    executor: Executor = typer.Option(Executor.LOCAL, rich_help_panel=MEASURE),
    device: Device = typer.Option(Device.AUTO, rich_help_panel=MEASURE),
    parallel: int = typer.Option(1, rich_help_panel=MEASURE, callback=COUNT),
    steps: int = typer.Option(
        4, help="generations per trial", rich_help_panel=MEASURE, callback=COUNT
    ),
    warmup: int = typer.Option(
        1, help="generations left out", rich_help_panel=MEASURE, callback=COUNT0
    ),
    trial_timeout_min: float = typer.Option(15.0, rich_help_panel=MEASURE, callback=AMOUNT),
    budget_gpu_hours: float = typer.Option(None, rich_help_panel=MEASURE, callback=AMOUNT),
    trial_memory_gib: float = defaults.trial_memory_gib(),
    storage: str = typer.Option(None, rich_help_panel=MEASURE),
    resume: bool = typer.Option(False, rich_help_panel=MEASURE),
    seed: int = typer.Option(0, rich_help_panel=MEASURE, callback=SEED),
    slurm_partition: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_account: str = typer.Option(None, rich_help_panel=MEASURE),
    slurm_option: list[str] = typer.Option(None, rich_help_panel=MEASURE),
    ray_address: str = typer.Option(
        None,
        help="with --executor ray: the cluster's host:port (default: RAY_ADDRESS's, else local)",
        rich_help_panel=MEASURE,
    ),
) -> None:
    """Find the best way to serve a model on N GPUs: with continuous batching, the deployment
    (tp, pp, ep, replicas, precisions, batch and token limits, or disaggregated prefill) that
    takes the most requests/s per GPU within TTFT / TPOT / latency limits at a percentile,
    from a scheduler simulation of the workload; with static batches, the most output
    tokens/s per GPU. --measure runs the best points with the bundled model."""
    engines.engine(engine)  # an unknown engine is one line naming the closest, before any work
    if out == "":  # checked before any work
        raise UserError("out: must not be empty (give a folder, or a file with --runs)")
    if resume and not measure:
        raise UserError("resume: --resume continues a measured study; it needs --measure")
    if runs is not None:
        target = checks.output_file(out, "out") if out is not None else None
        files.write_batch(api.infer_frame(read_csv(runs)), target)
        return
    folder = checks.output_folder(out, "out") if out is not None else None
    features_checked(prefix_hit_rate, speculative_tokens, acceptance_rate, speculative_method)
    if model is None:
        raise UserError("model: required (or give --runs CSV)")
    if gpus is None and request_rate is None:
        raise UserError(
            "gpus: required (or give --request-rate R to find the fewest GPUs that take it, "
            "or --runs CSV)"
        )
    fewest_mode = gpus is None
    types = tuple(t.strip() for t in gpu.split(",")) if gpu else ()
    pools = decode_gpu is not None or decode_gpus is not None
    if pools and fewest_mode:
        raise UserError(
            f"{'decode-gpu' if decode_gpu is not None else 'decode-gpus'}: mixed pools need "
            "--gpus (the prefill pool's GPUs); the fewest-GPU search takes one type per deployment"
        )
    if pools and measure:
        raise UserError("measure: mixed pools (--decode-gpu) are predicted only, not measured")
    if not fewest_mode:
        if len(types) > 1:
            raise UserError(
                "gpu: several GPU types are compared by the fewest-GPU search: leave out --gpus "
                "and give --request-rate; for a decode pool on another type give --decode-gpu"
            )
        if max_gpus:
            raise UserError("max-gpus: only for the fewest-GPU search (--gpus left out)")
        if gpu_hour_usd and not pools:
            raise UserError(
                "gpu-hour-usd: only for the fewest-GPU search (--gpus left out) or mixed pools "
                "(--decode-gpu)"
            )
    elif measure:
        raise UserError("measure: give --gpus (the fewest-GPU search is not measured)")
    elif batching is Batching.STATIC:
        raise UserError(
            "gpus: required with --batching static (the fewest-GPU search is "
            "continuous batching only)"
        )
    if max_goodput and request_rate is not None:
        raise UserError("max-goodput: give either --max-goodput or --request-rate, not both")
    cpu = on_cpu(measure, device)
    gpu = gpu or gpu_for(trials_on_cpu=cpu)
    cpu_weights = (CPU_TRIAL_SERVING_PRECISION.value,) if cpu else None
    weights = tuple(p.value for p in precision) if precision else cpu_weights
    if batching is Batching.STATIC and weights is None:
        weights = (PRECISION.value,)
    if measure and folder is None:
        if resume:
            raise UserError("out: --resume needs the --out folder of the search to continue")
        folder = Path("runs") / time.strftime("infer-%Y%m%d-%H%M%S")
    out = folder  # measure_options(locals()) reads it
    # What both searches take (the fewest-GPU one and the one at --gpus), said once.
    shared = {
        "input_len": input_len,
        "output_len": output_len,
        "workload": workload,
        "max_ttft_ms": max_ttft_ms,
        "max_tpot_ms": max_tpot_ms,
        "max_latency_ms": max_latency_ms,
        "min_throughput": min_throughput,
        "precision": weights,
        "kv_precision": tuple(k.value for k in kv_precision) if kv_precision else None,
        "gpus_per_node": gpus_per_node,
        "allow_tp_across_nodes": allow_tp_across_nodes,
        "percentile": percentile,
        "max_num_seqs": tuple(max_num_seqs or ()) or None,
        "max_num_batched_tokens": tuple(max_num_batched_tokens or ()) or None,
        "kv_cache_fraction": kv_cache_fraction,
        "disaggregation": disaggregation,
        "requests": requests,
        "seed": seed,
        "engine": engines.engine(engine).name,
        "prefix_hit_rate": prefix_hit_rate,
        "speculative_tokens": speculative_tokens,
        "acceptance_rate": acceptance_rate,
        "speculative_method": speculative_method,
    }
    if fewest_mode:
        with claimed(out):
            _fewest(
                ctx,
                model,
                types or (gpu,),
                request_rate,
                tuple(gpu_hour_usd or ()),
                max_gpus,
                out,
                top,
                emit,
                **shared,
            )
        return
    # One run at a time holds --out, as `search` does: a second is one line, exit code 2.
    with claimed(out):
        result = api.infer(
            model,
            gpus,
            gpu,
            objective=objective.value,
            max_batch=max_batch,
            batches=tuple(batch) if batch else None,
            batching=batching.value,
            request_rate=request_rate,
            decode_gpu=decode_gpu,
            decode_gpus=decode_gpus,
            gpu_hour_usd=tuple(gpu_hour_usd or ()),
            **shared,
        )
        defaults.announce(ctx, {"gpu": gpu})  # after the search: a refusal stays one line
        terminal.print_view(serving.terminal_view(result, top))
        if emit is not None and result.best is not None:
            print(launch_flags(result, emit))
        if measure:
            raise typer.Exit(_measure(result, model, gpu, measure_options(locals(), cpu)))
        if out is not None:
            serving.write(result, out)
            written = ["results.csv", "best.json", "report.html"]
            if emit is not None and result.request.batching == Batching.CONTINUOUS.value:
                written += [p.name for p in write_deploy_files(result, emit, out)]
            print(f"wrote {out}/{', '.join(written)}", file=sys.stderr)
        if not result.feasible:
            sys.exit(1)


def _fewest(
    ctx: typer.Context,
    model: str,
    types: tuple[str, ...],
    request_rate: float,
    prices: tuple[float, ...],
    max_gpus: int | None,
    out: Path | None,
    top: int,
    emit: Engine | None,
    **options: object,
) -> None:
    """The fewest-GPU search: the chosen count's deployments, the counts tried, the answer;
    exit 1 when no count up to the limit meets the limits at the rate."""
    found = api.infer_fewest_gpus(
        model,
        types,
        request_rate,
        gpu_hour_usd=prices,
        max_gpus=max_gpus,
        gpus_per_node=options.pop("gpus_per_node", None),  # type: ignore[arg-type]
        **options,
    )
    defaults.announce(ctx, {"gpu": ",".join(types)})
    terminal.print_view(serving.fewest_view(found, top))
    chosen = found.chosen.result if found.chosen is not None else None
    if emit is not None and chosen is not None:
        print(launch_flags(chosen, emit))
    if out is not None:
        serving.write_fewest(found, out)
        print(f"wrote {out}/gpu_counts.csv, results.csv, best.json, report.html", file=sys.stderr)
    if chosen is None:
        sys.exit(1)


def _measure(result: ServingResult, model: str, gpu: str, opts: MeasureOptions) -> int:
    """The measured serving trials and their report; the exit code (0: something ran)."""
    # optuna and submitit take about a second to import: only a measured search pays for them.
    from autoconfig.measure import serving as measured_serving
    from autoconfig.report.measured import measured_view

    measured = measured_serving.run(result, model, gpu, opts)
    serving.write(result, opts.out, measured)
    terminal.print_view(measured_view(measured, 10))
    print(f"wrote {opts.out}/trials.csv, measured.csv and report.html", file=sys.stderr)
    return 0 if measured.any_ok else 1
