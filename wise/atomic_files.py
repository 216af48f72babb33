"""Atomic file writes: write to ``.<name>.tmp-<pid>`` beside the target, then rename over it.

A reader (or a later stage) never sees a half-written file under the real name: the rename is
atomic on one filesystem, and an interrupted writer leaves only a hidden temporary. The pid in the
temporary's name says whose it is, so the next write of the same artifact removes the temporaries
of writers that are no longer alive (``kill -9`` during a stage leaves one behind) and leaves those
of live writers alone. The ignore files (.gitignore, .dvcignore) match ``.*.tmp-*`` everywhere
under ``data/``.

The renamed file gets the mode a plain ``open()`` would give it (0666 minus the umask, e.g.
0644): some writers create their file private (safetensors' ``save_file`` and ``mkstemp`` give
0600), and an artifact nobody else can read breaks a shared checkout or a cluster's workers.
"""
from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_TMP = re.compile(r"\.tmp-(\d+)(?:\..*)?$")  # ".tmp-<pid>" and DuckDB's ".tmp-<pid>.wal"


def temporary_name(path: str | os.PathLike, pid: int | None = None) -> Path:
    """``dir/.<name>.tmp-<pid>`` for ``dir/<name>``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid() if pid is None else pid}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this machine (signal 0 probes without sending)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries of ``path`` (and their side files, e.g. ``.wal``) left by writers
    whose pid is not alive; returns what was removed. The current process's own are kept."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    prefix = f".{path.name}.tmp-"
    removed = []
    for cand in path.parent.iterdir():
        if not cand.name.startswith(prefix):
            continue
        m = _TMP.search(cand.name[len(path.name) + 1:])
        if m is None:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or pid_alive(pid):
            continue
        if cand.is_dir():
            continue  # never ours: writers here create files only
        cand.unlink(missing_ok=True)
        removed.append(cand)
    return removed


def current_umask() -> int:
    """The process's umask, read without changing it (/proc), else by setting it back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ordinary_mode(path: str | os.PathLike) -> None:
    """Give ``path`` the mode a plain ``open()`` (``mkdir`` for a folder) would: 0666 (0777)
    minus the umask."""
    path = Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~current_umask())


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """``with atomic_path(p) as tmp: write(tmp)``: on success ``tmp`` replaces ``p``; on an error
    it is removed and ``p`` is left as it was. Stale temporaries of ``p`` are cleaned up first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = temporary_name(path)
    tmp.unlink(missing_ok=True)
    try:
        yield tmp
        if tmp.exists():
            ordinary_mode(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


# -- whole folders (a checkpoint, a converted model) ----------------------------------------------
def staging_folder(out: str | os.PathLike) -> Path:
    """``dir/.<name>.staging-<pid>`` beside ``out``, emptied; leftovers of dead writers removed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_dead_staging(out)
    staging = out.with_name(f".{out.name}.staging-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    return staging


def remove_dead_staging(out: str | os.PathLike) -> None:
    """Staging / backup folders of ``out`` left by a writer that was killed (kill -9 skips every
    cleanup); those of live writers are left alone."""
    out = Path(out)
    for prefix in (f".{out.name}.staging-", f".{out.name}.old-"):
        for path in out.parent.glob(prefix + "*"):
            pid = path.name[len(prefix):]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def publish_folder(staging: str | os.PathLike, out: str | os.PathLike) -> None:
    """Put the folder `staging` in place of `out`. Each rename is atomic; a folder cannot replace a
    non-empty one in one rename, so the old folder is moved aside first and put back if the second
    rename fails."""
    staging, out = Path(staging), Path(out)
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.rename(out, old)
    try:
        os.rename(staging, out)
    except OSError:
        if old.exists():
            os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
