"""The Optuna study of a measured search: where it is stored, what it is a search of (checked
on --resume), and the analytical top-k queued first."""

from __future__ import annotations

import logging
from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileBackend

from autoconfig import layout
from autoconfig.errors import UserError
from autoconfig.measure.candidates import Candidates
from autoconfig.measure.sampler import CandidateSampler

STUDY_NAME = "autoconfig"


def storage_url(out: Path, storage: str | None) -> str:
    return storage or f"sqlite:///{Path(out).resolve() / 'study.db'}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL: RDB URLs, or a journal file (`*.log` / `*.journal`)."""
    try:
        if url.endswith((".log", ".journal")) and "://" not in url:
            return optuna.storages.JournalStorage(JournalFileBackend(url))
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
    except Exception as exc:  # any driver's error: the URL is the user's input
        reason = " ".join(str(exc).split())[:200]
        raise UserError(f"storage: cannot open '{url}' ({reason})") from None


def exists(storage: optuna.storages.BaseStorage) -> bool:
    return any(s.study_name == STUDY_NAME for s in storage.get_all_studies())


def open_study(
    storage: optuna.storages.BaseStorage,
    fingerprint: dict[str, object],
    resume: bool,
    sampler: CandidateSampler,
    where: str,
) -> optuna.Study:
    """The study: a new one, or with --resume the existing one, after checking it searches the
    same thing. Nothing is written before the checks pass."""
    optuna.logging.set_verbosity(logging.WARNING)
    found = exists(storage)
    if found and not resume:
        raise UserError(
            f"out: {where} already holds a measured search; add --resume to continue it or "
            "choose another --out"
        )
    if resume and not found:
        raise UserError(f"resume: no measured search in {where} to resume")
    if found:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler)
        before = study.user_attrs.get("fingerprint", {})
        differ = [k for k in fingerprint if before.get(k) != fingerprint[k]]
        if differ:
            what = ", ".join(f"{k} {before.get(k)!r} (now {fingerprint[k]!r})" for k in differ)
            raise UserError(f"resume: {where} holds a search of another setting: {what}")
        return study
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=storage, sampler=sampler, direction="maximize"
    )
    study.set_user_attr("fingerprint", fingerprint)
    return study


def enqueue_top(study: optuna.Study, candidates: Candidates, k: int) -> list[str]:
    """Queue the k best predicted layouts the trainer can run: the first trials measured."""
    top = candidates.runnable().sort_values("analytical_rank").head(k)
    for _, row in top.iterrows():
        study.enqueue_trial(layout.plain(row), user_attrs={"source": "analytical top-k"})
    return top["key"].tolist()
