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
