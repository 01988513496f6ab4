"""Reads a table of runs (the reference CSV's columns, as text) into typed specs: one ModelSpec,
Hardware and layout per row, with the first error of each row ('' when fine). It only parses:
autoconfig.columns.build builds the cost inputs from what it returns.

Architecture columns stand in for the model name (a catalog name fills blank cells); blanks and
"unknown" get the documented defaults; a row that cannot be read gets its reason in `error`
while the other rows go on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import partial

import numpy as np
import pandas as pd
from pydantic import ValidationError

from autoconfig.base import checks, fileio
from autoconfig.base.errors import UserError, pydantic_message
from autoconfig.columns import frameworks
from autoconfig.columns.build import Behaviour, Hardware, training_inputs
from autoconfig.cost.inputs import CostInputs, busiest_rank_layers
from autoconfig.spec import catalog, layout
from autoconfig.spec.documents import document_columns, packed_cell
from autoconfig.spec.schema import FrameworkSpec, GPUSpec, ModelSpec
from autoconfig.spec.task import (
    DEFAULT_LORA_RANK,
    DEFAULT_LORA_TARGETS,
    check_framework,
    check_model,
    task_spec,
)
from autoconfig.spec.vocab import (
    BOOLEAN_WORDS,
    Framework,
    Mlp,
    Norm,
    Offload,
    OptimizerState,
    Position,
    Precision,
    Recompute,
    Task,
    boolean_or_none,
)

REQUIRED = ("layers", "hidden", "heads", "vocab", "seq_len", "gpu", "num_gpus", "tp", "pp", "gbs")
POSITIVE_INTS = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn_hidden",
    "vocab",
    "seq_len",
    "num_gpus",
    "gpus_per_node",
    "tp",
    "pp",
    "vp",
    "cp",
    "ep",
    "etp",
    "dp",
    "mbs",
    "gbs",
    "head_dim",
    "moe_ffn_hidden",
    "max_seq_len",
)
NONNEG_INTS = ("num_experts", "topk", "shared_experts", "recompute_layers")
UNKNOWN = {"", "unknown", "nan", "none"}
# Columns where "none" is a value a row states (no recompute, no position encoding), not a blank.
NONE_IS_STATED = {"recompute", "position"}


def left_unknown(df: pd.DataFrame, col: str) -> pd.Series:
    """Cells of `col` that leave it unknown (blank, "unknown", or "none" where that is no value)."""
    blank = UNKNOWN - {"none"} if col in NONE_IS_STATED else UNKNOWN
    return text_column(df, col).isin(blank)


ARCH_COLUMNS = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn_hidden",
    "vocab",
    "tied_embeddings",
    "norm",
    "mlp",
    "position",
    "max_seq_len",
    "num_experts",
    "topk",
    "moe_ffn_hidden",
    "shared_experts",
)

# Stand-ins for rows in error, so the vectorized model runs over every row; their predictions
# are blanked afterwards.
PLACEHOLDER_MODEL = ModelSpec(name="placeholder", layers=1, hidden=64, heads=1, vocab=256)


def text_column(df: pd.DataFrame, col: str) -> pd.Series:
    """A column as stripped lower-case text ('' where missing or blank), of Python strings:
    pandas' own string dtype compares text only up to a NUL character."""
    if col not in df:
        return pd.Series([""] * len(df), index=df.index, dtype=object)
    text = df[col].astype(object).where(df[col].notna(), "").map(str)
    return text.map(lambda cell: cell.strip().lower()).astype(object)


class Errors:
    """The first error message of each row."""

    def __init__(self, index: pd.Index) -> None:
        self.msg = pd.Series([""] * len(index), index=index, dtype=object)

    def add(self, mask: pd.Series | np.ndarray, message: str | pd.Series) -> None:
        mask = np.broadcast_to(np.asarray(mask, dtype=bool), (len(self.msg),))
        mask = pd.Series(mask, index=self.msg.index) & (self.msg == "")
        if isinstance(message, pd.Series):
            self.msg[mask] = message[mask]
        else:
            self.msg[mask] = message

    @property
    def bad(self) -> np.ndarray:
        return (self.msg != "").to_numpy()


