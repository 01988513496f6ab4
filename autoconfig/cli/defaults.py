"""The defaults every command shares, declared once: each command's flags take them from here
(so every --help shows the same values), and a command prints the ones it used."""

from __future__ import annotations

import sys

import typer

from autoconfig.cli.options import AMOUNT, COUNT, FRACTION, framework_named
from autoconfig.spec.vocab import Framework, Precision, Recompute, ZeroStage

GPU = "h100-sxm-80gb"
PRECISION = Precision.BF16
ZERO = int(ZeroStage.OPTIMIZER)
RECOMPUTE = Recompute.NONE
FRAMEWORK = Framework.MEGATRON
SP = "on when tp > 1"
GBS = "the batch rule: tokens per step by model size (printed)"


def gpu(extra: str = "") -> str:
    return typer.Option(GPU, help=f"GPU profile name or YAML (see `autoconfig gpus`){extra}")


def profile() -> str:
    return typer.Option(None, help="a GPU profile YAML, e.g. from autoconfig calibrate")


def precision() -> Precision:
    return typer.Option(PRECISION, help="training precision")


def zero() -> int:
    return typer.Option(ZERO, min=0, max=3, help="0, 1 (distributed optimizer), 2, 3 (FSDP)")


def recompute() -> Recompute:
    return typer.Option(RECOMPUTE, help="activation recompute")


def sp() -> bool:
    return typer.Option(
        None, "--sp/--no-sp", show_default=SP, help="sequence parallelism (with tp > 1)"
    )


def gbs() -> int:
    return typer.Option(None, show_default=GBS, help="global batch in sequences", callback=COUNT)


def framework(help: str = "the framework that runs it (what it overlaps and fuses)") -> Framework:
    return typer.Option(
        FRAMEWORK.value,
        parser=str,
        callback=framework_named,
        help=f"{help} (its name, or an alias its profile lists)",
    )


def max_memory_gib() -> float:
    # --max-memory-gb is the name before every GiB was named GiB; old scripts keep working.
    return typer.Option(
        None,
        "--max-memory-gib",
        "--max-memory-gb",
        help="per-GPU memory limit, GiB (2^30 bytes)",
        callback=AMOUNT,
    )


def memory_headroom() -> float:
    return typer.Option(0.0, help="fraction of GPU memory to keep free", callback=FRACTION)


def defaulted(ctx: typer.Context, name: str) -> bool:
    """Whether the command's flag `name` took its default (it was not given)."""
    source = ctx.get_parameter_source(name)  # typer may bring its own click: compare names
    return source is None or source.name in ("DEFAULT", "DEFAULT_MAP")


def announce(ctx: typer.Context, values: dict[str, object]) -> None:
    """One stderr line with the defaults this run used (the flags not given)."""
    used = [
        f"{k.replace('_', '-')} {v}" for k, v in values.items() if v != "" and defaulted(ctx, k)
    ]
    if used:
        print(f"defaults (a flag changes each): {', '.join(used)}", file=sys.stderr)
