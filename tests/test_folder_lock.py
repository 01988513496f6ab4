"""The output folder's lock on filelock: filelock's lock is the one that counts, a contender
never erases the holder's record, the lock is re-entrant within one process, and a lock that
could not be taken leaves no folder behind. (The CLI's busy and stale-holder messages are in
tests/test_probes.py.)"""

from __future__ import annotations

import os

import pytest
from filelock import FileLock
from helpers import held_elsewhere

from autoconfig.base.errors import UserError
from autoconfig.base.folderlock import LOCK_NAME, MUTEX_NAME, folder_lock, holder


def test_a_folder_held_through_filelock_is_refused_naming_the_flag(tmp_path) -> None:
    out = tmp_path / "held"
    out.mkdir()
    other = FileLock(str(out / MUTEX_NAME), timeout=0, thread_local=False)
    other.acquire()  # another holder of the same lock file (its own descriptor)
    try:
        busy = r"^save: .* is in use by another autoconfig run"
        with pytest.raises(UserError, match=busy), folder_lock(out, flag="save"):
            pass
    finally:
        other.release()
    with folder_lock(out):  # free again once the other holder let go
        assert holder(out)["pid"] == os.getpid()


def test_contenders_never_erase_the_holders_record(tmp_path) -> None:
    out = tmp_path / "busy"
    with held_elsewhere(out) as other:
        for _ in range(3):  # each try opens the lock file; none may truncate what it names
            with pytest.raises(UserError, match=f"pid {other.pid} on "), folder_lock(out):
                pass
        assert holder(out)["pid"] == other.pid
    with folder_lock(out):  # the kernel released the dead holder's lock
        pass


def test_the_lock_is_reentrant_and_a_created_folder_is_removed_whole(tmp_path) -> None:
    out = tmp_path / "new"
    with folder_lock(out):
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME, MUTEX_NAME]
        with folder_lock(out / "." / ""):  # the same folder, written another way
            assert holder(out)["pid"] == os.getpid()
        assert (out / LOCK_NAME).exists()  # the inner exit does not release
    assert not out.exists()


def test_a_folder_that_is_kept_keeps_only_its_own_files(tmp_path) -> None:
    out = tmp_path / "kept"
    out.mkdir()
    (out / "results.csv").write_text("a\n1\n")
    with folder_lock(out):
        pass
    assert [p.name for p in out.iterdir()] == ["results.csv"]
