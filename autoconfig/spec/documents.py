"""The documents a run's sequences hold: their lengths (a CSV of lengths or a named preset) and
whether they are packed into each sequence or padded to it one at a time.

What the cost model takes from them (cost.layer.attention_span, timing._measured_attention,
evaluate) is two numbers per run, resolved here against the run's sequence length:

- `doc_len`, packed: the length of the document the average token sits in, E[l^2] / E[l].
  Variable-length flash attention (flash-attn's varlen kernels, Transformer Engine's THD
  format) keeps each document to its own causal attention, so a sequence of documents l_i
  costs sum_i l_i^2 / 2 query-key pairs instead of seq^2 / 2: the ratio is
  sum l_i^2 / seq^2 = E[l^2] / (E[l] seq) = doc_len / seq. GEMMs are unchanged (a token is a
  token wherever its document starts). 0 where the sequence is one document.
- `useful_share`, padded: one document a sequence, padded to seq_len; the padding is computed
  (the kernels run the whole padded sequence) but trains nothing, so useful tokens are
  E[l] / seq of those computed. 1 where every token is useful.

Documents longer than the sequence are truncated to it, as NeMo's packed SFT datasets and
padded batches both do. What packing leaves empty at the end of a pack (first-fit packing
fills 4096-token packs of ~200-token documents to within a document) is not modelled.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.base import checks
from autoconfig.base.errors import UserError

FIELD = "doc-lengths"

# SQuAD v1.1 fine-tuning examples (context, question and answer in one prompt), in Llama
# tokens: an estimate, not a measured histogram. SQuAD v1.1's contexts are Wikipedia
# paragraphs of roughly 120-140 words, its questions about 10 words and answers about 3
# (Rajpurkar et al. 2016, "SQuAD: 100,000+ Questions for Machine Comprehension of Text",
# Sec. 4); at about 1.3 Llama tokens a word plus a prompt template that is roughly 150-250
# tokens an example. The histogram below has mean 197.5 and E[l^2]/E[l] 225.9 tokens.
SQUAD_LENGTHS = (100, 150, 200, 250, 300, 400)
SQUAD_WEIGHTS = (0.15, 0.30, 0.25, 0.15, 0.10, 0.05)

PRESETS: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {
    "squad": (SQUAD_LENGTHS, SQUAD_WEIGHTS),
}

# Length classes dynamic context parallelism times (DocLengths.classes): each class is one
# more row the cost model evaluates; 24 log-spaced bins over lengths from 100 to 131,072
# tokens span 1.35x each, and the edges at seq / 2**j for j up to TAIL_POINTS (cp up to 4,096)
# add at most 12 more.
MAX_CLASSES = 24
TAIL_POINTS = 12

# Rows of a lengths file read: a tokenized dataset's lengths, a few hundred thousand at most
# matter to two moments.
MAX_ROWS = 1_000_000


@dataclass(frozen=True)
class DocLengths:
    """A length histogram: `lengths` in tokens with their relative `weights` (counts)."""

    name: str
    lengths: tuple[int, ...]
    weights: tuple[float, ...]

    def moments(self, seq: float) -> tuple[float, float]:
        """(E[l], E[l^2]) over documents truncated to `seq` tokens."""
        lengths = np.minimum(np.asarray(self.lengths, float), float(seq))
        weights = np.asarray(self.weights, float)
        weights = weights / weights.sum()
        return float(weights @ lengths), float(weights @ lengths**2)

    def columns(self, seq: float, packed: bool = True) -> dict[str, float]:
        """The cost model's document columns at `seq`: doc_len when packed, else useful_share
        (module docstring)."""
        mean, square = self.moments(seq)
        if packed:
            return {"doc_len": square / mean, "useful_share": 1.0}
        return {"doc_len": 0.0, "useful_share": mean / float(seq)}

    def classes(self, seq: float, most: int = MAX_CLASSES) -> tuple[tuple[float, float], ...]:
        """The documents truncated to `seq` as (length, share of documents) classes: lengths
        binned on a log scale (`most` bins) whose edges also fall on seq / 2**j, where dynamic
        context parallelism doubles the ranks a document takes at any power-of-two cp, each
        bin at its mean length (so its tokens are kept) and every document of a bin taking the
        ranks its mean takes. What cost.hybrid_cp times one by one."""
        lengths = np.minimum(np.asarray(self.lengths, float), float(seq))
        weights = np.asarray(self.weights, float)
        weights = weights / weights.sum()
        low, high = lengths.min(), lengths.max()
        doublings = float(seq) / 2.0 ** np.arange(1, TAIL_POINTS + 1)
        edges = np.unique(
            np.concatenate(
                [
                    np.geomspace(low, high, most + 1),
                    doublings[(doublings > low) & (doublings < high)],
                ]
            )
        )
        # a document in bin i has edges[i] < length <= edges[i + 1] (the least in bin 0)
        bins = np.clip(np.searchsorted(edges, lengths, side="left") - 1, 0, len(edges) - 2)
        out = []
        for b in np.unique(bins):
            share = float(weights[bins == b].sum())
            mean = float(weights[bins == b] @ lengths[bins == b]) / share
            out.append((mean, share))
        return tuple(out)

    def describe(self, seq: float, packed: bool = True) -> str:
        mean, square = self.moments(seq)
        how = "packed" if packed else "padded"
        return f"{self.name} documents {how} (mean {mean:.0f}, E[l^2]/E[l] {square / mean:.0f})"


WHOLE_SEQUENCE: dict[str, float] = {"doc_len": 0.0, "useful_share": 1.0}


def fixed(length: float) -> DocLengths:
    """Documents all `length` tokens long."""
    return DocLengths(f"{length:g}-token", (int(length),), (1.0,))


def preset(name: str) -> DocLengths | None:
    """The named preset, or None."""
    found = PRESETS.get(name.strip().lower())
    return None if found is None else DocLengths(name.strip().lower(), *found)


def doc_lengths(value: str | Path) -> DocLengths:
    """A preset name, or a CSV file read by `read_lengths`."""
    named = preset(str(value))
    return named if named is not None else read_lengths(Path(value))


def read_lengths(path: Path) -> DocLengths:
    """A CSV of document lengths: a `length` column, or `input_len` and `output_len` (the
    format of `infer --workload`: a fine-tuning example is its prompt and its answer). Bad
    input is one UserError line naming the file and the first bad line."""
    lengths, counts = read_length_table(path, FIELD, (("length",), ("input_len", "output_len")))
    return DocLengths(Path(path).name, lengths, counts)


def read_length_table(
    path: Path, field: str, choices: tuple[tuple[str, ...], ...]
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The distinct lengths of a CSV and how often each occurs, a row's length the sum of the
    first of `choices` (tuples of column names) the file has. Bad input is one UserError line
    naming `field`, the file and the first bad line."""
    text = checks.text_file(path, field)
    try:
        table = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"{field}: '{path}' is not a readable CSV ({reason})") from None
    table.columns = [str(c).strip() for c in table.columns]
    columns = next((list(c) for c in choices if all(name in table for name in c)), None)
    if columns is None:
        wanted = " or ".join(" and ".join(f"'{n}'" for n in c) for c in choices)
        raise UserError(f"{field}: '{path}' line 1 has no {wanted} column")
    if table.empty:
        raise UserError(f"{field}: '{path}' has no lengths (line 2 is empty)")
    if len(table) > MAX_ROWS:
        raise UserError(f"{field}: '{path}' has {len(table):,} rows; at most {MAX_ROWS:,}")
    total = np.zeros(len(table))
    bad = np.zeros(len(table), bool)
    for col in columns:
        number = pd.to_numeric(table[col].str.strip(), errors="coerce")
        # bounded before the cast: 1e20 would wrap to a negative length
        wrong = number.isna() | ~(number >= 1) | ~(number <= checks.MAX_COUNT)
        wrong |= number.fillna(0) != number.fillna(0).round()
        bad |= wrong.to_numpy()
        total += number.fillna(0).to_numpy()
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        cells = ", ".join(checks.shown(table[c].iloc[row]) for c in columns)
        raise UserError(
            f"{field}: '{path}' line {row + 2}: {' + '.join(columns)} must be an integer in "
            f"1..{checks.MAX_COUNT:,} (got {cells})"
        )
    lengths, counts = np.unique(total.astype(np.int64), return_counts=True)
    return tuple(int(v) for v in lengths), tuple(float(c) for c in counts)


