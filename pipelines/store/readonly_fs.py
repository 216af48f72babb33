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

DuckDB reads a file it opened here as ``seek(offset)`` then ``read(n)`` on one shared file object,
from several of its threads at once (one per row group, even with ``threads = 1``), so a plain
file's single position would let one thread's seek move another's read: Parquet with many row
groups then fails with "TProtocolException: Invalid data". Files opened here keep one position per
thread and read with ``os.pread``, so every seek-then-read pair reads what it sought.
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
    """A read-only binary file whose position is per thread; reads are ``os.pread`` at it."""

    def __init__(self, path: str):
        super().__init__()
        self.name = path
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size
        self._local = threading.local()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return getattr(self._local, "pos", 0)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.tell(), io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: negative seek position {base + offset}")
        self._local.pos = base + offset
        return self._local.pos

    def read(self, size: int = -1) -> bytes:
        pos = self.tell()
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
        self._local.pos = pos
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
        if (not name.startswith("_") and not isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod))) \
                or name in _ASYNC_MUTATORS:
            setattr(cls, name, _refuse(name))


_lock_writes(ReadOnlyDataFS)


def refused_methods() -> list[str]:
    """The public methods the readers' file system refuses (tests list them)."""
    return sorted(n for n, m in inspect.getmembers(ReadOnlyDataFS, callable) if getattr(m, "__name__", "") == n
                  and m.__qualname__.startswith("_refuse"))
