"""Is a process still there: what leftovers name their owner by (leases, temp files), checked without a signal.

A pid alone lies once the kernel reuses it, so a record keeps the process's start time too
(Linux: field 22 of /proc/<pid>/stat, in clock ticks since boot).
"""

from __future__ import annotations

import os


def stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state first), [] where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def process_started(pid: int) -> str:
    """The kernel's start time of ``pid`` (ticks since boot), "" where it cannot be read."""
    fields = stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


def process_start_unix(pid: int) -> float | None:
    """When ``pid`` started, as a Unix time (Linux), or None where that cannot be read."""
    ticks = process_started(pid)
    if not ticks:
        return None
    try:
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + int(ticks) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None


def process_alive(pid: int, started: str = "") -> bool:
    """Whether process ``pid`` runs, and is the one that started at ``started`` (not a later one given its pid)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    fields = stat_fields(pid)
    if fields and fields[0] in ("Z", "X"):  # killed and never reaped (an orphan under an init that does not reap)
        return False
    return not started or (fields[19] if len(fields) > 19 else "") in ("", started)


def owner_gone(pid: int, made_unix: float) -> bool:
    """A file made by ``pid`` at ``made_unix`` is a leftover: that process is gone, or the pid now belongs to a
    process that started after the file was made."""
    if not process_alive(pid):
        return True
    started = process_start_unix(pid)
    return started is not None and started > made_unix + 1.0
