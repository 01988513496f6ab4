"""Launch settings for a chosen layout, written from each dimension's framework flags in
autoconfig.spec.layout (Megatron-LM flags, a NeMo 2.0 recipe override, a torchtitan TOML), plus the
run-level settings (batch, sequence, precision) each framework names its own way. A value a
framework cannot express is refused with a reason, never silently dropped."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import yaml

from autoconfig.base.errors import UserError
from autoconfig.columns import frameworks
from autoconfig.cost.inputs import even_split_layers, interleaves_by_counting_ends
from autoconfig.report import primus_export
from autoconfig.spec import catalog, layout
from autoconfig.spec.layout import ANY
from autoconfig.spec.task import PRETRAIN, TaskSpec
from autoconfig.spec.vocab import Framework, LoraTargets, Task

# Run-level settings, after the layout's own (formatted with the same context).
RUN_FLAGS: dict[Framework, tuple[str, ...]] = {
    Framework.MEGATRON: (
        "--global-batch-size {gbs}",
        "--seq-length {seq_len}",
        "{precision_flag}",
        "--use-flash-attn",
    ),
    Framework.NEMO: (
        "recipe.data.global_batch_size = {gbs}",
        "recipe.data.seq_length = {seq_len}",
        "{nemo_fp8}",
    ),
    Framework.TORCHTITAN: (
        "[training] local_batch_size = {local_batch}",
        "[training] global_batch_size = {gbs}",
        "[training] seq_len = {seq_len}",
        "{torchtitan_fp8}",
    ),
    Framework.DEEPSPEED: (
        "--global-batch-size {gbs}",
        "--seq-length {seq_len}",
        "--{precision}",
        "--deepspeed",
    ),
    Framework.NANOTRON: (
        "tokens.sequence_length: {seq_len}",
        "tokens.batch_accumulation_per_replica: {accumulation}",
        "model.dtype: bfloat16",
    ),
    Framework.COMPOSER: (
        "global_train_batch_size: {gbs}",
        "max_seq_len: {seq_len}",
        "precision: {composer_precision}",
    ),
    # torchtune 0.6.1 recipe configs: batch_size is per device, accumulation makes up the rest
    Framework.TORCHTUNE: (
        "batch_size={mbs}",
        "gradient_accumulation_steps={accumulation}",
        "tokenizer.max_seq_len={seq_len}",
        "dtype=bf16",
    ),
}
HEADER = {
    Framework.NEMO: "# NeMo 2.0: apply to the pretrain recipe of your model "
    "(recipe = llm.<model>.pretrain_recipe(...))",
}
YAML = (Framework.NANOTRON, Framework.COMPOSER)
# Frameworks that take another's settings, rewritten (Primus: Megatron-LM's flags as its
# experiment's overrides, report.primus_export)
DERIVED = {Framework.PRIMUS: primus_export.DERIVES_FROM}


def context(
    row: Mapping[str, Any],
    layers: int,
    gbs: int,
    seq_len: int,
    precision: str,
    experts: int = 0,
    mtp: int = 0,
) -> dict:
    """Every value a flag template may name: the layout, the run, and derived values (None
    where they do not apply, which leaves their flag out)."""
    c: dict[str, Any] = {**layout.plain(row), "layers": layers, "gbs": gbs, "seq_len": seq_len}
    # Megatron-Core sets expert_tensor_parallel_size to tp when the flag is absent
    # (ModelParallelConfig.__post_init__): an MoE layout with etp != tp must say so.
    c["megatron_etp"] = c["etp"] if experts and c["etp"] != c["tp"] else None
    pp, vp, dp, mbs = c["pp"], c["vp"], c["dp"], c["mbs"]
    # An interleaved layout that divides only with the embedding and the loss counted as a
    # layer each is split that way (cost.inputs.counts_ends); any other, evenly.
    ends = bool(interleaves_by_counting_ends(layers, pp, vp))
    uneven = pp > 1 and layers % pp and not ends
    # the split the cost model charges (cost.inputs.even_split_layers)
    last = int(even_split_layers(np.float64(layers), np.float64(pp))[1])
    c["uneven_last_stage_layers"] = last if uneven else None
    c["nemo_ends_as_layers"] = str(ends) if pp > 1 else None
    c["megatron_pipeline_layout"] = pipeline_layout(layers, pp * vp, mtp) if ends else None
    c["layers_per_virtual_stage"] = layers // (pp * vp) if vp > 1 and not ends else None
    c["layers_per_stage"] = _stage_size(layers, pp, vp)
    # Megatron-Core counts --recompute-num-layers within each model chunk (TransformerBlock
    # recomputes its own first N layers), so a rank's count splits over its vp chunks.
    c["recompute_layers_per_chunk"] = -(-c["recompute_layers"] // vp)
    c["pipeline_schedule"] = ("Interleaved1F1B" if vp > 1 else "1F1B") if pp > 1 else None
    c["pipeline_microbatch"] = mbs if pp > 1 else None
    # torchtitan: without pipelining the local batch is the micro-batch (gradient
    # accumulation makes up the global batch); with it, the rank's batch split into micro-batches
    c["local_batch"] = mbs if pp == 1 else gbs // dp
    c["accumulation"] = gbs // (dp * mbs)
    c["composer_precision"] = "amp_fp8" if precision == "fp8" else "amp_bf16"
    # Megatron-Core offloads fewer layers than the model has: all but the last
    c["offloaded_layers"] = layers - 1
    # Megatron-Core's hybrid CP rank capacity: the sequence over cp (cost.hybrid_cp)
    c["cp_rank_tokens"] = seq_len // c["cp"]
    c["dp_shard"] = dp if c["zero"] >= 2 else 1
    c["dp_replicate"] = dp // c["dp_shard"]
    c["precision"] = precision
    fp8 = precision == "fp8"
    c["precision_flag"] = "--fp8-format hybrid --bf16" if fp8 else f"--{precision}"
    c["nemo_fp8"] = "recipe.trainer.plugins = bf16_with_fp8_mixed()" if fp8 else None
    c["torchtitan_fp8"] = "[float8] enable_fsdp_float8_all_gather = true" if fp8 else None
    return c


@dataclass(frozen=True)
class Cannot:
    """A context value the layout needs but cannot have: a template naming it refuses."""

    reason: str


def _stage_size(layers: int, pp: int, vp: int) -> int | Cannot | None:
    """torchtitan's stage size in layers for an interleaved layout (frameworks.layers_per_stage);
    where none makes pp*vp stages, nothing at vp 2 (its default of 2 stages a rank applies) and
    a refusal above."""
    if vp == 1:
        return None
    per = float(frameworks.layers_per_stage(layers, pp * vp))
    if not np.isnan(per):
        return int(per)
    if vp == 2:
        return None
    return Cannot(
        f"cannot make pp*vp = {pp * vp} stages of {layers} layers: no "
        "pipeline_parallel_layers_per_stage gives that many (the embedding and the output "
        "count as a layer each); vp 2 runs without it"
    )


def pipeline_layout(layers: int, chunks: int, mtp: int = 0) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for `layers` over `chunks` model
    chunks (pp*vp, in the order the layout lists them) with the embedding (E) and the loss (L)
    counted as a layer each: every chunk (layers + 2)/chunks units, the first and the last one
    layer fewer (transformer/pipeline_parallel_layer_layout.py, megatron-core 0.16.1); `mtp`
    multi-token-prediction layers (m) sit before the loss, which Megatron-Core asks the layout
    to place. The layout states the whole split, virtual stages included."""
    per = (layers + 2) // chunks

    def run(n: int) -> str:
        return "" if n == 0 else "t" if n == 1 else f"t*{n}"

    return f"E{run(per - 1)}|({run(per)}|)*{chunks - 2}{run(per - 1)}{'m' * mtp}L"


