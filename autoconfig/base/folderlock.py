"""An exclusive lock on an output folder, so one search at a time writes it. The lock file
names its holder (pid, host, start); a lock whose holder died is taken over with a message."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from autoconfig.base.errors import UserError

LOCK_NAME = ".autoconfig.lock"

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
    fd = _acquire(folder / LOCK_NAME, folder, flag)
    _held[folder] = 1
    try:
        yield
    finally:
        del _held[folder]
        _release(fd, folder / LOCK_NAME)
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty: a refused run leaves nothing behind


def holder(folder: Path | str) -> dict | None:
    """Who holds (or last held and died holding) the folder's lock, if anyone."""
    try:
        return json.loads((Path(folder) / LOCK_NAME).read_text() or "null")
    except (OSError, ValueError):
        return None


def _acquire(path: Path, folder: Path, flag: str) -> int:
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(f"{flag}: cannot write in '{folder}' ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                # No flock here (some network filesystems): trust the recorded pid instead.
                if _alive(_read(fd)):
                    os.close(fd)
                    raise _busy(folder, flag) from None
            else:
                os.close(fd)
                raise _busy(folder, flag) from None
        # The holder before us may have removed the file between our open and our lock: only a
        # lock on the file that is still at `path` counts.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    stale = _read(fd)
    if stale:
        print(
            f"note: {folder} was locked by {_describe(stale)}, which is no longer running; "
            "taking the lock over",
            file=sys.stderr,
        )
    me = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    return fd


def _release(fd: int, path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()  # while still locked, so nobody takes over a file on its way out
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _read(fd: int) -> dict | None:
    try:
        data = os.pread(fd, 4096, 0)
        return json.loads(data) if data.strip() else None
    except (OSError, ValueError):
        return {"pid": "?", "host": "?"}  # unreadable: treat as a stale holder


def _alive(who: dict | None) -> bool:
    if not who or who.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(who["pid"]), 0)
    except (ProcessLookupError, ValueError, TypeError, KeyError):
        return False
    except PermissionError:
        return True
    return True


def _describe(who: dict) -> str:
    since = who.get("since")
    when = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))}" if since else ""
    return f"pid {who.get('pid', '?')} on {who.get('host', '?')}{when}"


def _busy(folder: Path, flag: str) -> UserError:
    who = holder(folder)
    by = _describe(who) if who else "another process"
    return UserError(
        f"{flag}: {folder} is in use by another autoconfig run ({by}); wait for it to finish "
        f"or choose another --{flag}"
    )
