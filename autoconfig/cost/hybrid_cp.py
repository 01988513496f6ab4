"""Dynamic (hybrid) context parallelism over packed documents: each document is run as its own
forward and backward on only the context-parallel ranks its length needs, and the step is the
sum of those passes.

What Megatron-Core 0.16.1 does (`hybrid_context_parallel`, `max_seqlen_per_dp_cp_rank`):
- datasets/data_schedule.py HybridCPDataLoaderWrapper gathers the lengths of every packed
  sample's sub-samples (documents) over the data-parallel group, schedules them over the
  dp x cp ranks and reroutes them there (an all-to-all of token ids, negligible here);
- pipeline_parallel/hybrid_cp_schedule.py BalancedCPScheduler gives a document of length L
  gpus_needed(L) = 2**ceil(log2(L / max_seqlen_per_dp_cp_rank)) ranks, at least one, and
  balances the groups' work (L^2 / ranks) over the ranks;
- hybrid_context_parallel_forward_backward then runs forward_step and backward_step once per
  document a rank holds, with gradient sync off until the last one, and a barrier over the
  dp x cp group between groups of documents;
- only the schedule without pipelining runs it (schedules.py), multi-latent attention refuses
  it, and its docstring's starting point for max_seqlen_per_dp_cp_rank is the sequence length
  over cp, which the cost model and the export take.

The model, for a layout with cp = c over dp x c ranks and documents in length classes
(L_k, share of documents p_k) (spec.documents.DocLengths.classes):
- a class-k document takes g_k = min(c, gpus_needed(L_k)) ranks with capacity seq / c (the
  classes' edges fall where g doubles, so a class's documents take the same count);
- its pass on each of them is the same layout with cp = g_k, one sequence of L_k tokens
  padded to a multiple of 2 x dp x c (x tp with sequence parallelism: utils.py requires it,
  its padding a TODO), one micro-batch (dp x c / g_k replicas), evaluated by the cost model
  itself: its compute, kernel launches, TP and CP traffic (`PER_PASS`);
- a step holds gbs x seq / E[L] documents; each rank runs n_k = docs x p_k x g_k / (dp x c)
  passes of class k, so the step is sum_k n_k x pass_k plus the layout's own once-a-step parts
  (gradient reduction, optimizer, offload);
- memory is the layout's own: no pass holds more than seq / c tokens on a rank.
Not modelled: the balancing's residual imbalance and the barriers between groups. Refused
(spec.layout.rules): cp not a power of two or dp x cp odd, mbs > 1, ZeRO 2/3, pipelining,
expert parallelism, activation offload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from autoconfig.cost.inputs import Col, CostInputs

# The parts of a step that a per-document pass pays each time (cost.timing.StepTime; pp is 1)
PER_PASS = ("time_compute_s", "time_launch_s", "time_tp_comm_s", "time_cp_comm_s", "time_ep_comm_s")
# and those the step pays once, taken from the layout's own evaluation
ONCE = ("time_dp_comm_s", "time_optimizer_s", "time_offload_s")


def ranks_needed(length: Col, seq: Col, cp: Col) -> Col:
    """Megatron-Core's gpus_needed for documents of `length` tokens at a rank capacity of
    seq / cp, at most cp."""
    need = np.exp2(np.ceil(np.log2(np.maximum(length * cp / seq, 1.0))))
    return np.minimum(need, cp)


def rows(x: CostInputs) -> np.ndarray:
    """The rows that run dynamic context parallelism (packed documents given)."""
    if not len(x.doc_classes):
        return np.zeros(0, int)
    return np.flatnonzero(np.broadcast_to(x.hybrid_cp, (x.n,)) > 0)


def apply(
    x: CostInputs, out: dict[str, Col], evaluate: Callable[[CostInputs], dict[str, Col]]
) -> dict[str, Col]:
    """`out` (the evaluation of `x`) with its dynamic-CP rows' step times replaced by the sum
    of their per-document passes, each pass timed by `evaluate` (the cost model)."""
    hybrid = rows(x)
    if not len(hybrid):
        return out
    lengths, shares = x.doc_classes[:, 0], x.doc_classes[:, 1]
    k = len(lengths)
    sub = x.take(hybrid)
    n = len(hybrid)
    passes = x.take(np.repeat(hybrid, k))  # one row per (layout, class), layout-major

    def col(name: str) -> np.ndarray:
        return np.broadcast_to(np.asarray(getattr(sub, name), float), (n,))

    cp, dp, seq = col("cp"), col("dp"), col("seq")
    # Megatron-Core splits a document over its ranks only if its length divides by
    # 2 x dp x cp (x tp with sequence parallelism): utils.py get_batch_on_this_hybrid_cp_rank,
    # whose padding is a TODO there; each document is charged as padded to that multiple.
    quantum = 2.0 * dp * cp * np.where(col("sp") > 0, col("tp"), 1.0)
    length = np.tile(lengths, n)
    cp_r, dp_r, seq_r, quantum_r = (np.repeat(v, k) for v in (cp, dp, seq, quantum))
    ranks = ranks_needed(length, seq_r, cp_r)
    padded = np.ceil(length / quantum_r) * quantum_r
    replicas = dp_r * cp_r / ranks
    passes = replace(
        passes,
        cp=ranks,
        dp=replicas,
        mbs=np.ones(n * k),
        gbs=replicas,  # one micro-batch a step
        seq=padded,
        doc_len=np.zeros(n * k),
        useful_share=np.ones(n * k),
        hybrid_cp=np.zeros(n * k),
        doc_classes=np.zeros((0, 2)),
    )
    timed = evaluate(passes)
    # documents a step holds (packed: every token is a document's) and class-k passes a rank runs
    docs = col("gbs") * seq * col("useful_share") / float(shares @ lengths)
    count = np.repeat(docs, k) * np.tile(shares, n) * ranks / (dp_r * cp_r)
    step_old = np.asarray(out["pred_step_time_s"], float)[hybrid]
    new = {p: (count * np.asarray(timed[p], float)).reshape(n, k).sum(axis=1) for p in PER_PASS}
    step = sum(new.values()) + sum(np.asarray(out[p], float)[hybrid] for p in ONCE)
    result = {key: np.array(value, copy=True) for key, value in out.items()}
    for p, value in new.items():
        result[p][hybrid] = value
    result["time_pp_comm_s"][hybrid] = 0.0
    result["time_bubble_s"][hybrid] = 0.0
    scale = step_old / step
    result["pred_step_time_s"][hybrid] = step
    for p in ("pred_tokens_per_s_per_gpu", "pred_model_tflops_per_gpu", "pred_mfu"):
        result[p][hybrid] = result[p][hybrid] * scale
    return result