def _templates(d: layout.Dimension, framework: Framework, value: Any) -> tuple[str, ...]:
    spec = d.flags.get(DERIVED.get(framework, framework))
    if spec is None:
        raise UserError(f"emit: {framework.value} has no setting for {d.name}")
    if isinstance(spec, str | tuple):
        chosen = spec
    else:
        key = d.plain(value)
        if key in spec:
            chosen = spec[key]
        elif ANY in spec:
            chosen = spec[ANY]
        else:
            raise UserError(f"emit: {framework.value} cannot run {d.name} {key}")
    return (chosen,) if isinstance(chosen, str) else tuple(chosen)


def refuses(framework: Framework, name: str, value: Any) -> bool:
    """Whether the framework has no setting for dimension `name` at `value`."""
    try:
        _templates(layout.BY_NAME[name], framework, value)
    except UserError:
        return True
    return False


def _render(template: str, ctx: Mapping[str, Any], framework: Framework) -> str | None:
    """The template filled in, or None when it names a value that does not apply; a value the
    layout cannot have refuses the export with its reason."""
    values = [ctx.get(f) for _, f, _, _ in string.Formatter().parse(template) if f]
    refused = next((v for v in values if isinstance(v, Cannot)), None)
    if refused is not None:
        raise UserError(f"emit: {framework.value} {refused.reason}")
    if any(v is None for v in values):
        return None
    return template.format(**ctx)


