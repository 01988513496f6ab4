"""The flags every command shares, built once from autoconfig.spec.defaults (the values the
Python API and the search use too), so every --help shows the same defaults; and the line a
command prints with the defaults it used."""

from __future__ import annotations

import sys

import typer

from autoconfig.cli.options import AMOUNT, COUNT, FRACTION, MEASURE, framework_named
from autoconfig.spec import defaults, layout
from autoconfig.spec.task import DEFAULT_LORA_RANK, DEFAULT_LORA_TARGETS
from autoconfig.spec.vocab import Framework, LoraTargets, Precision, Recompute, Task

SP = "on when tp > 1"
GBS = "the batch rule: tokens per step by model size (printed)"
GPU_HELP = "GPU profile name or YAML (see `autoconfig gpus`)"


def gpu(extra: str = "") -> str:
    return typer.Option(defaults.GPU, help=f"{GPU_HELP}{extra}")


def gpu_types() -> list[str]:
    """A repeatable --gpu (plan compares types), the shared GPU by default."""
    return typer.Option([defaults.GPU], help=f"{GPU_HELP}; repeat to compare types")


def trial_gpu() -> str:
    """--gpu of a command whose measured trials may run on CPU ranks (chosen when it runs)."""
    return typer.Option(
        None,
        show_default=f"{defaults.GPU} ({defaults.CPU_TRIAL_GPU} for CPU trials)",
        help=GPU_HELP,
    )


def size(name: str, help: str = "", follows: str = "") -> int:
    """The flag of an integer layout dimension (--tp, --etp, ...): the declaration's default
    and help (autoconfig.spec.layout) unless the command says otherwise. With `follows` the
    flag has no value of its own until given; the text says what it follows then."""
    d = layout.BY_NAME[name]
    if follows:
        return typer.Option(None, show_default=follows, help=help or d.help, callback=COUNT)
    return typer.Option(d.default, help=help or d.help, callback=COUNT)


def profile() -> str:
    return typer.Option(None, help="a GPU profile YAML, e.g. from autoconfig calibrate")


def precision() -> Precision:
    return typer.Option(defaults.PRECISION, help="training precision")


def trainer_precision() -> str:
    """train's --precision: what the bundled trainer runs in (plain text: it takes auto)."""
    return typer.Option(
        defaults.PRECISION.value,
        help="bf16 or fp32; auto: bf16 on GPU, fp32 on CPU (the default on CPU)",
    )


def zero() -> int:
    return typer.Option(
        defaults.ZERO, min=0, max=3, help="0, 1 (distributed optimizer), 2, 3 (FSDP)"
    )


def recompute() -> Recompute:
    return typer.Option(defaults.RECOMPUTE, help="activation recompute")


def sp() -> bool:
    return typer.Option(
        None, "--sp/--no-sp", show_default=SP, help="sequence parallelism (with tp > 1)"
    )


def gbs() -> int:
    return typer.Option(None, show_default=GBS, help="global batch in sequences", callback=COUNT)


def framework(help: str = "the framework that runs it (what it overlaps and fuses)") -> Framework:
    return typer.Option(
        defaults.FRAMEWORK.value,
        parser=str,
        callback=framework_named,
        help=f"{help} (its name, or an alias its profile lists)",
    )


def task() -> str:
    # plain text, parsed by spec.task: a bad value is its one line and exit 2
    return typer.Option(
        Task.PRETRAIN.value,
        help=f"what the run trains: {Task.allowed()} (sft: every weight; lora, qlora: "
        "adapters on frozen 16-bit or NF4 base weights)",
    )


def lora_rank() -> str:
    # plain text, so that a bad rank is spec.task's one line naming lora-rank
    return typer.Option(
        str(DEFAULT_LORA_RANK), help="adapter rank r with --task lora/qlora (a positive integer)"
    )


def lora_targets() -> str:
    return typer.Option(
        DEFAULT_LORA_TARGETS.value,
        help=f"layers with adapters: {LoraTargets.allowed()} (all: every linear layer of a "
        "transformer layer)",
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
    return typer.Option(
        defaults.MEMORY_HEADROOM, help="fraction of GPU memory to keep free", callback=FRACTION
    )


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


def trial_memory_gib() -> float:
    return typer.Option(
        None,
        "--trial-memory-gib",
        "--trial-memory-gb",  # the name before GiB was named GiB
        help="per-rank memory cap of each trial, GiB",
        rich_help_panel=MEASURE,
        callback=AMOUNT,
    )


def doc_lengths() -> str:
    # plain text: a preset name or a file, read by spec.documents (a bad file is its one line)
    return typer.Option(
        None,
        help="document lengths of the sequences: a preset (squad: SQuAD-like ~200-token "
        "examples, an estimate) or a CSV with a 'length' column (or input_len, output_len); "
        "packed into each sequence unless --padded",
    )


def padded() -> bool:
    return typer.Option(
        False,
        help="with --doc-lengths: one document a sequence, padded to --seq-len (padding is "
        "computed but not counted as trained tokens) instead of packed",
    )