def add_row_errors(df: pd.DataFrame, err: Errors) -> None:
    """The errors the CSV reader found in whole rows (more cells than the header), each the
    first error of its row (fileio.csv_rows; kept in attrs by index label)."""
    found = df.attrs.get(fileio.ROW_ERRORS) or {}
    messages = pd.Series(found, dtype=object).reindex(df.index)
    err.add(messages.notna().to_numpy(), messages.fillna(""))


def flag(df: pd.DataFrame, col: str, default: pd.Series | bool, err: Errors) -> pd.Series:
    """A yes-or-no column as 0/1 (blank/unknown -> default); other text is the row's error.
    Cells read as --fix and YAML read them (vocab.boolean_or_none)."""
    stated = stated_flags(df, col)
    value = pd.Series(
        np.broadcast_to(np.asarray(default, dtype=float), len(df)).copy(), index=df.index
    )
    value[stated.notna()] = stated[stated.notna()].astype(float)
    err.add(stated.isna() & ~text_column(df, col).isin(UNKNOWN), f"{col}: must be {BOOLEAN_WORDS}")
    return value


def stated_flags(df: pd.DataFrame, col: str) -> pd.Series:
    """A yes-or-no column's cells as True/False, None where a cell states neither (each
    distinct text read once)."""
    raw = text_column(df, col)
    return raw.map({text: boolean_or_none(text) for text in raw.unique()}).astype(object)


def integers(
    df: pd.DataFrame,
    err: Errors,
    required: tuple[str, ...] = REQUIRED,
    positive: tuple[str, ...] = POSITIVE_INTS,
) -> pd.DataFrame:
    """Integer columns parsed (NaN where blank), with a message per bad cell. A cell reads as
    the same text would in a flag, --fix or YAML: by checks.integer, its spellings, bounds and
    message (each distinct text read once)."""
    num: dict[str, pd.Series] = {}
    for col in (*positive, *NONNEG_INTS):
        raw = df[col] if col in df else pd.Series([np.nan] * len(df), index=df.index)
        text = raw.astype(object).where(raw.notna(), "").map(lambda cell: str(cell).strip())
        blank = text.str.lower().isin(UNKNOWN)
        if col in required:
            err.add(blank, f"{col}: required, must be a positive integer")
        low = 0 if col in NONNEG_INTS else 1
        read = partial(checks.integer, field=col, low=low)
        # A cell in error reads as blank: its row is in error already.
        num[col] = _read_cells(text[~blank], read, err).reindex(df.index)
    return pd.DataFrame(num, index=df.index)


def _read_cells(text: pd.Series, read: Callable[[str], int], err: Errors) -> pd.Series:
    """Each distinct cell of `text` read by `read` (the parser a flag, --fix or YAML uses for
    the same value): the numbers, NaN where a cell is unreadable, whose reason (the parser's
    one line) becomes the row's error."""
    found: dict[str, tuple[float, str]] = {}
    for cell in text.unique():
        try:
            found[cell] = float(read(cell)), ""
        except UserError as exc:
            found[cell] = np.nan, str(exc)
    reasons = text.map({cell: why for cell, (_, why) in found.items()}).astype(object)
    err.add(
        (reasons != "").reindex(err.msg.index, fill_value=False), reasons.reindex(err.msg.index)
    )
    return text.map({cell: number for cell, (number, _) in found.items()}).astype(float)


def model_columns_of(model: ModelSpec) -> dict[str, object]:
    """A model as the reference CSV's architecture cells (to fill a row that names it)."""
    return {
        "layers": model.layers,
        "hidden": model.hidden,
        "heads": model.heads,
        "kv_heads": model.kv,
        "head_dim": model.dhead,
        "ffn_hidden": model.ffn,
        "vocab": model.vocab,
        "tied_embeddings": "y" if model.tied_embeddings else "n",
        "norm": model.norm.value,
        "mlp": model.mlp.value,
        "position": model.position.value,
        "dropout": "y" if model.dropout else "n",
        "max_seq_len": model.max_seq_len or model.seq_len,
        "num_experts": model.num_experts,
        "topk": model.topk,
        "moe_ffn_hidden": model.expert_ffn,
        "shared_experts": model.shared_experts,
    }