def lines(framework: Framework, row: Mapping[str, Any], ctx: Mapping[str, Any]) -> list[str]:
    """The framework's settings for the layout in `row`, filled from its `context`, one per
    line, in declaration order."""
    out: list[str] = []
    for d in layout.DIMENSIONS:
        templates = _templates(d, framework, row[d.name])
        out += [t for t in (_render(t, ctx, framework) for t in templates) if t]
    run_flags = RUN_FLAGS[DERIVED.get(framework, framework)]
    out += [t for t in (_render(t, ctx, framework) for t in run_flags) if t]
    return out


def export(
    framework: Framework | str,
    row: Mapping[str, Any],
    layers: int,
    gbs: int,
    seq_len: int,
    precision: str,
    experts: int = 0,
    mtp: int = 0,
    task: TaskSpec = PRETRAIN,
    gpus_per_node: int = 8,
) -> str:
    """The launch settings as text the framework reads, for the layout in `row` of a model of
    `layers` layers, `experts` routed experts and `mtp` multi-token-prediction layers, training
    `task` (spec.task: its fine-tuning settings follow the layout's), on nodes of
    `gpus_per_node` GPUs (where the launch line names them)."""
    framework = Framework.parse(framework, "emit")
    ctx = context(row, layers, gbs, seq_len, precision, experts, mtp)
    settings = lines(framework, row, ctx) + task_settings(DERIVED.get(framework, framework), task)
    if framework is Framework.PRIMUS:
        gpus = int(np.prod([ctx[k] for k in ("dp", "tp", "pp", "cp")]))
        profile = catalog.get_framework(framework.value)
        return primus_export.experiment(settings, profile, precision, gpus, gpus_per_node)
    if framework is Framework.NEMO:
        header = HEADER[framework] if task.task is Task.PRETRAIN else NEMO_FINETUNE_HEADER
        return "\n".join([header, *settings])
    if framework is Framework.TORCHTITAN:
        return "\n".join([*task_comments(framework, task), _toml(settings)])
    if framework in YAML:
        return _yaml(settings)
    if framework is Framework.DEEPSPEED:
        return "\n".join([*task_comments(framework, task), " \\\n  ".join(settings)])
    if framework is Framework.TORCHTUNE:
        return torchtune_command(row, task, settings, gpus_per_node)
    return " \\\n  ".join(settings)


# -- the task ------------------------------------------------------------------------------------

NEMO_FINETUNE_HEADER = (
    "# NeMo 2.0: apply to the finetune recipe of your model "
    "(recipe = llm.<model>.finetune_recipe(...); nemo-toolkit 2.7.3, megatron-bridge 0.3.1)"
)

