"""The Optuna study of a measured search: where it is stored, what it is a search of (checked
on --resume), and the analytical top-k queued first."""

from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import optuna
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from autoconfig.base.errors import UserError
from autoconfig.measure.candidates import Candidates
from autoconfig.measure.result import STUDY_FILE  # the default storage, in --out
from autoconfig.measure.sampler import CandidateSampler, taken_keys
from autoconfig.spec import layout

STUDY_NAME = "autoconfig"
ENDED = "ended"  # study attribute: the last run finished its loop (not killed)


def storage_url(out: Path, storage: str | None) -> str:
    return storage or f"sqlite:///{Path(out).resolve() / STUDY_FILE}"


# Query parameters that carry a credential (?password=..., &sslpassword=...): hidden as the
# password is. (sslkey and sslcert name files, not secrets.)
_SECRET_KEYS = frozenset({"password", "passwd", "pwd", "token", "secret", "sslpassword"})
HIDDEN = "***"


def _parsed(url: str) -> URL | None:
    try:
        return make_url(url)
    except ArgumentError:  # a journal file, or not a URL
        return None


def _secret_query(parsed: URL) -> dict[str, str | tuple[str, ...]]:
    return {k: v for k, v in parsed.query.items() if k.lower() in _SECRET_KEYS}


def masked(url: str) -> str:
    """The URL with its password (and password-like query parameters) replaced by ***; as given
    when it holds none. A string that is not a URL hides whatever stands before an '@'."""
    parsed = _parsed(url)
    if parsed is None:
        return f"{HIDDEN}@{url.rsplit('@', 1)[1]}" if "@" in url else url
    hidden = _secret_query(parsed)
    if parsed.password is None and not hidden:
        return url  # nothing to hide: not re-rendered (which would re-quote a path)
    parsed = parsed.update_query_dict({k: HIDDEN for k in hidden})
    # The rendering percent-encodes query values: the *** put there reads as *** again.
    return parsed.render_as_string(hide_password=True).replace(quote(HIDDEN, safe=""), HIDDEN)


def _secrets(url: str) -> list[str]:
    parsed = _parsed(url)
    if parsed is None:  # what stands before an '@', and its last ':'-part (a password)
        before = url.rsplit("@", 1)[0] if "@" in url else ""
        return [s for s in (before, before.rsplit(":", 1)[-1]) if s]
    found = [] if parsed.password is None else [parsed.password]
    for value in _secret_query(parsed).values():
        found += [value] if isinstance(value, str) else list(value)
    return [s for s in found if s]


def hide_secrets(text: str, url: str) -> str:
    """`text` (a driver's message, say) with the URL's secrets replaced by ***, as written in the
    URL (percent-encoded) or as the driver read them."""
    for secret in sorted(_secrets(url), key=len, reverse=True):
        text = text.replace(secret, HIDDEN)
        text = text.replace(quote(secret, safe=""), HIDDEN)
    return text


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage from a URL: RDB URLs, or a journal file (`*.log` / `*.journal`)."""
    try:
        if url.endswith((".log", ".journal")) and "://" not in url:
            return optuna.storages.JournalStorage(JournalFileBackend(url))
        return optuna.storages.RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
    except Exception as exc:  # any driver's error: the URL is the user's input
        reason = hide_secrets(" ".join(str(exc).split())[:200], url)
        raise UserError(f"storage: cannot open '{masked(url)}' ({reason})") from None


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
    same thing. Nothing is written before the checks pass. A study that ended without one
    successful trial does not block a fresh search (with corrected flags, say): it is kept under
    another name and the search starts over."""
    optuna.logging.set_verbosity(logging.WARNING)
    found = exists(storage)
    attempt = 0
    if found and not resume:
        old = optuna.load_study(study_name=STUDY_NAME, storage=storage)
        succeeded = old.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if succeeded or not old.user_attrs.get(ENDED):  # results, or a run that may go on
            raise UserError(
                f"out: {where} already holds a measured search; add --resume to continue it or "
                "choose another --out"
            )
        attempt = archive(storage, old, where)
        found = False
    if resume and not found:
        raise UserError(f"resume: no measured search in {where} to resume")
    if found:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler)
        before = study.user_attrs.get("fingerprint")
        if before is None:  # the first run died between creating the study and describing it
            study.set_user_attr("fingerprint", fingerprint)
            return study
        differ = [k for k in fingerprint if before.get(k) != fingerprint[k]]
        if differ:
            what = ", ".join(f"{k} {before.get(k)!r} (now {fingerprint[k]!r})" for k in differ)
            raise UserError(f"resume: {where} holds a search of another setting: {what}")
        return study
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=storage, sampler=sampler, direction="maximize"
    )
    if attempt:
        study.set_user_attr("attempt", attempt)
    study.set_user_attr("fingerprint", fingerprint)
    return study


def archive(storage: optuna.storages.BaseStorage, old: optuna.Study, where: str) -> int:
    """Keep a study that never succeeded as `autoconfig-attempt-N` in the same storage (its
    trials and run folders stay as they are); returns N, the new study's attempt number."""
    names = {s.study_name for s in storage.get_all_studies()}
    attempt = int(old.user_attrs.get("attempt", 0)) + 1
    while f"{STUDY_NAME}-attempt-{attempt}" in names:
        attempt += 1
    name = f"{STUDY_NAME}-attempt-{attempt}"
    optuna.copy_study(
        from_study_name=STUDY_NAME, from_storage=storage, to_storage=storage, to_study_name=name
    )
    optuna.delete_study(study_name=STUDY_NAME, storage=storage)
    counts = Counter(
        t.user_attrs.get("failure_class", t.state.name.lower())
        for t in old.get_trials(deepcopy=False)
    )
    tally = ", ".join(f"{n} {c}" for c, n in counts.items()) or "no trials"
    print(
        f"note: {where} held a measured search in which no trial succeeded ({tally}); "
        f"kept as study '{name}', starting over",
        file=sys.stderr,
    )
    return attempt


def enqueue_top(study: optuna.Study, candidates: Candidates, k: int) -> list[str]:
    """Queue the k best predicted layouts the trainer can run: the first trials measured."""
    taken = taken_keys(study)
    top = candidates.runnable().sort_values("analytical_rank").head(k)
    top = top[~top["key"].isin(taken)]
    for _, row in top.iterrows():
        study.enqueue_trial(layout.plain(row), user_attrs={"source": "analytical top-k"})
    return top["key"].tolist()
