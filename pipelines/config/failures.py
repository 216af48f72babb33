"""How a failed stage reports: one line on stderr naming the example and the cause, the full
traceback in the stage's log file (``logs/<stage>.log``, not an output, ignored by git).

A failure inside a Ray task reached the user as some sixty lines: Ray's wrapper, the remote
traceback and the driver's, with the one useful sentence somewhere inside. The worker tags the
exception with the example id(s) of its work item (``pipelines.compute.work.example_ids``; a note that
survives the trip through Ray), and this module digs out that tag and the root cause (one line,
wrapped here):

    traces: example synthchain-17@4096: FileNotFoundError: data/models/x/model.safetensors: ...
        (traceback: logs/traces.log)
"""
from __future__ import annotations

import datetime
import re
import traceback
from pathlib import Path

LOG_DIR = Path("logs")
_EXAMPLE_NOTE = re.compile(r"while running example (.+)$")


def _chain(exc: BaseException):
    """`exc`, the cause a Ray task error wraps, and their __cause__ / __context__, outermost first."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        # `raise ... from None` says the context is not the cause (json's decoder hides a StopIteration so)
        exc = getattr(exc, "cause", None) if isinstance(getattr(exc, "cause", None), BaseException) else \
            (exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__))


def example_of(exc: BaseException) -> str | None:
    """The example id(s) a worker tagged the exception with, if any."""
    for e in _chain(exc):
        for note in getattr(e, "__notes__", ()) or ():
            m = _EXAMPLE_NOTE.search(note)
            if m:
                return m.group(1)
    return None


def cause_of(exc: BaseException) -> BaseException:
    """The innermost exception that is not Ray's wrapper (what actually went wrong)."""
    chain = list(_chain(exc))
    own = [e for e in chain if not type(e).__module__.startswith("ray.")]
    return own[-1] if own else chain[-1]


def first_line(exc: BaseException) -> str:
    line = next((s.strip() for s in str(exc).splitlines() if s.strip()), "")
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def one_line(stage: str, exc: BaseException) -> str:
    """``<stage>: example <id>: <Type>: <first line of the cause>``; the example part only when
    the failure belongs to a work item, and not repeated when the message already names it."""
    cause = cause_of(exc)
    text = first_line(cause)
    example = example_of(exc)
    if example and f"example {example}" not in text:
        text = f"example {example}: {text}"
    return text if text.startswith(f"{stage}:") else f"{stage}: {text}"


def log_failure(stage: str, exc: BaseException, log_dir: Path = LOG_DIR) -> Path:
    """Append the full traceback (Ray's remote one included) to ``logs/<stage>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"{stage.replace('@', '-')}.log"
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with path.open("a") as fh:
        fh.write(f"--- {stamp} {stage} failed: {one_line(stage, exc)}\n")
        fh.write("".join(traceback.format_exception(exc)))
    return path