# The adapted linear layers as each framework names them, by --lora-targets (the MLP and Mamba
# projections join with `all`):
# - NeMo 2 / Megatron-Bridge: megatron-bridge 0.3.1 peft/lora.py (target_modules default
#   linear_qkv, linear_proj, linear_fc1, linear_fc2);
# - torchtitan 0.3.0 components/lora.py (the last segment of each Linear's name: wq, wk, wv,
#   wo, w1, w2, w3 in its Llama models);
# - torchtune 0.6.1 (lora_attn_modules q_proj, k_proj, v_proj, output_proj; apply_lora_to_mlp
#   for w1, w2, w3);
# - Hugging Face PEFT LoraConfig (Llama-style q_proj, k_proj, v_proj, o_proj, gate_proj,
#   up_proj, down_proj).
TARGET_NAMES: dict[str, dict[LoraTargets, tuple[str, ...]]] = {
    "nemo": {
        LoraTargets.QKV: ("linear_qkv",),
        LoraTargets.ATTENTION: ("linear_qkv", "linear_proj"),
        LoraTargets.ALL: ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"),
    },
    "torchtitan": {
        LoraTargets.QKV: ("wq", "wk", "wv"),
        LoraTargets.ATTENTION: ("wq", "wk", "wv", "wo"),
        LoraTargets.ALL: ("wq", "wk", "wv", "wo", "w1", "w2", "w3"),
    },
    "torchtune": {
        LoraTargets.QKV: ("q_proj", "k_proj", "v_proj"),
        LoraTargets.ATTENTION: ("q_proj", "k_proj", "v_proj", "output_proj"),
        LoraTargets.ALL: ("q_proj", "k_proj", "v_proj", "output_proj"),
    },
    "peft": {
        LoraTargets.QKV: ("q_proj", "k_proj", "v_proj"),
        LoraTargets.ATTENTION: ("q_proj", "k_proj", "v_proj", "o_proj"),
        LoraTargets.ALL: (
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ),
    },
}


def _names(kind: str, task: TaskSpec) -> str:
    return "[" + ", ".join(f"'{n}'" for n in TARGET_NAMES[kind][task.lora_targets]) + "]"


def task_settings(framework: Framework, task: TaskSpec) -> list[str]:
    """The task's settings among the framework's own lines (none for pretraining): full
    fine-tuning from a checkpoint, or the LoRA adapters. A task the framework cannot run was
    refused before (spec.task.check_framework)."""
    if task.task is Task.PRETRAIN:
        return []
    if framework is Framework.NEMO:
        if not task.adapters:
            return ["recipe.peft = None  # full fine-tuning: finetune_recipe(peft_scheme=None)"]
        # alpha = 2r, as the recipes pair them (torchtune, NeMo AutoModel: dim 16, alpha 32)
        return [
            f"recipe.peft = llm.peft.LoRA(target_modules={_names('nemo', task)}, "
            f"dim={task.lora_rank}, alpha={2 * task.lora_rank})"
        ]
    if framework is Framework.MEGATRON:
        # Megatron-LM arguments.py: --finetune loads the weights without optimizer state or step
        return ["--finetune"]
    return []


def task_comments(framework: Framework, task: TaskSpec) -> list[str]:
    """Comment lines with the adapters' settings where the framework sets them in code or in a
    library beside it (torchtitan's model converters, Hugging Face PEFT under DeepSpeed), and
    the same run as a torchtune recipe."""
    if not task.adapters:
        return []
    r, alpha = task.lora_rank, 2 * task.lora_rank
    out: list[str] = []
    if framework is Framework.TORCHTITAN:
        out.append(
            "# LoRA (torchtitan 0.3.0 components/lora.py): add to the trainer config's model "
            f"converters LoRAConverter.Config(rank={r}, alpha={alpha}.0, "
            f"target_modules={_names('torchtitan', task)})"
        )
    if framework is Framework.DEEPSPEED:
        quant = (
            ", with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
            "bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)"
            if task.task is Task.QLORA
            else ""
        )
        out.append(
            f"# Hugging Face PEFT (peft 0.17): LoraConfig(r={r}, lora_alpha={alpha}, "
            f"target_modules={_names('peft', task)}){quant}"
        )
    out.append("# the same run in torchtune 0.6.1: " + torchtune_recipe(task))
    return out


