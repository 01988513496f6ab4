"""An exclusive lock on an output folder, so one search at a time writes it. The lock is
filelock's (flock on a file in the folder, released by the kernel when its holder dies);
beside it a record names the holder (pid, host, start), and a record left by a holder that
died is taken over with a message."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from autoconfig.base.errors import UserError

LOCK_NAME = ".autoconfig.lock"  # the record: who holds the folder, as JSON
MUTEX_NAME = ".autoconfig.lock.flock"  # the file filelock locks

_held: dict[Path, int] = {}  # folder -> how many times this process entered its lock


@contextlib.contextmanager
def folder_lock(folder: Path | str, flag: str = "out") -> Iterator[None]:
    """Hold `folder` (created if missing) for the duration; re-entrant within one process.
    Another live holder is one line naming it (exit code 2). A folder this lock created and
    that holds nothing else when it is released is removed again."""
    folder = Path(os.path.abspath(folder))
    if folder in _held:
        _held[folder] += 1
        try:
            yield
        finally:
            _held[folder] -= 1
        return
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag}: cannot create '{folder}' ({exc.strerror or exc})") from None
    try:
        mutex = _acquire(folder, flag)
    except BaseException:  # refused, or interrupted while taking it: leave nothing behind
        if created:
            _remove_if_empty(folder)
        raise
    _held[folder] = 1
    try:
        yield
    finally:
        del _held[folder]
        _release(mutex, folder)
        if created:
            _remove_if_empty(folder)  # a refused run leaves nothing behind


def holder(folder: Path | str) -> dict[str, object] | None:
    """Who holds (or last held and died holding) the folder's lock, if anyone."""
    try:
        who = json.loads((Path(folder) / LOCK_NAME).read_text() or "null")
    except (OSError, ValueError):
        return None
    return who if isinstance(who, dict) else None


def _acquire(folder: Path, flag: str) -> FileLock:
    # One try, no waiting: a busy folder is the user's to resolve. Not thread-local, as the
    # re-entrancy above is the whole process's.
    mutex = FileLock(folder / MUTEX_NAME, timeout=0, thread_local=False)
    try:
        mutex.acquire()
    except Timeout:
        raise _busy(folder, flag) from None
    except OSError as exc:
        raise UserError(f"{flag}: cannot write in '{folder}' ({exc.strerror or exc})") from None
    stale = holder(folder)
    if stale:
        print(
            f"note: {folder} was locked by {_describe(stale)}, which is no longer running; "
            "taking the lock over",
            file=sys.stderr,
        )
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    record = folder / LOCK_NAME
    tmp = folder / f"{LOCK_NAME}.{os.getpid()}.tmp"
    try:  # renamed into place, so a contender reads the old record or this one, never half
        tmp.write_text(json.dumps(me))
        os.replace(tmp, record)
    except BaseException as exc:  # a full disk, or Ctrl-C between the two calls
        with contextlib.suppress(OSError):
            tmp.unlink()
        _release(mutex, folder)
        if isinstance(exc, OSError):
            raise UserError(f"{flag}: cannot write in '{folder}' ({exc.strerror or exc})") from None
        raise
    return mutex


def _release(mutex: FileLock, folder: Path) -> None:
    with contextlib.suppress(OSError):
        (folder / LOCK_NAME).unlink()
    # Removed while still locked: a contender that opened it before and locks it after the
    # release holds a file no longer in the folder, and filelock (4.0 on) drops such a lock.
    with contextlib.suppress(OSError):
        (folder / MUTEX_NAME).unlink()
    mutex.release()


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when empty


def _describe(who: dict[str, object]) -> str:
    since = who.get("since")
    when = ""
    if isinstance(since, (int, float)):
        when = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}"
    return f"pid {who.get('pid', '?')} on {who.get('host', '?')}{when}"


def _busy(folder: Path, flag: str) -> UserError:
    who = holder(folder)
    by = _describe(who) if who else "another process"
    return UserError(
        f"{flag}: {folder} is in use by another autoconfig run ({by}); wait for it to finish "
        f"or choose another --{flag}"
    )
