"""Candidate enumeration: every combination of the search space as columns, with the reason
each invalid combination is dropped (divisibility rules) — no per-candidate Python loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from pydantic import ValidationError

from autoconfig.errors import UserError, pydantic_message
from autoconfig.specs import ModelSpec, SearchSpace

SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
LAYOUT_COLUMNS = (
    "dp",
    "tp",
    "pp",
    "vp",
    "cp",
    "ep",
    "sp",
    "mbs",
    "recompute",
    "recompute_layers",
    "zero",
)
RECOMPUTE_NAMES = np.array(["none", "selective", "full"])


def load_space(path: Path | None = None) -> SearchSpace:
    """The default space, with the keys of a user file (if any) replacing the defaults."""
    default = yaml.safe_load((SPACES_DIR / "default.yaml").read_text())
    if path is not None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise UserError(f"space: no such file '{path}'") from None
        try:
            user = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark else ""
            raise UserError(
                f"space: {path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})"
            ) from None
        if not isinstance(user, dict):
            raise UserError(f"space: {path}: expected a mapping of search dimensions")
        lines = text.splitlines()
        for key in user:
            if key not in SearchSpace.model_fields:
                line = next(
                    (i + 1 for i, s in enumerate(lines) if s.lstrip().startswith(f"{key}:")), 0
                )
                allowed = ", ".join(SearchSpace.model_fields)
                raise UserError(
                    f"space: {path} line {line}: unknown key '{key}' (allowed: {allowed})"
                )
        default.update(user)
    try:
        return SearchSpace(**default)
    except ValidationError as exc:
        where = f"space: {path}: " if path else "space: "
        raise UserError(pydantic_message(exc, where)) from None


@dataclass(frozen=True)
class Candidates:
    """Valid layouts as columns, plus how many combinations each rule dropped."""

    table: pd.DataFrame
    enumerated: int
    dropped: dict[str, int]


def enumerate_candidates(
    model: ModelSpec, gpus: int, gbs: int, seq_len: int, space: SearchSpace, gpus_per_node: int
) -> Candidates:
    """Every combination of the space's values for `gpus` GPUs that obeys the layout rules."""
    tps = [t for t in space.tp if space.allow_tp_across_nodes or t <= gpus_per_node]
    recompute_opts = [
        (r, f) for r in space.recompute for f in (space.full_layers if r == "full" else [0.0])
    ]
    eps = space.ep if model.is_moe else [1]
    axes = [
        np.array(tps, float),
        np.array(space.pp, float),
        np.array(space.vp, float),
        np.array(space.cp, float),
        np.array(eps, float),
        np.array(space.mbs, float),
        np.array([float(s) for s in space.sp]),
        np.arange(len(recompute_opts), dtype=float),
        np.array(space.zero, float),
    ]
    grids = np.meshgrid(*axes, indexing="ij")
    tp, pp, vp, cp, ep, mbs, sp, ridx, zero = (g.ravel() for g in grids)
    sp = np.where(tp > 1, sp, 0.0)
    enumerated = tp.size

    dp = gpus / (tp * pp * cp)
    layers = float(model.layers)
    with np.errstate(all="ignore"):
        return _filter(
            model,
            gbs,
            seq_len,
            space.min_tokens_per_cp_rank,
            space.uneven_pipeline,
            recompute_opts,
            tp,
            pp,
            vp,
            cp,
            ep,
            mbs,
            sp,
            ridx,
            zero,
            dp,
            layers,
            enumerated,
        )


def _filter(
    model,
    gbs,
    seq_len,
    min_cp_tokens,
    uneven,
    recompute_opts,
    tp,
    pp,
    vp,
    cp,
    ep,
    mbs,
    sp,
    ridx,
    zero,
    dp,
    layers,
    enumerated,
) -> Candidates:
    rec_code = np.array([{"none": 0, "selective": 1, "full": 2}[r] for r, _ in recompute_opts])
    rec_frac = np.array([f for _, f in recompute_opts])
    recompute = rec_code[ridx.astype(int)]
    per_stage = np.ceil(layers / pp)
    frac = rec_frac[ridx.astype(int)]
    m = gbs / (np.maximum(np.floor(dp), 1) * mbs)
    rules = [
        (
            "tp does not divide heads/kv_heads",
            (model.heads % tp != 0) | ((model.kv % tp != 0) & (tp % model.kv != 0)),
        ),
        ("tp*pp*cp does not divide the GPU count", dp != np.floor(dp)),
        ("pp exceeds layers", pp > layers),
        ("pp*vp does not divide layers", ((layers % (pp * vp)) != 0) & ((vp > 1) | (not uneven))),
        ("vp needs pp > 1", (vp > 1) & (pp == 1)),
        ("gbs not divisible by dp*mbs", (gbs % (np.floor(dp) * mbs) != 0) | (dp < 1)),
        ("interleaving needs micro-batches divisible by pp", (vp > 1) & (m % pp != 0)),
        ("cp does not divide seq_len/2", (seq_len % (2 * cp) != 0) & (cp > 1)),
        ("cp leaves too few tokens per rank", (cp > 1) & (seq_len / cp < min_cp_tokens)),
        (
            "ep does not divide experts or dp*cp",
            (model.num_experts % ep != 0) | ((np.floor(dp) * cp) % ep != 0),
        ),
        ("sp without tp", (sp > 0) & (tp == 1)),
        ("zero sharding without dp", (zero > 0) & (np.floor(dp) * cp == 1)),
        (
            "same as full recompute of every layer",
            (recompute == 2) & (frac < 1) & (np.ceil(frac * per_stage) >= per_stage),
        ),
    ]
    keep = np.ones(enumerated, bool)
    dropped: dict[str, int] = {}
    for reason, bad in rules:
        hit = keep & bad
        if hit.any():
            dropped[reason] = int(hit.sum())
        keep &= ~bad
    table = pd.DataFrame(
        {
            "dp": dp[keep].astype(int),
            "tp": tp[keep].astype(int),
            "pp": pp[keep].astype(int),
            "vp": vp[keep].astype(int),
            "cp": cp[keep].astype(int),
            "ep": ep[keep].astype(int),
            "sp": sp[keep] > 0,
            "mbs": mbs[keep].astype(int),
            "recompute": RECOMPUTE_NAMES[recompute[keep]],
            "recompute_layers": np.where(
                recompute[keep] == 2, np.ceil(frac[keep] * per_stage[keep]), 0
            ).astype(int),
            "zero": zero[keep].astype(int),
        }
    )
    # Full recompute of k < all layers duplicates nothing else; full of all layers is the
    # plain "full" row. Remove exact duplicates that sp forcing may have created.
    table = table.drop_duplicates(ignore_index=True)
    return Candidates(table, enumerated, dropped)