def packed_cell(value: object) -> bool | None:
    """A `packed` cell of a --runs table: 'y ...' packed, 'n ...' padded, blank or 'unknown'
    None (the first word decides: the reference tables add the dataset in parentheses)."""
    words = str(value).strip().lower().split()
    first = words[0] if words else ""
    if first in ("y", "yes", "true", "1"):
        return True
    if first in ("n", "no", "false", "0"):
        return False
    return None


def document_columns(value: str, seq: float, packed: bool | None) -> dict[str, float]:
    """The document columns of a `doc_lengths` cell (a preset name or a mean length in
    tokens, every document that long) at `seq`; blank: whole sequences. A document length
    without packing stated is taken as packed (what fine-tuning recipes that name a dataset's
    lengths do)."""
    text = str(value).strip()
    if text.lower() in ("", "unknown", "nan", "none"):
        return dict(WHOLE_SEQUENCE)
    docs = preset(text)
    if docs is None:
        length = _length(text)
        if length is None:
            allowed = ", ".join(PRESETS)
            raise UserError(
                f"doc_lengths: must be a preset ({allowed}) or a length in tokens, "
                f"1..{checks.MAX_COUNT:,} (got {checks.shown(text)})"
            )
        docs = fixed(length)
    return docs.columns(seq, packed is not False)


def _length(text: str) -> float | None:
    try:
        length = float(text)
    except ValueError:
        return None
    return length if 1 <= length <= checks.MAX_COUNT else None
