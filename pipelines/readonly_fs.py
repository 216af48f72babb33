"""The file system DuckDB readers get: ``wisedata://<path under data/>``, read-only.

DuckDB has no read-only file access setting: ``allowed_directories`` / ``allowed_paths`` open a
folder for reading *and* writing, so a reader allowed to read ``data/`` could also ``COPY ... TO``
over a stage output or delete a partition folder. Readers (``pipelines.db``) therefore turn DuckDB's
own file access off altogether (``enable_external_access = false``, no allowed folder) and read the
artifacts through this fsspec file system, registered on their connection and allowed by its
protocol prefix. It passes through only the calls that read (open in ``rb`` mode, ls, info, glob,
...); every other public method, present or added by a later fsspec, raises PermissionError, so
``COPY TO``, ``EXPORT DATABASE``, partitioned writes and ``ATTACH`` of a new file cannot write or
delete anything, whatever the statement. Paths cannot climb above ``data/`` (fsspec's DirFileSystem
refuses ``..`` past its root).
"""
from __future__ import annotations

import inspect
from pathlib import Path

from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

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
        super().__init__(path=str(Path(data_dir).resolve()), fs=LocalFileSystem())

    def open(self, path, mode="rb", *args, **kwargs):
        if mode not in ("rb", "r"):
            raise ReadOnlyError(f"the SQL readers are read-only: open({path!r}, {mode!r}) is refused")
        return super().open(path, mode, *args, **kwargs)

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
