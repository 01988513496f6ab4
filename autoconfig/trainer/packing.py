"""Packed documents: which document each token of a synthetic sequence belongs to, its
position inside that document, and the block-diagonal causal mask that keeps attention inside
each document (what variable-length flash attention computes, spec/documents.py).

A step's documents are drawn from the run's length histogram (`spec.documents.DocLengths`)
with a generator seeded by the step, so every layout trains on the same packs: each sequence
takes documents back to back until it is full, the last one cut at the sequence's end (the
truncation a packed SFT dataset applies to a document longer than the pack)."""

from __future__ import annotations

import torch

from autoconfig.spec.documents import DocLengths

# Offsets the documents' generator from the tokens' (run.synthetic_batch seeds seed*1000+step).
DOCUMENT_STREAM = 7919


def document_ids(docs: DocLengths, sequences: int, seq: int, seed: int) -> torch.Tensor:
    """(sequences, seq) int64: the index of the document each token belongs to, counted from 0
    in every sequence."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(docs.lengths, dtype=torch.int64).clamp(1, seq)
    weights = torch.tensor(docs.weights, dtype=torch.float64)
    # Enough draws to fill any sequence: every document is at least one token long.
    most = seq // max(int(lengths.min()), 1) + 1
    rows = []
    for _ in range(sequences):
        drawn = lengths[torch.multinomial(weights, most, replacement=True, generator=gen)]
        ids = torch.repeat_interleave(torch.arange(most), drawn)[:seq]
        rows.append(ids)
    return torch.stack(rows)


def positions_in_documents(ids: torch.Tensor) -> torch.Tensor:
    """(batch, seq) position of every token inside its document: 0 at each document's start."""
    seq = ids.shape[-1]
    index = torch.arange(seq, device=ids.device).expand_as(ids)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    # The index of the latest document start at or before each token.
    start_index = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return index - start_index


def document_mask(ids: torch.Tensor, queries: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, 1, queries, seq) boolean mask for scaled_dot_product_attention: a query sees the
    keys of its own document at or before it. `queries`: the global positions of the local
    queries (a context-parallel rank's share), all positions by default."""
    seq = ids.shape[-1]
    keys = torch.arange(seq, device=ids.device)
    queries = keys if queries is None else queries.to(ids.device)
    same = ids[:, queries, None] == ids[:, None, :]
    causal = keys[None, :] <= queries[:, None]
    return (same & causal[None]).unsqueeze(1)