def fill_from_catalog(df: pd.DataFrame) -> pd.DataFrame:
    """Blank architecture cells of rows whose `model` names a catalog model take its values."""
    if "model" not in df:
        return df
    by_name = {name.lower(): spec for name, spec in catalog.models().items()}
    names = text_column(df, "model")
    if not names.isin(by_name).any():
        return df
    known = pd.DataFrame(
        [model_columns_of(by_name[n]) if n in by_name else {} for n in names],
        index=df.index,
        columns=list(ARCH_COLUMNS),
    )
    df = df.copy()
    for col in ARCH_COLUMNS:
        blank = left_unknown(df, col) & known[col].notna()
        if blank.any():
            current = df[col].astype(object) if col in df else pd.Series("", index=df.index)
            df[col] = current.where(~blank, known[col].astype(object))
    return df


def resolved_mlp(df: pd.DataFrame, num: pd.DataFrame) -> pd.Series:
    """The `mlp` column with blanks resolved: SwiGLU when the shape says so (GQA, or an FFN
    ratio other than GPT's 4), else GELU."""
    hidden, heads, ffn = num["hidden"], num["heads"], num["ffn_hidden"]
    kv = num["kv_heads"].fillna(heads)
    mlp = text_column(df, "mlp").replace({"squared-relu": "squared_relu", "relu2": "squared_relu"})
    llama_shape = (kv < heads) | (ffn.notna() & (ffn != 4 * hidden))
    return mlp.where(mlp != "", np.where(llama_shape, Mlp.SWIGLU.value, Mlp.GELU.value))


