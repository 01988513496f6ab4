"""`autoconfig estimate`: one configuration's memory and step-time breakdown (with --compare:
where it ranks in the search over the same model, GPUs and batch), or predictions for every row
of a CSV of runs."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from autoconfig import api
from autoconfig.base.errors import UserError
from autoconfig.base.fileio import csv_text, write_text
from autoconfig.cli import defaults
from autoconfig.cli.app import app
from autoconfig.cli.options import COUNT, COUNT0, OUT_FILE, read_csv
from autoconfig.layout_search import compare as judge
from autoconfig.layout_search import run as search_run
from autoconfig.report import compare_view as compare_report
from autoconfig.report import files, terminal
from autoconfig.rows.resolve import auto_settings
from autoconfig.spec import layout
from autoconfig.spec.documents import doc_lengths as read_doc_lengths
from autoconfig.spec.vocab import Framework, Offload, OptimizerState, Precision, Recompute

# The flags a batch estimate (--runs) takes; every other flag describes one layout.
BATCH_FLAGS = ("runs", "out")
# The flags that state what each --auto setting would otherwise choose.
AUTO_FLAGS = {
    "zero": ("zero",),
    "recompute": ("recompute", "recompute_layers"),
    "sp": ("sp",),
    "vp": ("vp",),
}


@app.command()
def estimate(
    ctx: typer.Context,
    model: str = typer.Option(None, help="catalog name or path to a Hugging Face config.json"),
    gpu: str = defaults.gpu(),
    profile: str = defaults.profile(),
    gpus: int = typer.Option(None, help="total number of GPUs", callback=COUNT),
    tp: int = typer.Option(1, help="tensor-parallel degree", callback=COUNT),
    pp: int = typer.Option(1, help="pipeline stages", callback=COUNT),
    vp: int = typer.Option(
        1, help="virtual stages per pipeline rank (interleaved 1F1B)", callback=COUNT
    ),
    cp: int = typer.Option(1, help="context-parallel degree", callback=COUNT),
    ep: int = typer.Option(1, help="expert-parallel degree (MoE)", callback=COUNT),
    etp: int = defaults.size("etp"),
    dp: int = typer.Option(
        None, help="data-parallel degree (default: gpus / (tp*pp*cp))", callback=COUNT
    ),
    sp: bool = defaults.sp(),
    mbs: int = typer.Option(1, help="micro-batch size in sequences", callback=COUNT),
    gbs: int = defaults.gbs(),
    seq_len: int = typer.Option(
        None, help="sequence length (default: the model's)", callback=COUNT
    ),
    recompute: Recompute = defaults.recompute(),
    recompute_layers: int = typer.Option(
        None, help="with full recompute: layers per stage", callback=COUNT0
    ),
    zero: int = defaults.zero(),
    optimizer_state: OptimizerState = typer.Option(
        OptimizerState.FP32.value, help=layout.BY_NAME["optimizer_state"].help
    ),
    offload: Offload = typer.Option(Offload.NONE.value, help=layout.BY_NAME["offload"].help),
    hybrid_cp: bool = typer.Option(
        False, "--hybrid-cp/--no-hybrid-cp", help=layout.BY_NAME["hybrid_cp"].help
    ),
    activation_offload: bool = typer.Option(
        False,
        "--activation-offload/--no-activation-offload",
        help=layout.BY_NAME["activation_offload"].help,
    ),
    precision: Precision = defaults.precision(),
    flash: bool = typer.Option(True, "--flash/--no-flash", help="flash attention"),
    framework: Framework = defaults.framework(),
    max_memory_gib: float = defaults.max_memory_gib(),
    memory_headroom: float = defaults.memory_headroom(),
    gpus_per_node: int = typer.Option(
        None, help="GPUs per node (default: the GPU's cluster)", callback=COUNT
    ),
    auto: str = typer.Option(
        None,
        help="settings to choose as the framework would run them, the fastest that fits "
        "(comma list of zero, recompute, sp, vp)",
    ),
    task: str = defaults.task(),
    lora_rank: str = defaults.lora_rank(),
    lora_targets: str = defaults.lora_targets(),
    doc_lengths: str = defaults.doc_lengths(),
    padded: bool = defaults.padded(),
    compare: bool = typer.Option(
        False, help="rank this layout in the search over the same model, GPUs and batch"
    ),
    runs: Path = typer.Option(
        None,
        help="CSV of runs (reference columns) to estimate in batch; each row gives its own "
        "model, GPUs and layout, so no layout flag goes with it",
    ),
    out: Path = typer.Option(
        None,
        help="CSV file to write: with --runs the predictions of every row; without, this "
        "estimate as one row (its layout, predictions and breakdowns), written even when it "
        "does not fit",
        parser=str,  # the text as typed: Path('') would read as '.', hiding an empty --out
        callback=OUT_FILE,
    ),
) -> None:
    """Predict memory and step time of one configuration (or every row of --runs); exit 1 with
    the change that makes it fit when it does not."""
    if runs is not None:
        given = [n for n in ctx.params if n not in BATCH_FLAGS and not defaults.defaulted(ctx, n)]
        if given:
            flags = ", ".join(f"--{n.replace('_', '-')}" for n in given)
            raise UserError(
                f"runs: each row of --runs gives its own model, GPUs and layout; drop {flags} "
                "(or drop --runs to estimate one layout)"
            )
        files.write_batch(api.estimate_frame(read_csv(runs)), out)
        return
    if model is None or gpus is None:
        raise UserError("estimate: give --model and --gpus (or --runs CSV)")
    if profile is not None and not defaults.defaulted(ctx, "gpu"):
        raise UserError("profile: give --profile or --gpu, not both")
    gpu = profile or gpu
    # a bad lengths file is one line before any work
    docs = read_doc_lengths(doc_lengths) if doc_lengths is not None else None
    chosen_names = auto_settings(auto or "")
    for name in chosen_names:  # a setting is given or left to the framework, not both
        for flag in AUTO_FLAGS[name]:
            if not defaults.defaulted(ctx, flag):
                raise UserError(
                    f"auto: {name} is also given with --{flag.replace('_', '-')}; "
                    "give one or the other"
                )
    result = api.estimate(
        model,
        gpus,
        gpu,
        tp=tp,
        pp=pp,
        vp=vp,
        cp=cp,
        ep=ep,
        etp=etp,
        dp=dp,
        sp=sp,
        mbs=mbs,
        gbs=gbs,
        seq_len=seq_len,
        recompute=recompute.value,
        recompute_layers=recompute_layers,
        zero=zero,
        optimizer_state=optimizer_state.value,
        offload=offload.value,
        hybrid_cp=hybrid_cp,
        activation_offload=activation_offload,
        precision=precision.value,
        flash_attention=flash,
        gpus_per_node=gpus_per_node,
        framework=framework.value,
        max_memory_gib=max_memory_gib,
        memory_headroom=memory_headroom,
        auto=chosen_names,
        task=task,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        doc_lengths=docs,
        packed=not padded,
    )
    row = result.iloc[0]
    if row["auto"]:
        chosen = {
            "zero": f"zero {int(row['zero'])}",
            "recompute": f"recompute {layout.recompute_label(row)}",
            "sp": f"sp {'on' if row['sp'] else 'off'}",
            "vp": f"vp {int(row['vp'])}",
        }
        picks = ", ".join(chosen[name] for name in row["auto"].split(","))
        print(f"chosen as {framework.value} would run it: {picks}", file=sys.stderr)
    used = {
        "gpu": gpu,
        "gbs": row["gbs_rule"],
        "zero": zero,
        "sp": "on" if row["sp"] else "off",
        "recompute": recompute.value,
        "precision": precision.value,
        "framework": framework.value,
    }
    defaults.announce(ctx, {k: v for k, v in used.items() if k not in row["auto"].split(",")})
    terminal.print_view(terminal.estimate_view(row))
    if out is not None:  # before any verdict: an estimate that does not fit is written too
        write_text(out, csv_text(result))
        print(f"wrote the estimate to {out}", file=sys.stderr)
    request = search_run.make_request(
        model,
        gpus,
        gpu,
        seq_len=int(row["seq_len"]),
        gbs=int(row["gbs"]),
        precision=precision.value,
        max_memory_gib=max_memory_gib,
        memory_headroom=memory_headroom,
        gpus_per_node=gpus_per_node,
        flash_attention=flash,
        framework=framework.value,
        task=task,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        doc_lengths=docs,
        packed=not padded,
    )
    per_rank = int(row["seq_len"]) // int(row["cp"])
    if int(row["cp"]) > 1 and per_rank < request.space.min_tokens_per_cp_rank:
        # runnable, so estimated; but say why `search` and --compare would not list it
        print(
            f"note: the search leaves this layout out: cp {int(row['cp'])} leaves {per_rank} "
            f"tokens per rank, under the space's min_tokens_per_cp_rank of "
            f"{request.space.min_tokens_per_cp_rank}",
            file=sys.stderr,
        )
    if compare:
        print(f"searching {model} on {gpus} GPUs with gbs {int(row['gbs'])} ...", file=sys.stderr)
        found = search_run.run(request)
        terminal.print_view(compare_report.compare_view(judge.compare(row, found)))
    if not bool(row["pred_fits"]):
        for line in judge.fit_advice(row, request) or ["no single change makes it fit"]:
            print(line)
        raise typer.Exit(1)
