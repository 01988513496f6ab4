"""`autoconfig rl`: plans for RL post-training (which GPUs generate, which train, together or
apart, and what a step costs), or every published RL run of a CSV predicted with its error."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.base.fileio import csv_text, write_text
from autoconfig.cli import defaults
from autoconfig.cli.app import app
from autoconfig.cli.options import COUNT, OUT_FILE, read_csv
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
    max_response_len: int = typer.Option(4096, help="most response tokens", callback=COUNT),
    mean_response_len: float = typer.Option(
        None, help="mean response tokens (default: half the maximum)"
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
) -> None:
    """Rank RL plans (placement x rollout tp x trainer layout) by time per step, or predict
    every row of --runs with its error."""
    if runs is not None:
        given = [
            name
            for name in ("model", "gpus", "critic", "rollout_gpus", "placement")
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
        critic=critic,
        reference=reference,
        staleness=staleness,
        precision=precision.value,
        top=top,
        placement=placement,
        rollout_gpus=rollout_gpus,
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
            f"tokens/s/GPU; bottleneck: {row['bottleneck']}"
        )
    if out is not None:
        write_text(out, csv_text(plans.table))
        print(f"wrote {len(plans.table)} plans to {out}", file=sys.stderr)
