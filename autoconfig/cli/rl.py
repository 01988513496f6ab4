"""`autoconfig rl`: plans for RL post-training (which GPUs generate, which train, together or
apart, and what a step costs), or every published RL run of a CSV predicted with its error;
`autoconfig rl-measure`: a small RL loop measured on CPU, phase by phase, against the planner's
prediction before and after fitting the CPU profile's constants."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import typer

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.base.fileio import csv_text, write_json, write_text
from autoconfig.cli import defaults
from autoconfig.cli.app import app
from autoconfig.cli.options import COUNT, COUNT0, OUT_FILE, OUT_FOLDER, SEED, claimed, read_csv
from autoconfig.spec.vocab import Precision

# The flags a batch prediction (--runs) takes; every other flag describes one job.
BATCH_FLAGS = ("runs", "out")


@app.command()
def rl(
    ctx: typer.Context,
    model: str = typer.Option(None, help="the policy: catalog name or a config.json"),
    gpus: int = typer.Option(None, help="total number of GPUs", callback=COUNT),
    gpu: str = defaults.gpu(),
    algorithm: str = typer.Option("grpo", help="grpo, dapo or ppo"),
    prompts: int = typer.Option(64, help="prompts per step", callback=COUNT),
    samples: int = typer.Option(16, help="samples (generations) per prompt"),
    prompt_len: int = typer.Option(256, help="prompt tokens", callback=COUNT),
    max_response_len: int = typer.Option(
        None,
        help="most response tokens (default 4096; with --lengths, a bound it checks)",
        callback=COUNT,
    ),
    mean_response_len: float = typer.Option(
        None, help="mean response tokens (default: half the maximum)"
    ),
    lengths: Path = typer.Option(
        None,
        help="CSV of measured response lengths (an output_len or length column): the "
        "rollout draws from them instead of the exponential",
    ),
    critic: str = typer.Option(None, help="PPO's value model (default: the policy's shape)"),
    reference: bool = typer.Option(
        True, "--reference/--no-reference", help="a KL penalty against a reference policy"
    ),
    staleness: int = typer.Option(
        1, help="steps async rollouts may lag the trainer", callback=COUNT
    ),
    precision: Precision = defaults.precision(),
    placement: str = typer.Option(None, help="only colocated, disaggregated or async plans"),
    rollout_gpus: int = typer.Option(
        None, help="GPUs that generate when the pools are separate (the rest train)"
    ),
    top: int = typer.Option(10, help="plans shown", callback=COUNT),
    runs: Path = typer.Option(
        None,
        exists=False,
        help="CSV of published RL runs (rl_runs.csv columns): predict every row's step",
    ),
    out: Path = typer.Option(
        None,
        help="CSV file to write: the plans, or with --runs every row's predictions",
        callback=OUT_FILE,
    ),
    rl_framework: str = typer.Option(
        None,
        help="nemo-rl, verl or openrlhf: the rollout engine takes that framework's default "
        "share of GPU memory (default: --emit's framework, else vLLM's own default)",
    ),
    gpu_memory_utilization: float = typer.Option(
        None, help="the rollout engine's share of each GPU's memory (0.05-1), over --rl-framework"
    ),
    gpu_hour_usd: float = typer.Option(
        None, help="USD per GPU-hour: each plan's cost of 1,000 steps"
    ),
    emit: str = typer.Option(
        None, help="nemo-rl, verl or openrlhf: print the launch line of plan --emit-rank"
    ),
    emit_rank: int = typer.Option(
        None, help="the plan --emit writes (default: the fastest the framework runs)"
    ),
) -> None:
    """Rank RL plans (placement x rollout tp x trainer layout) by time per step, or predict
    every row of --runs with its error."""
    if runs is not None:
        given = [
            name
            for name in ("model", "gpus", "critic", "rollout_gpus", "placement", "emit", "lengths")
            if ctx.params.get(name) is not None and name not in BATCH_FLAGS
        ]
        if given:
            raise UserError(
                f"runs: each row of --runs states its own job; drop --{given[0]} (or drop --runs)"
            )
        from autoconfig.rl.runs import summary_lines

        result = api.rl_frame(read_csv(runs))
        for line in summary_lines(result):
            print(line)
        if out is not None:
            write_text(out, csv_text(result))
            bad = int((result["error"] != "").sum())
            print(f"wrote {len(result)} rows to {out} ({bad} not predicted)", file=sys.stderr)
        return
    if model is None or gpus is None:
        raise UserError("rl: give --model and --gpus (or --runs CSV)")
    if emit is not None:
        from autoconfig.rl.frameworks import RLFramework

        RLFramework.parse(emit, "emit")
    plans = api.rl(
        model,
        gpus,
        gpu,
        algorithm=algorithm,
        prompts=prompts,
        samples=samples,
        prompt_len=prompt_len,
        max_response_len=max_response_len,
        mean_response_len=mean_response_len,
        lengths=lengths,
        critic=critic,
        reference=reference,
        staleness=staleness,
        precision=precision.value,
        top=top,
        placement=placement,
        rollout_gpus=rollout_gpus,
        gpu_hour_usd=gpu_hour_usd,
        framework=rl_framework if rl_framework is not None else emit,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    job = plans.job
    print(
        f"{job.model.name} on {job.gpus} x {job.gpu.name}, {job.algorithm.value}: "
        f"{job.prompts} prompts x {job.samples} samples, prompt {job.prompt_tokens} tokens, "
        f"responses {job.lengths.describe()}"
    )
    for _, row in plans.table.iterrows():
        fits = "" if row["fits"] else " [does not fit]"
        print(
            f"#{row['rank']} {row['plan']}{fits}: {row['step_s']:.1f} s/step (rollout "
            f"{row['rollout_s']:.1f}, logprob {row['logprob_s']:.1f}, update {row['update_s']:.1f}"
            + (f", critic {row['critic_s']:.1f}" if row["critic_s"] > 0 else "")
            + f", sync {row['sync_s']:.1f}, switch {row['switch_s']:.1f}); "
            f"{row['samples_per_s']:.1f} samples/s, {row['tokens_per_s_per_gpu']:,.0f} "
            f"tokens/s/GPU, {row['gpu_hours_per_1000_steps']:,.0f} GPU-hours per 1,000 steps"
            + (f" (${row['usd_per_1000_steps']:,.0f})" if "usd_per_1000_steps" in row else "")
            + f"; bottleneck: {row['bottleneck']}"
        )
    if out is not None:
        write_text(out, csv_text(plans.table))
        print(f"wrote {len(plans.table)} plans to {out}", file=sys.stderr)
    if emit is not None:
        from autoconfig.report.rl_launch import fastest_runnable, launch_line

        rank = emit_rank if emit_rank is not None else fastest_runnable(plans, emit)
        print(launch_line(plans, emit, rank))


@app.command("rl-measure")
def rl_measure(
    fit: list[str] = typer.Option(
        None,
        help="a configuration the constants are fitted on, 'prompts=4,samples=4,prompt-len=32,"
        "max-response-len=64[,mean-response-len=32][,model=tiny-gpt][,layers=4]' "
        "(repeat it; default: four tiny-llama ones)",
    ),
    held_out: list[str] = typer.Option(
        None, help="a configuration predicted but not fitted on (repeat it; default: four)"
    ),
    steps: int = typer.Option(3, help="measured RL steps per configuration", callback=COUNT),
    warmup: int = typer.Option(1, help="steps run first and left out", callback=COUNT0),
    threads: int = typer.Option(1, help="torch threads (cores) of the loop", callback=COUNT),
    seed: int = typer.Option(0, callback=SEED),
    out: Path = typer.Option(
        None, help="folder for rl_phases.csv and rl_fit.json", callback=OUT_FOLDER
    ),
) -> None:
    """Run a small GRPO loop on CPU (rollout, log-probs, update, weight sync; one process,
    colocated) for each configuration, fit the cpu-gloo profile's constants on the --fit ones
    and print every phase measured against the planner's prediction before and after."""
    from rich.console import Console
    from rich.table import Table

    from autoconfig.measure import rl_loop

    common = {"steps": steps, "warmup": warmup, "threads": threads, "seed": seed}

    def configs(given: list[str] | None, field: str, defaults: tuple) -> list:
        """The configurations of --fit or --held-out, else the defaults, with the run's
        common settings."""
        if given:
            return [rl_loop.parse_config(t, field, **common) for t in given]
        return [replace(c, **common) for c in defaults]

    fit_on = configs(fit, "fit", rl_loop.DEFAULT_FIT)
    checked = configs(held_out, "held-out", rl_loop.DEFAULT_HELD_OUT)
    console = Console(stderr=True)
    with claimed(out):
        result = rl_loop.compare(fit_on, checked, progress=lambda m: console.print(m, style="dim"))
        table = Table(title="RL loop on CPU: measured vs the planner's phases (seconds)")
        for name in ("configuration", "phase", "measured", "before", "after", "error after"):
            table.add_column(
                name, justify="left" if name in ("configuration", "phase") else "right"
            )
        for _, row in result.table.iterrows():
            tag = " (held out)" if row["held_out"] else ""
            table.add_row(
                f"{row['config']}{tag}",
                str(row["phase"]).removesuffix("_s"),
                f"{row['measured_s']:.4f}",
                f"{row['predicted_before_s']:.4f}",
                f"{row['predicted_after_s']:.4f}",
                f"{row['error_after_pct']:+.1f}%",
            )
        Console().print(table)
        print("median |error| per phase, fitted and held-out configurations, before -> after:")
        for _, row in result.summary().iterrows():
            phase = str(row["phase"]).removesuffix("_s")
            print(
                f"  {phase:8s} fitted {row['fitted_before_pct']:.1f}% "
                f"-> {row['fitted_after_pct']:.1f}%, held out {row['held_out_before_pct']:.1f}% "
                f"-> {row['held_out_after_pct']:.1f}%"
            )
        print("constants (cpu-gloo profile):")
        for line in result.fitted.lines():
            print(f"  {line}")
        if out is not None:
            write_text(out / "rl_phases.csv", csv_text(result.table))
            write_json(out / "rl_fit.json", rl_loop.report_json(result))
            print(f"wrote rl_phases.csv and rl_fit.json to {out}", file=sys.stderr)