def read_models(
    df: pd.DataFrame, num: pd.DataFrame, seq: pd.Series, err: Errors
) -> tuple[list[ModelSpec], pd.DataFrame]:
    """One ModelSpec per row from its architecture columns (defaults resolved) at sequence
    length `seq`, and the resolved mlp / norm / position columns for display."""
    hidden, heads = num["hidden"], num["heads"]
    kv = num["kv_heads"].fillna(heads)
    ffn = num["ffn_hidden"]
    # Blank norm, positions and tying follow the MLP family.
    mlp = resolved_mlp(df, num)
    err.add(~mlp.isin(Mlp.values()), f"mlp: must be {Mlp.allowed()}")
    swiglu = mlp == Mlp.SWIGLU.value
    norm = text_column(df, "norm")
    norm = norm.where(norm != "", np.where(swiglu, Norm.RMSNORM.value, Norm.LAYERNORM.value))
    err.add(~norm.isin(Norm.values()), f"norm: must be {Norm.allowed()}")
    position = text_column(df, "position")
    position = position.where(
        position != "", np.where(swiglu, Position.ROPE.value, Position.LEARNED.value)
    )
    err.add(~position.isin(Position.values()), f"position: must be {Position.allowed()}")
    tied = flag(df, "tied_embeddings", ~swiglu, err)
    dropout = flag(df, "dropout", False, err)
    err.add(num["head_dim"].isna() & (hidden % heads != 0), "heads: must divide hidden")
    err.add(heads % kv != 0, "kv_heads: must divide heads")
    experts, topk = num["num_experts"].fillna(0), num["topk"].fillna(0)
    err.add((experts > 0) & ((topk < 1) | (topk > experts)), "topk: must be in 1..num_experts")

    arch = pd.DataFrame(
        {
            "name": df["model"].astype(str) if "model" in df else "row",
            "layers": num["layers"],
            "hidden": hidden,
            "heads": heads,
            "kv_heads": kv,
            "head_dim": num["head_dim"].fillna(hidden // heads.where(heads > 0)),
            "ffn_hidden": ffn.fillna(4 * hidden),
            "vocab": num["vocab"],
            "seq_len": seq,
            "max_seq_len": np.maximum(num["max_seq_len"].fillna(seq), seq),
            "tied_embeddings": tied > 0,
            "norm": norm,
            "mlp": mlp,
            "position": position,
            "dropout": dropout > 0,
            "num_experts": experts,
            "topk": np.where(experts > 0, topk, 0),
            "moe_ffn_hidden": num["moe_ffn_hidden"].where(experts > 0),
            "shared_experts": num["shared_experts"].fillna(0),
        },
        index=df.index,
    )
    specs: list[ModelSpec] = [PLACEHOLDER_MODEL] * len(df)
    # One spec per distinct architecture (a published table repeats a few dozen many times).
    ok = ~pd.Series(err.bad, index=df.index)
    keys = pd.util.hash_pandas_object(arch[ok].astype(str), index=False)
    for _key, rows in keys.groupby(keys).groups.items():
        first = arch.loc[rows[0]]
        cells = {k: (None if pd.isna(v) else v) for k, v in first.items()}
        fields = {**cells, **{k: int(v) for k, v in cells.items() if isinstance(v, float)}}
        try:
            spec = ModelSpec(**fields)
        except ValidationError as exc:
            err.add(df.index.isin(rows), pydantic_message(exc))
            continue
        spec = _with_catalog_features(spec)
        for pos in df.index.get_indexer(rows):
            specs[pos] = spec
    resolved = pd.DataFrame({"mlp": mlp, "norm": norm, "position": position}, index=df.index)
    return specs, resolved


# What a catalog profile knows that the reference CSV has no column for.
FEATURES = (
    "mla",
    "mamba",
    "attention_layers",
    "mlp_layers",
    "dense_layers",
    "moe_every",
    "shared_expert_ffn",
    "sliding_window",
    "sliding_window_layers",
    "mtp_layers",
    "moe_latent",
)
SAME_SHAPE = ("layers", "hidden", "heads", "num_experts")


def _with_catalog_features(spec: ModelSpec) -> ModelSpec:
    """A row naming a catalog model (same layers, width, heads and experts) gets the
    architecture features its columns cannot state (latent attention, hybrid blocks, ...)."""
    known = catalog.models().get(spec.name) or {
        n.lower(): m for n, m in catalog.models().items()
    }.get(spec.name.lower())
    if known is None or any(getattr(known, f) != getattr(spec, f) for f in SAME_SHAPE):
        return spec
    return spec.model_copy(update={f: getattr(known, f) for f in FEATURES})


def read_gpus(
    df: pd.DataFrame, num: pd.DataFrame, precision: pd.Series, err: Errors
) -> list[tuple[GPUSpec, object]]:
    """(GPU, cluster) per row: a catalog name or a profile file's path, with the row's node
    size; a GPU without the row's precision is the row's error."""
    names = text_column(df, "gpu")
    fallback = next(iter(catalog.gpus().values()))
    out: list[tuple[GPUSpec, object]] = [(fallback, fallback.cluster)] * len(df)
    for name in names.unique():
        rows = (names == name).to_numpy()
        try:
            gpu = catalog.get_gpu(str(df.loc[rows, "gpu"].iloc[0]))
        except UserError as exc:
            err.add(rows, str(exc))
            continue
        unsupported = rows & ~precision.map(gpu.supports).to_numpy()
        err.add(unsupported, f"precision: {gpu.name} has no " + precision + " tensor cores")
        # A row already in error (a node size of 0, inf or 10^30) keeps the profile's node.
        nodes = num["gpus_per_node"].where(~pd.Series(err.bad, index=df.index))
        nodes = nodes.fillna(gpu.cluster.gpus_per_node)
        for node in nodes[rows].unique():
            cluster = catalog.cluster_for(gpu, int(node))
            for pos in np.flatnonzero(rows & (nodes == node).to_numpy()):
                out[pos] = (gpu, cluster)
    return out


# Row columns that state what the framework did (y/n), overriding its profile: facts about a
# run the reference tables' notes give (e.g. Megatron-Core's --tp-comm-overlap).
BEHAVIOUR_FLAGS = {
    "flash_attention": "flash_attention",
    "overlap_grad_reduce": "overlap_grad_reduce",
    "overlap_param_gather": "overlap_param_gather",
    "tp_comm_overlap": "tp_overlap",
    "p2p_overlap": "p2p_overlap",
    "cuda_graphs": "cuda_graphs",
    "fused_kernels": "fused_kernels",
    "sp_saves_gathered": "sp_saves_gathered",
    "balanced_pipeline": "balanced_split",
    "pipeline_ends_as_layers": "ends_split",
    "bf16_optimizer": "bf16_optimizer",  # DeepSpeed's (ZeRO 0/1, bf16 only: the model checks)
}
# What "unknown" may stand for in a published row, resolved to the framework's best choice.
RESOLVABLE = ("zero", "recompute", "sp", "vp", "etp")


@dataclass
class TrainingRows:
    """Typed contents of a table of training runs, one entry per row."""

    models: list[ModelSpec]
    hardware: list[Hardware]
    frameworks: list[FrameworkSpec]
    layouts: pd.DataFrame  # one column per layout dimension
    unknown: pd.DataFrame  # per RESOLVABLE dimension: the row left it unknown
    gbs: np.ndarray
    seq: np.ndarray
    behaviour: Behaviour
    errors: pd.Series  # '' or the row's first error
    resolved: pd.DataFrame  # what was estimated, defaults resolved (for display)

    def inputs(self) -> CostInputs:
        return training_inputs(
            self.models, self.hardware, self.layouts, self.gbs, self.seq, self.behaviour
        )


def read_frameworks(df: pd.DataFrame, err: Errors) -> list[FrameworkSpec]:
    """Each row's framework (its name or an alias the reference tables use; megatron where
    blank)."""
    names = text_column(df, "framework").replace({"": Framework.MEGATRON.value})
    default = catalog.get_framework(Framework.MEGATRON.value)
    out = [default] * len(df)
    for name in names.unique():
        rows = (names == name).to_numpy()
        try:
            fw = catalog.get_framework(name)
        except UserError as exc:
            err.add(rows, str(exc))
            continue
        for pos in np.flatnonzero(rows):
            out[pos] = fw
    return out


def read_behaviour(
    df: pd.DataFrame, fws: list[FrameworkSpec], precision: pd.Series, err: Errors
) -> Behaviour:
    """What each row's framework does, with the row's own y/n columns winning."""
    profiles = [frameworks.behaviour(fw, p) for fw, p in zip(fws, precision, strict=True)]
    values: dict[str, np.ndarray] = {}
    for f in fields(Behaviour):
        if f.name == "doc_classes":  # not a column: a rows table gives each row's doc_len
            continue
        values[f.name] = np.array([float(np.asarray(getattr(b, f.name))) for b in profiles])
    for col, name in BEHAVIOUR_FLAGS.items():
        if col in df:
            values[name] = flag(df, col, values[name], err).to_numpy()
    if "pipeline_ends_as_layers" in df:
        # A row that states its split keeps it, interleaved or not.
        stated = stated_flags(df, "pipeline_ends_as_layers").notna().to_numpy()
        keep = values["ends_split_to_interleave"]
        values["ends_split_to_interleave"] = np.where(stated, values["ends_split"], keep)
    return Behaviour(**values)


def read_tasks(
    df: pd.DataFrame,
    fws: list[FrameworkSpec],
    models: list[ModelSpec],
    precision: pd.Series,
    err: Errors,
) -> dict[str, np.ndarray]:
    """Each row's task columns (spec.task.TaskSpec.columns): `task` (blank: pretrain),
    `lora_rank` (blank: 16) and `lora_targets` (blank: all), each checked as the flags are
    (spec.task), and against what the row's framework runs; the first bad cell is the row's
    error."""
    texts = {c: text_column(df, c) for c in ("task", "lora_rank", "lora_targets")}
    cells = pd.DataFrame(texts, index=df.index)
    cells["lora_rank"] = cells["lora_rank"].replace({u: str(DEFAULT_LORA_RANK) for u in UNKNOWN})
    cells["lora_targets"] = cells["lora_targets"].replace(
        {u: DEFAULT_LORA_TARGETS.value for u in UNKNOWN}
    )
    cells["task"] = cells["task"].replace({u: Task.PRETRAIN.value for u in UNKNOWN})
    out = {name: np.zeros(len(df)) for name in ("task", "lora_rank", "lora_targets")}
    key = cells.astype(str).agg("|".join, axis=1)
    for text in key.unique():
        rows = (key == text).to_numpy()
        first = cells[rows].iloc[0]
        try:
            spec = task_spec(first["task"], first["lora_rank"], first["lora_targets"])
        except UserError as exc:
            err.add(rows, str(exc))
            continue
        columns = spec.columns()  # the documents come from read_documents
        for name in out:
            out[name][rows] = columns[name]
        if spec.task is Task.PRETRAIN:
            continue  # every framework pretrains every model
        for pos in np.flatnonzero(rows):
            try:
                check_framework(spec, fws[pos], str(precision.iloc[pos]))
                check_model(spec, models[pos])
            except UserError as exc:
                err.add(df.index == df.index[pos], str(exc))
    return out


def read_documents(df: pd.DataFrame, seq: pd.Series, err: Errors) -> dict[str, np.ndarray]:
    """Each row's document columns (spec.documents): `doc_lengths` (a preset such as squad,
    or a length in tokens; blank: whole sequences) at the row's seq_len, packed unless
    `packed` says n (its first word: 'y (SQuAD packed to 4096)'); a bad cell is the row's
    error."""
    out = {"doc_len": np.zeros(len(df)), "useful_share": np.ones(len(df))}
    if "doc_lengths" not in df:
        return out
    cells = text_column(df, "doc_lengths")
    packed = text_column(df, "packed") if "packed" in df else pd.Series("", index=df.index)
    for pos, (cell, pack, length) in enumerate(zip(cells, packed, seq, strict=True)):
        if cell.strip().lower() in UNKNOWN:
            continue
        try:
            cols = document_columns(cell, float(length), packed_cell(pack))
        except UserError as exc:
            err.add(df.index == df.index[pos], str(exc))
            continue
        out["doc_len"][pos], out["useful_share"][pos] = cols["doc_len"], cols["useful_share"]
    return out


def read_training_rows(df: pd.DataFrame) -> TrainingRows:
    for col in REQUIRED:
        if col not in df:
            raise UserError(f"runs: missing required column '{col}'")
    err = Errors(df.index)
    add_row_errors(df, err)
    df = fill_from_catalog(df)
    num = integers(df, err)
    models, arch = read_models(df, num, num["seq_len"], err)
    fws = read_frameworks(df, err)

    tp, pp, cp = num["tp"], num["pp"], num["cp"].fillna(1)
    vp, ep, mbs = num["vp"].fillna(1), num["ep"].fillna(1), num["mbs"].fillna(1)
    etp = num["etp"].fillna(1) if "etp" in num else pd.Series(1.0, index=df.index)
    dp = num["dp"].fillna(num["num_gpus"] / (tp * pp * cp))
    # A framework whose runs state the rank's batch, which its pipeline schedule splits into
    # micro-batches of a fixed size (torchtitan), runs that size under pipelining.
    split = pd.Series([float(fw.allows("pipeline_microbatch")) for fw in fws], index=df.index)
    mbs = mbs.where(~((pp > 1) & (split > 0)), split)
    sp = flag(df, "sp", tp > 1, err)
    zero_text = text_column(df, "zero")
    zero_dim = layout.BY_NAME["zero"]
    zero = _read_cells(zero_text[~zero_text.isin(UNKNOWN)], zero_dim.parse, err)
    zero = zero.reindex(df.index).where(~zero_text.isin(UNKNOWN), float(zero_dim.default))
    recompute = text_column(df, "recompute").replace({"": "none", "unknown": "none"})
    err.add(~recompute.isin(Recompute.values()), f"recompute: must be {Recompute.allowed()}")
    precision = text_column(df, "precision").replace({"": "bf16"})
    err.add(~precision.isin(Precision.values()), f"precision: must be {Precision.allowed()}")
    # A row that does not state its Adam state ran its framework's default, fp32: never
    # resolved to a lighter one, so published figures keep the state they were measured with.
    state = text_column(df, "optimizer_state").replace({"": "fp32", "unknown": "fp32"})
    allowed = OptimizerState.allowed()
    err.add(~state.isin(OptimizerState.values()), f"optimizer_state: must be {allowed}")
    # CPU offload: a row that does not state it ran without (published runs state it in notes)
    offload = text_column(df, "offload").replace({"": "none", "unknown": "none"})
    err.add(~offload.isin(Offload.values()), f"offload: must be {Offload.allowed()}")
    # Dynamic CP times each document class on its own (cost.hybrid_cp); a row carries its
    # documents as one attended length, so its runs are static CP.
    hybrid = flag(df, "hybrid_cp", False, err) > 0
    err.add(
        hybrid.to_numpy(),
        "hybrid_cp: a runs row gives its documents as one length; estimate dynamic context "
        "parallelism with estimate --hybrid-cp --doc-lengths",
    )
    per_stage = pd.Series(busiest_rank_layers(num["layers"], pp, vp), index=num.index)
    full = recompute == Recompute.FULL.value
    recompute_layers = num["recompute_layers"].fillna(per_stage.where(full, 0))
    moe = num["num_experts"].fillna(0) > 0
    unknown = pd.DataFrame(
        {
            "zero": zero_text.isin(UNKNOWN).to_numpy(),
            "recompute": left_unknown(df, "recompute").to_numpy(),
            "sp": text_column(df, "sp").isin(UNKNOWN).to_numpy(),
            "vp": (num["vp"].isna() & (pp > 1)).to_numpy(),
            "etp": (moe & (tp > 1) & text_column(df, "etp").eq("")).to_numpy(),
        },
        index=df.index,
    )

    layouts = pd.DataFrame(
        {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "vp": vp,
            "cp": cp,
            "ep": ep,
            "etp": etp,
            "sp": sp > 0,
            "mbs": mbs,
            "recompute": recompute,
            "recompute_layers": recompute_layers,
            "zero": zero,
            "optimizer_state": state,
            "offload": offload,
            "hybrid_cp": False,
            "activation_offload": flag(df, "activation_offload", False, err) > 0,
        },
        index=df.index,
    )
    shape = {
        "heads": num["heads"],
        "kv_heads": num["kv_heads"].fillna(num["heads"]),
        "layers": num["layers"],
        "experts": num["num_experts"].fillna(0),
        "num_gpus": num["num_gpus"],
        "gbs": num["gbs"],
        "seq": num["seq_len"],
    }
    codes = {
        **layouts,
        "recompute": recompute.map({r.value: r.code for r in Recompute}),
        "optimizer_state": state.map({s.value: s.code for s in OptimizerState}).fillna(0.0),
        "offload": offload.map({o.value: o.code for o in Offload}).fillna(0.0),
        "activation_offload": layouts["activation_offload"].astype(float),
    }
    for name, rule, bad in layout.rules({**codes, **shape}):
        err.add(bad, f"{name}: {rule}")
    for fw in {id(f): f for f in fws}.values():
        mine = np.array([f is fw for f in fws])
        for name, rule, bad in frameworks.rules(fw, {**codes, **shape}):
            # Settings the row left unknown are chosen later among what the framework runs.
            known = ~unknown[name].to_numpy() if name in unknown else True
            err.add(mine & np.asarray(bad, bool) & known, f"{name}: {rule}")
    gpus = read_gpus(df, num, precision, err)
    behaviour = read_behaviour(df, fws, precision, err)
    tasks = read_tasks(df, fws, models, precision, err)
    documents = read_documents(df, num["seq_len"].fillna(1.0), err)
    behaviour = replace(behaviour, **tasks, **documents)

    bad = err.bad
    clean = layouts.copy()
    for d in layout.DIMENSIONS:  # stand-in values where the row is in error
        clean.loc[bad | clean[d.name].isna().to_numpy(), d.name] = d.plain(d.default)
    clean = clean.astype({d.name: _dtype(d) for d in layout.DIMENSIONS})
    hardware = [
        Hardware(g, c, "bf16" if b else p)
        for (g, c), p, b in zip(gpus, precision, bad, strict=True)
    ]
    models = [PLACEHOLDER_MODEL if b else m for m, b in zip(models, bad, strict=True)]
    seq = np.where(bad, 128.0, num["seq_len"].to_numpy(float))
    gbs = np.where(bad, 1.0, num["gbs"].to_numpy(float))
    resolved = pd.concat(
        [
            layouts.assign(
                precision=precision,
                framework=[f.name for f in fws],
                flash_attention=np.asarray(behaviour.flash_attention) > 0,
                task=[Task.values()[int(code)] for code in tasks["task"]],
            ),
            arch,
        ],
        axis=1,
    )
    return TrainingRows(
        models,
        hardware,
        fws,
        clean,
        unknown & ~bad[:, None],
        gbs,
        seq,
        behaviour,
        err.msg,
        resolved,
    )


def _dtype(d: layout.Dimension) -> type:
    choices = (Recompute, OptimizerState, Offload)
    return bool if d.type is bool else (object if d.type in choices else int)


def with_predictions(rows: pd.DataFrame, preds: dict, errors: pd.Series) -> pd.DataFrame:
    """The input columns, then the prediction columns (blank on rows with an error), then
    `error`. A prediction column of the input's name replaces it."""
    preds = pd.DataFrame(preds, index=rows.index)
    preds["pred_fits"] = preds["pred_fits"].astype(object)
    preds.loc[errors != "", :] = np.nan
    extra = [c for c in preds.columns if c in rows.columns]
    out = pd.concat([rows.drop(columns=extra), preds], axis=1)
    out["error"] = errors
    return out
