"""What a measured search came to: every trial and the ranking (measured where measured, the
scaled prediction otherwise), for the layers above to show and write; and, when no trial
succeeded, what failed and why, by class, with the layout that came closest to working."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from autoconfig.spec.vocab import FailureClass

# The measured search's Optuna storage in --out (here, not in study.py, so the CLI can tell a
# folder that holds a measured search without loading Optuna)
STUDY_FILE = "study.db"

# How far a failed trial got, furthest first: the closest to working is the first of these.
PROGRESS = (
    FailureClass.TIMEOUT,  # it ran, only too long
    FailureClass.OOM,  # it ran until memory ran out
    FailureClass.CRASH,
    FailureClass.INTERRUPTED,
    FailureClass.LAUNCH,
    FailureClass.INVALID,
)

NEXT_STEP = {
    FailureClass.TIMEOUT: "raise --trial-timeout-min or lower --steps",
    FailureClass.OOM: "give each rank more memory (--trial-memory-gib) or keep to smaller "
    "layouts (--max-memory-gib)",
    FailureClass.CRASH: "read the reason and the ranks' logs in the trial's run folder",
    FailureClass.INTERRUPTED: "--resume re-runs it",
    FailureClass.LAUNCH: "the scheduler refused the job: check the executor and --slurm-* options",
    FailureClass.INVALID: "the bundled trainer cannot run these layouts",
}


@dataclass
class MeasuredSearch:
    trials: pd.DataFrame  # one row per trial (trials.csv)
    ranking: pd.DataFrame  # every candidate, measured where measured (measured.csv)
    precision: str = ""  # what the trials ran in (fp32 for CPU trials unless asked for bf16)

    def shown(self, top: int) -> pd.DataFrame:
        """The rows every view shows: the measured ones and the top `top` of the ranking
        (failures are listed apart, with their class and reason)."""
        ranked = self.ranking
        rows = ranked[(ranked["ranked_by"] == "measured") | (ranked.index < top)]
        measured = int((ranked["ranked_by"] == "measured").sum())
        return rows[rows["ranked_by"].isin(["measured", "predicted"])].head(max(top, measured))

    @property
    def any_ok(self) -> bool:
        return len(self.trials) > 0 and bool((self.trials["class"] == FailureClass.OK.value).any())

    @property
    def scale(self) -> float:
        """The factor the unmeasured predictions were scaled by (median measured/predicted)."""
        if self.ranking.empty:
            return 1.0
        first = self.ranking.iloc[0]
        return float(first["scaled_pred_tokens_per_s_per_gpu"] / first["pred_tokens_per_s_per_gpu"])

    def counts(self) -> dict[str, int]:
        """Trials by class, in the vocabulary's order."""
        seen = self.trials["class"].value_counts() if len(self.trials) else pd.Series(dtype=int)
        return {c.value: int(seen[c.value]) for c in FailureClass if c.value in seen}

    def closest(self) -> pd.Series | None:
        """The failed trial that got furthest (see PROGRESS), best predicted first."""
        failed = self.trials[self.trials["class"].isin([c.value for c in PROGRESS])]
        if failed.empty:
            return None
        order = {c.value: i for i, c in enumerate(PROGRESS)}
        rank = pd.to_numeric(failed["analytical_rank"], errors="coerce").fillna(1e9)
        keyed = failed.assign(_progress=failed["class"].map(order), _rank=rank)
        return keyed.sort_values(["_progress", "_rank", "trial"]).iloc[0]

    def diagnosis(self) -> list[str]:
        """Lines saying why no trial succeeded ([] when one did)."""
        if self.any_ok:
            return []
        counts = self.counts()
        if not counts:
            return ["no trial ran: the study holds no finished trial"]
        lines = [
            "no trial succeeded: "
            + ", ".join(f"{n} {c}" for c, n in counts.items() if c != "running")
        ]
        for kind in PROGRESS:
            rows = self.trials[self.trials["class"] == kind.value]
            if len(rows):
                reason = (str(rows["reason"].iloc[0]).splitlines() or [""])[0][:200]
                lines.append(f"  {kind.value} ({len(rows)}): {reason}; {NEXT_STEP[kind]}")
        best = self.closest()
        if best is not None:
            where = f"trial {best['trial']}" if best["trial"] >= 0 else "not run"
            lines.append(
                f"  closest to working: {best['layout']} ({where}, {best['class']}): "
                f"{NEXT_STEP[FailureClass(best['class'])]}"
            )
        return lines

    def summary(self) -> dict[str, object]:
        """The outcome as plain values (best.json)."""
        out: dict[str, object] = {"trials": len(self.trials), "by_class": self.counts()}
        done = self.trials[self.trials["class"] == FailureClass.OK.value]
        if len(done):
            top = done.sort_values("measured_tokens_per_s_per_gpu", ascending=False).iloc[0]
            out["best_measured"] = {
                "layout": top["layout"],
                "trial": int(top["trial"]),
                "measured_tokens_per_s_per_gpu": float(top["measured_tokens_per_s_per_gpu"]),
            }
        else:
            out["diagnosis"] = self.diagnosis()
        return out
