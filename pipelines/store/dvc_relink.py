"""DVC's moment in which a finished stage's output is missing, and how readers wait it out.

After a stage's command ends, `dvc repro` commits each cached output and checks it out again
(dvc_data's relink: the workspace file is deleted, then copied back from the cache under a temporary
name and renamed into place). Between the delete and the rename the file is missing, although the
stage wrote it by an atomic rename and nothing failed. DVC holds the output's write lock in
``.dvc/tmp/rwlock`` (JSON, ``"write": {absolute path: {"pid", "cmd"}}``) from the stage's start until
after that checkout, so a reader that finds an artifact missing while DVC holds its write lock waits,
at most WAIT_S, for it to come back; an artifact no stage is writing is missing at once.
"""
from __future__ import annotations

import fnmatch
import json
import os
import time
from pathlib import Path
from typing import Callable

RWLOCK = Path(".dvc") / "tmp" / "rwlock"
WAIT_S = 2.0  # the relink of a stage's outputs takes milliseconds; a first-time output is not waited for longer
POLL_S = 0.01


def write_locked(root: Path) -> list[str] | None:
    """The paths (relative to root, posix) DVC holds write locks on now; None while the lock file
    is being rewritten (DVC writes it in place), so the caller asks again."""
    try:
        lock = json.loads((root / RWLOCK).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        return None
    base = os.path.realpath(root)
    return [Path(os.path.relpath(os.path.realpath(p), base)).as_posix() for p in lock.get("write", {})]


def reappears(root: Path, pattern: str, found: Callable[[], bool]) -> bool:
    """found(), asked again every POLL_S for at most WAIT_S while DVC holds a write lock on a path
    matching `pattern` (relative to root, posix; fnmatch wildcards allowed)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        if found():
            return True
        locked = write_locked(root)
        if locked is not None and not any(fnmatch.fnmatchcase(p, pattern) for p in locked):
            return False
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
