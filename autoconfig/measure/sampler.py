"""An Optuna sampler confined to the candidate layouts: an inner sampler (TPE, GP or random)
proposes values for each dimension; the proposal is snapped to the nearest candidate not yet
tried, ties going to the best prediction corrected by what was measured nearby. `grid` walks
the candidates in nested-loop order, the baseline NeMo-style sweeps use."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from autoconfig.spec import layout
from autoconfig.spec.vocab import FailureClass


def distributions(table: pd.DataFrame) -> dict[str, BaseDistribution]:
    """One categorical distribution per dimension, over the values the candidates take."""
    out: dict[str, BaseDistribution] = {}
    for dim in layout.NAMES:
        values = sorted(set(table[dim].tolist()), key=str)
        out[dim] = CategoricalDistribution(values)
    return out


def holds_layout(trial: FrozenTrial) -> bool:
    """Whether a trial keeps its layout from being measured again: it is queued or running,
    it finished with a class that used a run (ok, oom, timeout, crash, launch), or the trainer
    refused its candidate. An interrupted trial gives its layout back (it is re-run once);
    a trial closed for want of an untried candidate never had one."""
    if not trial.state.is_finished() or trial.state == TrialState.COMPLETE:
        return True
    kind = trial.user_attrs.get("failure_class")
    if kind not in FailureClass.values():
        return False
    if FailureClass(kind) is FailureClass.INVALID:
        return "key" in trial.user_attrs  # a real candidate the trainer cannot run
    return FailureClass(kind).counted


def chosen_layout(trial: FrozenTrial) -> dict[str, object] | None:
    """The layout a trial was given, or None where it never got a whole one. A queued trial's
    layout is fixed before it starts; a sampled one's is stored one dimension at a time, so
    a kill between two suggestions leaves only part of it."""
    for params in (trial.system_attrs.get("fixed_params") or {}, trial.params):
        if all(d in params for d in layout.NAMES):
            return dict(params)
    return None


def taken_keys(study: optuna.Study, exclude: int | None = None) -> set[str]:
    """Keys of every layout already measured, being measured or queued (holds_layout)."""
    keys = set()
    for t in study.get_trials(deepcopy=False):
        if t.number == exclude or not holds_layout(t):
            continue
        params = chosen_layout(t)
        if params is not None:
            keys.add(layout.key(params))
    return keys


class CandidateSampler(BaseSampler):
    def __init__(self, table: pd.DataFrame, kind: str = "tpe", seed: int = 0, startup: int = 3):
        self.table = table.reset_index(drop=True)
        self.kind = kind
        self.space = distributions(self.table)
        self.rng = np.random.default_rng(seed)
        self.inner: BaseSampler | None = None
        if kind == "tpe":
            self.inner = optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=startup, multivariate=True, group=False
            )
        elif kind == "gp":
            self.inner = optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
        elif kind == "random":
            self.inner = optuna.samplers.RandomSampler(seed=seed)

    # -- Optuna's sampler interface -----------------------------------------------------------
    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(self.space)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, object]:
        if not search_space:
            return {}
        fixed = trial.system_attrs.get("fixed_params")
        if fixed:  # an enqueued trial (analytical top-k or a re-queue): its layout is set
            return {}
        pool = self._pool(study, trial.number)
        if pool.empty:
            return {}
        if self.kind == "grid":
            row = pool.sort_values("grid_order").iloc[0]
        elif self.kind == "model":
            row = pool.iloc[int(np.argmax(self._corrected(study, pool)))]
        else:
            row = self._snap(study, trial, pool)
        return layout.plain(row)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> object:
        # Reached only when no candidate is left untried: any value; the runner stops anyway.
        assert isinstance(param_distribution, CategoricalDistribution)
        return param_distribution.choices[0]

    # -- helpers ------------------------------------------------------------------------------
    def _pool(self, study: optuna.Study, number: int) -> pd.DataFrame:
        """Untried candidates; layouts the trainer refuses only once nothing else is left."""
        taken = taken_keys(study, exclude=number)
        free = self.table[~self.table["key"].isin(taken)]
        runnable = free[free["refused"] == ""]
        return runnable if not runnable.empty else free

    def _snap(self, study: optuna.Study, trial: FrozenTrial, pool: pd.DataFrame) -> pd.Series:
        proposal = self._propose(study, trial)
        if self.kind == "random":  # the baseline: uniform over what is left
            return pool.iloc[int(self.rng.integers(len(pool)))]
        distance = np.zeros(len(pool))
        for dim in layout.NAMES:
            want = proposal[dim]
            have = pool[dim].to_numpy()
            if dim in layout.NUMERIC:
                distance += np.abs(np.log2(have.astype(float) + 1) - math.log2(float(want) + 1))
            else:
                distance += (have != want).astype(float)
        near = distance <= distance.min() + 1.0  # within one doubling of the closest
        score = np.where(near, self._corrected(study, pool), -np.inf)
        return pool.iloc[int(np.argmax(score))]

    def _propose(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, object]:
        assert self.inner is not None
        proposal = dict(self.inner.sample_relative(study, trial, self.space))
        for dim, dist in self.space.items():
            if dim not in proposal:
                proposal[dim] = self.inner.sample_independent(study, trial, dim, dist)
        return proposal

    def _corrected(self, study: optuna.Study, pool: pd.DataFrame) -> np.ndarray:
        """Predicted tokens/s/GPU times the measured/predicted ratio of the nearest measured
        layouts: where the model was wrong nearby, trust it less."""
        predicted = pool["pred_tokens_per_s_per_gpu"].to_numpy(dtype=float)
        done = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value and t.user_attrs.get("pred_tokens_per_s_per_gpu")
        ]
        if not done:
            return predicted
        ratios = np.array(
            [math.log(t.value / t.user_attrs["pred_tokens_per_s_per_gpu"]) for t in done]
        )
        measured = pd.DataFrame([t.params for t in done])
        dist = np.zeros((len(pool), len(done)))
        for dim in layout.NAMES:
            a = pool[dim].to_numpy()[:, None]
            b = measured[dim].to_numpy()[None, :]
            if dim in layout.NUMERIC:
                dist += np.abs(np.log2(a.astype(float) + 1) - np.log2(b.astype(float) + 1))
            else:
                dist += (a != b).astype(float)
        weight = np.exp(-dist)  # nearby measurements count most
        correction = (weight * ratios).sum(axis=1) / np.maximum(weight.sum(axis=1), 1e-12)
        return predicted * np.exp(correction)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if self.inner is not None:
            self.inner.before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        if self.inner is not None:
            self.inner.after_trial(study, trial, state, values)
