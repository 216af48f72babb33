"""Finding the Ray processes a test started (by a marker in their environment), to check that none
is left behind and to kill leftovers."""
from __future__ import annotations

import os
from pathlib import Path


def processes_with(env_entry: str) -> list[int]:
    """Pids of this user's processes whose environment holds `env_entry` (``KEY=value``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if env_entry.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(int(pid))
        except OSError:  # gone, or not ours
            continue
    return found
