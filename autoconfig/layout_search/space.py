"""Candidate enumeration: every combination of the search space's dimension values as columns,
with the reason each invalid combination is dropped (the layout rules of autoconfig.spec.layout plus
the search's own policies), and no per-candidate Python loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from pydantic import ValidationError

from autoconfig.base import checks, resources
from autoconfig.base.errors import UserError, pydantic_message
from autoconfig.columns import frameworks
from autoconfig.cost.inputs import busiest_rank_layers, interleaves_by_counting_ends
from autoconfig.spec import layout
from autoconfig.spec.catalog import read_yaml
from autoconfig.spec.schema import FrameworkSpec, ModelSpec, SearchSpace
from autoconfig.spec.vocab import Offload, OptimizerState, Recompute

STRUCTURE = tuple(d for d in layout.SEARCHED if d.structural)
SETTINGS = tuple(d for d in layout.SEARCHED if not d.structural)
# Layouts the second pass crosses (the structures that pass the layout rules times the
# settings): the default space crosses at most about 250,000; 2^21 rows take about 3 s and
# 0.5 GB on two cores, and the limit is checked before any of them is built.
MAX_CROSSED_LAYOUTS = 2**21


def load_space(path: Path | None = None) -> SearchSpace:
    """The default space, with the keys of a user file (if any) replacing the defaults."""
    values = read_yaml(resources.search_space("default"))
    if path is not None:
        # read_yaml's text-file check: the name first, then a regular file of at most
        # catalog.MAX_YAML_BYTES (a folder, a pipe or /dev/zero is refused before reading)
        path = checks.path_name(path, "space")
        user = read_yaml(path, "space")
        lines = path.read_text(errors="replace").splitlines()
        for key in user:
            if key not in SearchSpace.model_fields:
                line = next(
                    (i + 1 for i, s in enumerate(lines) if s.lstrip().startswith(f"{key}:")), 0
                )
                allowed = ", ".join(SearchSpace.model_fields)
                raise UserError(
                    f"space: {path} line {line}: unknown key '{key}' (allowed: {allowed})"
                )
        values.update(user)
    try:
        return SearchSpace(**values)
    except (ValidationError, UserError) as exc:
        where = f"space: {path}: " if path else "space: "
        message = pydantic_message(exc) if isinstance(exc, ValidationError) else str(exc)
        raise UserError(where + message) from None
    except yaml.YAMLError as exc:  # pragma: no cover - read_yaml reports these
        raise UserError(f"space: {exc}") from None


@dataclass(frozen=True)
class Candidates:
    """Valid layouts as columns (one per layout dimension), plus how many combinations each
    rule dropped."""

    table: pd.DataFrame
    enumerated: int
    dropped: dict[str, int]
    left_out: dict[str, int]  # valid layouts the framework cannot run, by reason


def _grid(*axes: np.ndarray) -> list[np.ndarray]:
    return [g.ravel() for g in np.meshgrid(*axes, indexing="ij")]


def _apply(
    rules: list[tuple[str, np.ndarray]], weight: float, dropped: dict[str, int]
) -> np.ndarray:
    """Mask of rows passing every rule; each rule's count (times `weight`) goes to `dropped`
    for the rows it is the first to reject."""
    keep = np.ones(len(rules[0][1]), bool)
    for reason, bad in rules:
        hit = keep & np.broadcast_to(bad, keep.shape)
        if hit.any():
            dropped[reason] = dropped.get(reason, 0) + int(hit.sum() * weight)
        keep &= ~hit
    return keep


def _values(d: layout.Dimension, space: SearchSpace) -> np.ndarray:
    return d.code(getattr(space, d.name))


def enumerate_candidates(
    model: ModelSpec,
    gpus: int,
    gbs: int,
    seq_len: int,
    space: SearchSpace,
    gpus_per_node: int,
    framework: FrameworkSpec,
) -> Candidates:
    """Every combination of the space's values for `gpus` GPUs that obeys the layout rules,
    the search's policies and what `framework` can run.

    Two passes keep this cheap: the structural dimensions (tp, pp, vp, cp, ep) are filtered
    first, and only the survivors are crossed with the other searched dimensions; recompute
    'full' is expanded by the space's fractions of each stage's layers."""
    axes = {d.name: _values(d, space) for d in STRUCTURE}
    if not space.allow_tp_across_nodes:
        axes["tp"] = axes["tp"][axes["tp"] <= gpus_per_node]
    if not model.is_moe:
        axes["ep"] = axes["etp"] = np.array([1.0])
    full = Recompute.FULL.code
    recompute_options = [
        (code, frac)
        for code in _values(layout.BY_NAME["recompute"], space)
        for frac in (space.full_layers if code == full else [0.0])
    ]
    setting_axes = [
        np.arange(len(recompute_options), dtype=float)
        if d.name == "recompute"
        else _values(d, space)
        for d in SETTINGS
    ]
    per_structure = int(np.prod([len(a) for a in setting_axes]))
    structure = dict(zip(axes, _grid(*axes.values()), strict=True))
    enumerated = len(structure["tp"]) * per_structure
    dropped: dict[str, int] = {}
    shape = {
        "heads": float(model.heads),
        "kv_heads": float(model.kv),
        "layers": float(model.layers),
        "experts": float(model.num_experts),
        "num_gpus": float(gpus),
        "seq": float(seq_len),
    }
    layers = float(model.layers)
    count_ends = frameworks.counts_ends_to_interleave(framework)
    defaults = {d.name: d.code(d.default) for d in layout.DIMENSIONS}
    with np.errstate(all="ignore"):
        s = structure
        dp = gpus / (s["tp"] * s["pp"] * s["cp"])
        # The structural rules, with every other dimension at its default (and a batch that dp
        # divides, so the batch rule waits for the second pass).
        first = {**defaults, **s, "dp": dp, **shape, "gbs": dp}
        keep = _apply(
            [(f"{n}: {r}", bad) for n, r, bad in layout.rules(first)]
            + _structure_policies(s, layers, seq_len, space, count_ends)
            + mlp_split_rule(s, model),
            per_structure,
            dropped,
        )
    idx = np.flatnonzero(keep)
    crossed = len(idx) * per_structure
    if crossed > MAX_CROSSED_LAYOUTS:
        names = ", ".join(d.name for d in SETTINGS)
        raise UserError(
            f"space: {len(idx):,} structures pass the layout rules, times {per_structure:,} "
            f"settings ({names}) makes {crossed:,} layouts, more than the "
            f"{MAX_CROSSED_LAYOUTS:,} one search crosses; give fewer values"
        )
    grid = _grid(idx.astype(float), *setting_axes)
    rows = grid[0].astype(int)
    cols: dict[str, np.ndarray] = {name: values[rows] for name, values in structure.items()}
    cols["dp"] = dp[rows]
    for d, values in zip(SETTINGS, grid[1:], strict=True):
        cols[d.name] = values
    options = np.array(recompute_options, float).reshape(-1, 2)
    ridx = cols["recompute"].astype(int)
    cols["recompute"], frac = options[ridx, 0], options[ridx, 1]
    per_stage = busiest_rank_layers(layers, cols["pp"], cols["vp"])
    cols["recompute_layers"] = np.where(
        cols["recompute"] == full, partial_layers(frac, per_stage, cols["vp"]), 0.0
    )
    left_out: dict[str, int] = {}
    with np.errstate(all="ignore"):
        c = {**defaults, **cols, **shape, "gbs": float(gbs)}
        keep = _apply(
            [(f"{n}: {r}", bad) for n, r, bad in layout.rules(c)]
            + _setting_policies(c, frac, per_stage),
            1.0,
            dropped,
        )
        can = _apply(
            [(f"{n}: {r}", bad) for n, r, bad in frameworks.rules(framework, c)], 1.0, left_out
        )
        keep &= can
    # a dimension the search derives later (optimizer_state, offload: layout_search.run) starts
    # at its default
    size = len(keep)
    cols |= {n: np.full(size, v) for n, v in defaults.items() if n not in cols}
    table = pd.DataFrame({d.name: _typed(d, cols[d.name][keep]) for d in layout.DIMENSIONS})
    return Candidates(table.drop_duplicates(ignore_index=True), enumerated, dropped, left_out)


def _structure_policies(
    s: dict[str, np.ndarray], layers: float, seq_len: int, space: SearchSpace, count_ends: bool
) -> list[tuple[str, np.ndarray]]:
    """What the search leaves out although a framework might run it. Interleaved layouts
    need pp*vp equal chunks: of the layers, or where the framework can count the embedding
    and the head as a layer each, of layers + 2 (inputs.interleaves_by_counting_ends)."""
    pp, vp, cp = s["pp"], s["vp"], s["cp"]
    by_ends = interleaves_by_counting_ends(layers, pp, vp) & count_ends
    return [
        (
            "pp*vp does not divide layers",
            ((layers % (pp * vp)) != 0) & ((vp > 1) | (not space.uneven_pipeline)) & ~by_ends,
        ),
        (
            "cp leaves too few tokens per rank",
            (cp > 1) & (seq_len / cp < space.min_tokens_per_cp_rank),
        ),
    ]


def mlp_split_rule(s: dict[str, np.ndarray], model: ModelSpec) -> list[tuple[str, np.ndarray]]:
    """Tensor parallelism splits each MLP's width in equal shares: Megatron-LM asserts it
    (ffn_hidden_size divisible by tp, expert widths by etp) and torch's sharded matmuls
    cannot run unequal shares, so no framework, the bundled trainer included, runs the rest."""
    bad = np.zeros(len(s["tp"]), bool)
    dense_mlp = not model.is_moe or model.dense_layers > 0
    if dense_mlp:
        bad |= model.ffn % s["tp"] != 0
    if model.is_moe:
        bad |= model.expert_ffn % s["etp"] != 0
    return [("tp does not divide the MLP width", bad)]


def _setting_policies(
    c: dict[str, object], frac: np.ndarray, per_stage: np.ndarray
) -> list[tuple[str, np.ndarray]]:
    dp, cp = np.asarray(c["dp"]), np.asarray(c["cp"])
    zero, recompute = np.asarray(c["zero"]), np.asarray(c["recompute"])
    return [
        ("zero sharding without dp", (zero > 0) & (dp * cp == 1)),
        (
            "same as full recompute of every layer",
            (recompute == Recompute.FULL.code)
            & (frac < 1)
            & (partial_layers(frac, per_stage, np.asarray(c["vp"])) >= per_stage),
        ),
    ]


def partial_layers(frac: np.ndarray, per_stage: np.ndarray, vp: np.ndarray) -> np.ndarray:
    """Layers per stage that full recompute of a fraction `frac` of them covers: a whole
    number of layers in each of the stage's vp chunks, since Megatron-Core counts
    --recompute-num-layers within each model chunk; never more than the stage holds (an
    interleaved split counting the embedding and the head leaves some chunks a layer short)."""
    vp = np.maximum(vp, 1.0)
    return np.minimum(np.ceil(frac * per_stage / vp) * vp, per_stage)


def _typed(d: layout.Dimension, values: np.ndarray) -> np.ndarray:
    """A dimension's column in its plain type: ints, bools, or the choice's value."""
    if d.type is bool:
        return values > 0
    if d.type in (Recompute, OptimizerState, Offload):
        names = np.empty(len(d.type), dtype=object)
        for r in d.type:
            names[r.code] = r.value
        return names[values.astype(int)]
    return values.astype(int)
