"""Candidate enumeration: every combination of the search space as columns, with the reason
each invalid combination is dropped (divisibility rules) — no per-candidate Python loop."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from pydantic import ValidationError

from autoconfig.cost.inputs import RECOMPUTE_CODES
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
RECOMPUTE_NAMES = np.array(["none", "selective", "full", "op"])


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


def _grid(*axes: np.ndarray) -> list[np.ndarray]:
    return [g.ravel() for g in np.meshgrid(*axes, indexing="ij")]


def _apply(
    rules: list[tuple[str, np.ndarray]], weight: float, dropped: dict[str, int]
) -> np.ndarray:
    """Mask of rows passing every rule; each rule's count (times `weight`) goes to `dropped`
    for the rows it is the first to reject."""
    keep = np.ones(len(rules[0][1]), bool)
    for reason, bad in rules:
        hit = keep & bad
        if hit.any():
            dropped[reason] = dropped.get(reason, 0) + int(hit.sum() * weight)
        keep &= ~bad
    return keep


def enumerate_candidates(
    model: ModelSpec, gpus: int, gbs: int, seq_len: int, space: SearchSpace, gpus_per_node: int
) -> Candidates:
    """Every combination of the space's values for `gpus` GPUs that obeys the layout rules.

    Two passes keep this cheap: the structural dimensions (tp, pp, vp, cp, ep) are filtered
    first, and only the survivors are crossed with micro-batch, sp, recompute and ZeRO."""
    tps = [t for t in space.tp if space.allow_tp_across_nodes or t <= gpus_per_node]
    ropts = [(r, f) for r in space.recompute for f in (space.full_layers if r == "full" else [0.0])]
    eps = space.ep if model.is_moe else [1]
    per_structure = len(space.mbs) * len(space.sp) * len(ropts) * len(space.zero)
    arr = lambda v: np.array(v, float)  # noqa: E731
    tp, pp, vp, cp, ep = _grid(arr(tps), arr(space.pp), arr(space.vp), arr(space.cp), arr(eps))
    enumerated = tp.size * per_structure
    dropped: dict[str, int] = {}
    layers = float(model.layers)
    with np.errstate(all="ignore"):
        dp = gpus / (tp * pp * cp)
        whole_dp = np.floor(dp)
        keep = _apply(
            [
                (
                    "tp does not divide heads/kv_heads",
                    (model.heads % tp != 0) | ((model.kv % tp != 0) & (tp % model.kv != 0)),
                ),
                ("tp*pp*cp does not divide the GPU count", (dp != whole_dp) | (dp < 1)),
                ("pp exceeds layers", pp > layers),
                (
                    "pp*vp does not divide layers",
                    ((layers % (pp * vp)) != 0) & ((vp > 1) | (not space.uneven_pipeline)),
                ),
                ("vp needs pp > 1", (vp > 1) & (pp == 1)),
                ("cp does not divide seq_len/2", (seq_len % (2 * cp) != 0) & (cp > 1)),
                (
                    "cp leaves too few tokens per rank",
                    (cp > 1) & (seq_len / cp < space.min_tokens_per_cp_rank),
                ),
                (
                    "ep does not divide experts or dp*cp",
                    (model.num_experts % ep != 0) | ((whole_dp * cp) % ep != 0),
                ),
            ],
            per_structure,
            dropped,
        )
    structure = np.flatnonzero(keep)
    rec_code = np.array([RECOMPUTE_CODES[r] for r, _ in ropts], float)
    rec_frac = np.array([f for _, f in ropts])
    s_idx, mbs, sp, ridx, zero = _grid(
        structure.astype(float),
        arr(space.mbs),
        arr([float(x) for x in space.sp]),
        np.arange(len(ropts), dtype=float),
        arr(space.zero),
    )
    s_idx, ridx = s_idx.astype(int), ridx.astype(int)
    tp, pp, vp, cp, ep, dp = (a[s_idx] for a in (tp, pp, vp, cp, ep, dp))
    recompute, frac = rec_code[ridx], rec_frac[ridx]
    per_stage = np.ceil(layers / pp)
    with np.errstate(all="ignore"):
        m = gbs / (dp * mbs)
        keep = _apply(
            [
                ("gbs not divisible by dp*mbs", gbs % (dp * mbs) != 0),
                ("interleaving needs micro-batches divisible by pp", (vp > 1) & (m % pp != 0)),
                ("sp without tp", (sp > 0) & (tp == 1)),
                ("zero sharding without dp", (zero > 0) & (dp * cp == 1)),
                (
                    "same as full recompute of every layer",
                    (recompute == 2) & (frac < 1) & (np.ceil(frac * per_stage) >= per_stage),
                ),
            ],
            1.0,
            dropped,
        )
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
            "recompute": RECOMPUTE_NAMES[recompute[keep].astype(int)],
            "recompute_layers": np.where(
                recompute[keep] == 2, np.ceil(frac[keep] * per_stage[keep]), 0
            ).astype(int),
            "zero": zero[keep].astype(int),
        }
    )
    return Candidates(table.drop_duplicates(ignore_index=True), enumerated, dropped)