def torchtune_recipe(task: TaskSpec) -> str:
    """The torchtune 0.6.1 recipe and overrides of a fine-tuning task: its distributed LoRA or
    full recipe (QLoRA runs in the LoRA recipe with a qlora_* model builder) with the adapters'
    rank and targets."""
    if not task.adapters:
        return "tune run --nproc_per_node <gpus> full_finetune_distributed --config <model>_full"
    recipe = "lora_finetune_distributed"
    builder = "qlora" if task.task is Task.QLORA else "lora"
    mlp = task.lora_targets is LoraTargets.ALL
    return (
        f"tune run --nproc_per_node <gpus> {recipe} --config <model>_{builder} "
        f"model.lora_rank={task.lora_rank} model.lora_alpha={2 * task.lora_rank} "
        f"model.lora_attn_modules={_names('torchtune', task)} "
        f"model.apply_lora_to_mlp={mlp}"
    )


def torchtune_command(
    row: Mapping[str, Any], task: TaskSpec, settings: list[str], gpus_per_node: int = 8
) -> str:
    """`tune run` with the recipe the task and GPU count need (torchtune 0.6.1: the
    single-device recipes on one GPU, else the FSDP2 distributed ones; QLoRA is the LoRA recipe
    with a qlora_* model builder), on as many nodes of `gpus_per_node` as the GPUs fill (tune
    run passes --nnodes and --nproc_per_node to torchrun), with the layout's overrides."""
    gpus = int(layout.plain(row)["dp"])
    if gpus > 1 and int(layout.plain(row)["zero"]) == 0:
        raise UserError(
            "emit: torchtune shards every multi-GPU run with FSDP2 (zero 2 or 3); zero 0 runs "
            "on one GPU only"
        )
    kind = "lora" if task.adapters else "full_finetune"
    where = "single_device" if gpus == 1 else "distributed"
    recipe = f"{kind}_finetune_{where}" if task.adapters else f"{kind}_{where}"
    builder = {Task.QLORA: "qlora", Task.LORA: "lora"}.get(task.task, "full")
    config = f"<model>_{builder}" + ("_single_device" if gpus == 1 else "")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise UserError(
            f"emit: {gpus} GPUs do not fill whole nodes of {gpus_per_node}; torchtune starts "
            "the same number of ranks on every node"
        )
    nodes, per_node = (gpus // gpus_per_node, gpus_per_node) if gpus > gpus_per_node else (1, gpus)
    where_run = (
        f"--nnodes {nodes} --nproc_per_node {per_node}"
        if nodes > 1
        else (f"--nproc_per_node {per_node}")
    )
    launch = f"tune run {where_run} {recipe}" if gpus > 1 else f"tune run {recipe}"
    overrides = list(settings)
    if "fsdp_cpu_offload=True" in overrides:
        # the host step the cost model times is a fused AdamW; 70B_full.yaml ships fused False
        overrides.append("optimizer.fused=True")
    if task.adapters:
        overrides += [
            f"model.lora_rank={task.lora_rank}",
            f"model.lora_alpha={2 * task.lora_rank}",
            f'model.lora_attn_modules="{_names("torchtune", task)}"',
            f"model.apply_lora_to_mlp={task.lora_targets is LoraTargets.ALL}",
        ]
    return " \\\n  ".join([f"{launch} --config {config}", *overrides])


def _toml(settings: list[str]) -> str:
    """torchtitan's TOML: lines without a section go to [parallelism]; '[section] line' lines
    to their section."""
    sections: dict[str, list[str]] = {"parallelism": []}
    for line in settings:
        if line.startswith("["):
            name, _, rest = line[1:].partition("] ")
            for part in rest.split("\n"):
                sections.setdefault(name, []).append(part)
        else:
            sections["parallelism"].append(line)
    return "\n\n".join(f"[{name}]\n" + "\n".join(body) for name, body in sections.items())


def _yaml(settings: list[str]) -> str:
    """'section.key: value' lines as nested YAML, sections in first-seen order."""
    tree: dict = {}
    for line in settings:
        path, _, value = line.partition(": ")
        node = tree
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return yaml.safe_dump(tree, sort_keys=False).rstrip()
