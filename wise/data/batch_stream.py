"""One batch stream for every training loop: items ``make(i)`` for i = start, start+1, ... in
order, made ``prefetch`` ahead by ``workers`` processes (0: in this process), so a GPU never waits
for Python text generation. What a stream makes is its caller's: ``setup`` (picklable, e.g. a
``functools.partial`` of a module-level function) runs once in each worker and returns ``make``;
batch i is a function of i alone, so the stream gives the same batches with any worker count.

Workers start from a forkserver, not a fork: the caller may already hold a CUDA context (a GPU run
trains several models in one process), and forking a process with one is unsafe. The server starts
clean and imports ``preload`` (the modules that define ``setup``) once, so each worker starts in a
fraction of a second.
"""
from __future__ import annotations

import collections
import multiprocessing as mp
import os
from typing import Any, Callable, Iterable

_WORKER: dict = {}


def default_workers(requested: int) -> int:
    """-1: every core but two (the training process and the GPU feeder), at least one."""
    return requested if requested >= 0 else max(1, (os.cpu_count() or 2) - 2)


def _init_worker(setup: Callable[[], Callable[[int], Any]]) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER["make"] = setup()


def _make(index: int):
    return _WORKER["make"](index)


class BatchStream:
    """``next(stream)`` -> the next item; a context manager, so the pool is closed."""

    def __init__(self, setup: Callable[[], Callable[[int], Any]], start: int = 0, workers: int = 0,
                 prefetch: int = 16, preload: Iterable[str] = ()):
        self.next_index, self.prefetch = start, max(1, prefetch)
        self.pending: collections.deque = collections.deque()
        self.pool = self.make = None
        if workers > 0:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload([__name__, *preload])
            self.pool = ctx.Pool(workers, _init_worker, (setup,))
        else:
            self.make = setup()

    def __next__(self):
        if self.pool is None:
            item = self.make(self.next_index)
        else:
            while len(self.pending) < self.prefetch:
                self.pending.append(self.pool.apply_async(_make, (self.next_index + len(self.pending),)))
            item = self.pending.popleft().get()
        self.next_index += 1
        return item

    def __iter__(self):
        return self

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def __enter__(self) -> "BatchStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
