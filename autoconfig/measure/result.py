"""What a measured search came to: every trial and the ranking (measured where measured, the
scaled prediction otherwise), for the layers above to show and write."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from autoconfig.vocab import FailureClass


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
