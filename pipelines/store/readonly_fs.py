"""The file system DuckDB readers get: ``wisedata://<path under data/>``, read-only.

DuckDB has no read-only file access setting: ``allowed_directories`` / ``allowed_paths`` open a
folder for reading *and* writing, so a reader allowed to read ``data/`` could also ``COPY ... TO``
over a stage output or delete a partition folder. Readers (``pipelines.store.db``) therefore turn DuckDB's
own file access off altogether (``enable_external_access = false``, no allowed folder) and read the
artifacts through this fsspec file system, registered on their connection and allowed by its
protocol prefix. It passes through only the calls that read (open in ``rb`` mode, ls, info, glob,
...); every other public method, present or added by a later fsspec, raises PermissionError, so
``COPY TO``, ``EXPORT DATABASE``, partitioned writes and ``ATTACH`` of a new file cannot write or
delete anything, whatever the statement. Paths cannot climb above ``data/`` (fsspec's DirFileSystem
refuses ``..`` past its root).

How DuckDB's Python file system bridge calls an open file (traced with DuckDB 2.0.1, 2026-12):
- a read at an offset (Parquet row groups, the JSON reader's parallel scan) is ``seek(offset)`` then
  ``read(n)``, in one call from DuckDB but not atomically: another thread's seek and read on the
  same file object often run in between (the GIL changes hands between the two);
- a sequential read (the JSON reader's sample and its read of a small file) is ``read(n)`` with no
  seek, repeated until it returns ``b""``, continuing where the file's last read ended, and the
  next ``read(n)`` may come from another DuckDB thread;
- DuckDB's worker threads are not Python threads: each call from one runs under a new Python thread
  state, so ``threading.local`` there lasts one call, not the thread's life.
A file opened here therefore keeps one position for the file (where its last read ended, or its
last seek), under a lock, like an OS file; a seek also leaves a note for the thread that made it,
and that thread's next read reads at the note (with ``os.pread``) whatever other threads sought
since. A note is dropped once a sequential read (a read with no note of its own) moves the file's
position, so a seek that was not followed by its thread's read cannot redirect a later one.
(With one position per thread, as before, a worker's sequential reads all started at 0: the JSON
reader read a small file over and over and failed, "Malformed JSON" or "only 0 bytes returned".)
"""
from __future__ import annotations

import inspect
import io
import os
import threading
from pathlib import Path

from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

from pipelines.store.dvc_relink import reappears

PROTOCOL = "wisedata"
PREFIX = f"{PROTOCOL}://"

# Public methods that only read; everything else public (and the async mutators) is refused.
READ_METHODS = frozenset({
    "open", "ls", "info", "glob", "find", "walk", "du", "exists", "lexists", "isdir", "isfile", "size",
    "sizes", "modified", "created", "ukey", "checksum", "cat", "cat_file", "cat_ranges", "head", "tail",
    "read_block", "read_bytes", "read_text", "expand_path", "invalidate_cache", "unstrip_protocol",
    "stat", "listdir", "to_json", "to_dict", "clear_instance_cache", "current", "from_json", "from_dict",
})
_ASYNC_MUTATORS = ("_rm", "_rm_file", "_cp_file", "_copy", "_pipe", "_pipe_file", "_put", "_put_file",
                   "_get", "_get_file", "_mkdir", "_makedirs")


