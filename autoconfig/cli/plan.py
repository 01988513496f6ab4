"""`autoconfig plan`: the fewest GPUs (and the cheapest GPU type) that train a model on a
number of tokens within a deadline and/or a budget."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from autoconfig.base.errors import UserError
from autoconfig.cli import defaults
from autoconfig.cli.app import app
from autoconfig.cli.options import COUNT, OUT_FOLDER, claimed
from autoconfig.layout_search import plan as planning
from autoconfig.report import plan_view as plan_report
from autoconfig.report import terminal
from autoconfig.spec.task import task_spec
from autoconfig.spec.vocab import Framework, Precision


@app.command()
def plan(
    ctx: typer.Context,
    model: str = typer.Option(..., help="catalog name or path to a Hugging Face config.json"),
    tokens: float = typer.Option(..., help="training tokens, e.g. 15e12"),
    max_days: float = typer.Option(None, help="deadline: days of training at most"),
    budget_usd: float = typer.Option(None, help="budget: USD at most (needs --gpu-hour-usd)"),
    gpu: list[str] = defaults.gpu_types(),
    profile: str = typer.Option(None, help="a GPU profile YAML, e.g. from autoconfig calibrate"),
    gpu_hour_usd: list[float] = typer.Option(
        None, help="USD per GPU-hour: one for all --gpu, or one per --gpu in order"
    ),
    max_gpus: int = typer.Option(65536, help="largest GPU count to try", callback=COUNT),
    seq_len: int = typer.Option(
        None, help="sequence length (default: the model's)", callback=COUNT
    ),
    gbs: int = defaults.gbs(),
    precision: Precision = defaults.precision(),
    framework: Framework = defaults.framework(),
    task: str = defaults.task(),
    lora_rank: str = defaults.lora_rank(),
    lora_targets: str = defaults.lora_targets(),
    max_memory_gib: float = defaults.max_memory_gib(),
    memory_headroom: float = defaults.memory_headroom(),
    gpus_per_node: int = typer.Option(
        None, help="GPUs per node (default: the GPU's cluster)", callback=COUNT
    ),
    out: Path = typer.Option(
        None,
        help="folder for plan.html (days and cost against GPUs), held for the whole plan as "
        "search holds its --out",
        parser=str,  # the text as typed: Path('') would read as '.', hiding an empty --out
        callback=OUT_FOLDER,
    ),
) -> None:
    """The fewest GPUs that train MODEL on TOKENS within --max-days and/or --budget-usd, with the
    best layout, days, cost, GPU-hours and energy; exit 1 when nothing meets the goal. Counts
    no one would run (slower than fewer GPUs, or far below the others' MFU) are left out of the
    table and the plot, as a line under the table says."""
    goal = planning.Goal(tokens, max_days, budget_usd)
    types = tuple(gpu) if profile is None else (profile,)
    if profile is not None and not defaults.defaulted(ctx, "gpu"):
        raise UserError("profile: give --profile or --gpu, not both")
    planning.check(goal, types, tuple(gpu_hour_usd or ()), max_gpus)
    what = task_spec(task, lora_rank, lora_targets)  # a bad task is one line before planning
    # The folder is checked (OUT_FOLDER) and locked before the searches, so a bad --out or a
    # folder another run holds is refused before minutes of planning, not after.
    with claimed(out):
        print(f"planning {model} on {', '.join(types)} ...", file=sys.stderr)
        with plan_report.progress(model) as progress:
            result = planning.plan(
                model,
                goal,
                types,
                tuple(gpu_hour_usd or ()),
                max_gpus=max_gpus,
                gpus_per_node=gpus_per_node,
                progress=progress,
                seq_len=seq_len,
                gbs=gbs,
                precision=precision.value,
                framework=framework.value,
                max_memory_gib=max_memory_gib,
                memory_headroom=memory_headroom,
                task=what.task.value,
                lora_rank=what.lora_rank,
                lora_targets=what.lora_targets.value,
            )
        defaults.announce(
            ctx,
            {"gpu": ", ".join(types), "precision": precision.value, "framework": framework.value},
        )
        terminal.print_view(plan_report.plan_view(result))
        if out is not None:
            path = plan_report.write_html(result, out)
            print(f"wrote {path}", file=sys.stderr)
    if result.chosen is None:
        raise typer.Exit(1)
