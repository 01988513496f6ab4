"""Which layout a measured-search trial holds after a kill: its queued layout, its whole
sampled one, or none when the kill came between two of Optuna's per-dimension suggestions."""

from __future__ import annotations

from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autoconfig.measure.sampler import chosen_layout
from autoconfig.spec import layout

WHOLE = {d: 1 for d in layout.NAMES}


def _trial(params: dict, fixed: dict | None = None):
    dists = {k: CategoricalDistribution([v]) for k, v in params.items()}
    return create_trial(
        state=TrialState.FAIL,
        params=params,
        distributions=dists,
        system_attrs={"fixed_params": fixed} if fixed else {},
    )


def test_a_queued_layout_counts_even_when_its_suggestions_were_cut_short() -> None:
    part = {k: WHOLE[k] for k in list(layout.NAMES)[:3]}
    assert chosen_layout(_trial(part, fixed=WHOLE | {"tp": 2})) == WHOLE | {"tp": 2}


def test_a_whole_sampled_layout_counts_and_half_of_one_does_not() -> None:
    assert chosen_layout(_trial(WHOLE)) == WHOLE
    part = {k: WHOLE[k] for k in list(layout.NAMES)[:-1]}  # killed before the last dimension
    assert chosen_layout(_trial(part)) is None
    assert chosen_layout(_trial({})) is None