class PositionalReader(io.RawIOBase):
    """A read-only binary file for DuckDB's threads (module docstring): one position per open file,
    and each thread's read after its own seek reads where that seek went. Reads are ``os.pread``."""

    def __init__(self, path: str):
        super().__init__()
        self.name = path
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size
        self._lock = threading.Lock()
        self._pos = 0  # the file's position: where the last read ended, or the last seek
        self._moves = 0  # sequential reads that moved the position; a note older than one is stale
        self._sought = threading.local()  # .note: (offset, self._moves) of this thread's last seek

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _note(self) -> int | None:
        """This thread's seek offset, if its next read should read there (caller holds the lock)."""
        note = getattr(self._sought, "note", None)
        return note[0] if note is not None and note[1] == self._moves else None

    def tell(self) -> int:
        with self._lock:
            note = self._note()
            return self._pos if note is None else note

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._lock:
            note = self._note()
            here = self._pos if note is None else note
            base = {io.SEEK_SET: 0, io.SEEK_CUR: here, io.SEEK_END: self._size}[whence]
            if base + offset < 0:
                raise ValueError(f"{self.name}: negative seek position {base + offset}")
            self._pos = base + offset
            self._sought.note = (self._pos, self._moves)
            return self._pos

    def read(self, size: int = -1) -> bytes:
        with self._lock:
            at = self._note()
            self._sought.note = None
            if at is None:  # sequential: continue the file's position, and hold it while reading
                data = self._pread(self._pos, size)
                if data:
                    self._pos += len(data)
                    self._moves += 1
                return data
        data = self._pread(at, size)  # after this thread's seek: other threads may read meanwhile
        with self._lock:
            self._pos = at + len(data)
        return data

    def _pread(self, pos: int, size: int | None) -> bytes:
        if size is None or size < 0:
            size = max(self._size - pos, 0)
        parts = []
        while size > 0:  # pread may return fewer bytes than asked before the end of the file
            chunk = os.pread(self._fd, size, pos)
            if not chunk:
                break
            parts.append(chunk)
            pos += len(chunk)
            size -= len(chunk)
        return b"".join(parts)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer)[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


class ReadOnlyError(PermissionError):
    """A reader tried to write, delete or move a file."""


def _refuse(name: str):
    def refused(self, *args, **kwargs):
        raise ReadOnlyError(f"the SQL readers are read-only: {name} is refused")
    refused.__name__ = name
    return refused


class ReadOnlyDataFS(DirFileSystem):
    """``wisedata://x`` is ``<root>/data/x``, for reading only."""

    protocol = PROTOCOL
    cachable = False  # one instance per root, never shared through fsspec's instance cache

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir).resolve()
        super().__init__(path=str(self.data_dir), fs=LocalFileSystem())

    def open(self, path, mode="rb", *args, **kwargs):
        if mode not in ("rb", "r"):
            raise ReadOnlyError(f"the SQL readers are read-only: open({path!r}, {mode!r}) is refused")
        if mode == "rb":
            full = self._join(path)
            try:
                return PositionalReader(full)
            except FileNotFoundError:
                if not self._back_from_dvc(path, lambda: os.path.isfile(full)):
                    raise
                return PositionalReader(full)
        return super().open(path, mode, *args, **kwargs)

    def glob(self, path, **kwargs):
        # DuckDB globs a view's path before it opens it
        found = super().glob(path, **kwargs)
        if not found and self._back_from_dvc(path, lambda: bool(super(ReadOnlyDataFS, self).glob(path, **kwargs))):
            found = super().glob(path, **kwargs)
        return found

    def _back_from_dvc(self, path, found) -> bool:
        """Whether a missing `path` came back while DVC deleted and restored it after its stage
        (pipelines.store.dvc_relink)."""
        rel = Path(os.path.relpath(self._join(path), self.data_dir.parent)).as_posix()
        return reappears(self.data_dir.parent, rel, found)

    def _open(self, path, mode="rb", *args, **kwargs):
        return self.open(path, mode, *args, **kwargs)


def _lock_writes(cls) -> None:
    """Replace every public method not in READ_METHODS (and the async mutators) by a refusal."""
    for name, member in inspect.getmembers(cls, callable):
        if inspect.isclass(member) or name in READ_METHODS or name in ("open", "_open"):
            continue
        if (not name.startswith("_")
                and not isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod))) \
                or name in _ASYNC_MUTATORS:
            setattr(cls, name, _refuse(name))


_lock_writes(ReadOnlyDataFS)


def refused_methods() -> list[str]:
    """The public methods the readers' file system refuses (tests list them)."""
    return sorted(n for n, m in inspect.getmembers(ReadOnlyDataFS, callable) if getattr(m, "__name__", "") == n
                  and m.__qualname__.startswith("_refuse"))
