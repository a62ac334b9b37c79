"""A run's cost ledger: every attempt of every job, as its watcher saw it and as the node metered itself.

``runs/<run_id>/ledger/<job_id>.jsonl``   the watcher of that job alone rewrites it: one :class:`Attempt` a line.
                                          A job never rewrites another job's rows, so no row is lost when two
                                          watchers overlap.
``runs/<run_id>/ledger.jsonl``            stores written before per-job files: read, never written.
``runs/<run_id>/meter/<job_id>/<ms>.json`` the node's own record of one attempt (:class:`MeterRecord`): when it
                                          began to bill, its last heartbeat, how it ended, its price.

:func:`read_attempts` merges the two views so that every dollar is counted even when the watcher
died (a killed ``thrifty run``, a closed laptop): an attempt its watcher left open ends at the
job's last sign of life once the node is gone, and attempts the watcher never saw come from the
node's records. Both rules err towards counting more, never less.

A price that moved while an attempt ran is kept as price segments (``segments``: from when, $/hour, source), each
interval costed at the price in force; rows written before segments existed have one price and read as before.
"""

from __future__ import annotations

import json
import socket
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from thrifty.procs import process_alive
from thrifty.runs import run_key
from thrifty.storage import NotFound, Store

METER_BEAT_S = 60.0  # a node rewrites its record at least this often while it trains
METER_STALE_S = 3 * METER_BEAT_S  # a record silent this long belongs to a node that is gone


Segment = tuple[float, float, str]  # (from when, $/hour of one node, where that price came from)


def segments_cost_usd(segments: list, start: float, end: float) -> float:
    """Dollars of one node from ``start`` to ``end``, each interval at the price in force then: a segment's price
    holds from its time (the first from ``start``) until the next segment's."""
    total = 0.0
    for i, seg in enumerate(segments):
        begin = start if i == 0 else max(start, float(seg[0]))
        until = end if i + 1 == len(segments) else min(end, float(segments[i + 1][0]))
        total += max(0.0, until - begin) / 3600.0 * float(seg[1])
    return total


@dataclass
class Attempt:
    """One rented instance's life inside a job: a row of the run's cost ledger."""

    job_id: str
    number: int  # 1 for the first attempt, +1 per recovery
    cloud: str
    region: str
    instance: str
    spot: bool
    usd_per_hour: float  # price of one node
    nodes: int
    started_unix: float
    ended_unix: float | None = None
    end_reason: str | None = None  # succeeded | preempted | failed | cancelled | budget; None while running
    exit_code: int | None = None
    task_id: str | None = None  # SkyPilot's SKYPILOT_TASK_ID (stable across a job's recoveries); None locally
    # the prices in force, when it changed while the attempt ran: [[from_unix, usd_per_hour, source], ...], the first
    # from the start; usd_per_hour is the last. None: one price all along (and every ledger written before these)
    segments: list | None = None
    price_source: str = ""  # where usd_per_hour came from (a cloud's source, SkyPilot's catalog, the dated table)
    tags: dict[str, str] | None = None  # the run's cost allocation tags (RunConfig.tags) when the row was written

    def hours(self, now: float | None = None) -> float:
        end = self.ended_unix if self.ended_unix is not None else (now or time.time())
        return max(0.0, end - self.started_unix) / 3600.0

    def cost_usd(self, now: float | None = None, until: float | None = None) -> float:
        """Dollars up to its end (or ``now`` while open), or up to ``until`` when earlier: each interval at its price."""
        end = self.ended_unix if self.ended_unix is not None else (now or time.time())
        if until is not None:
            end = min(end, until)
        return segments_cost_usd(self.segments or [[self.started_unix, self.usd_per_hour, self.price_source]],
                                 self.started_unix, end) * self.nodes

    def repriced(self, usd_per_hour: float, source: str, at_unix: float) -> bool:
        """The price changed at ``at_unix``: a new segment from then (True), or nothing when it is the same (False)."""
        if abs(usd_per_hour - self.usd_per_hour) < 1e-12:
            return False
        segs = list(self.segments or [[self.started_unix, self.usd_per_hour, self.price_source]])
        self.segments = [*segs, [max(at_unix, float(segs[-1][0])), usd_per_hour, source]]
        self.usd_per_hour, self.price_source = usd_per_hour, source
        return True

    def row(self) -> dict[str, Any]:
        return asdict(self)


class MeterRecord(BaseModel):
    """What a training node knows of its own attempt; rank 0 rewrites it while it trains."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    started_unix: float  # when this attempt began to bill (the launcher's start locally, boot time on a cloud)
    last_unix: float  # its latest heartbeat
    ended_unix: float | None = None
    end: str | None = None  # finished | budget | signal | error
    usd_per_hour: float  # one node, as matched on the node
    nodes: int
    cloud: str
    instance: str
    spot: bool
    price_source: str = ""
    segments: list = []  # [[from_unix, usd_per_hour, source], ...] as the node priced itself; [] = one price
    region: str = ""
    zone: str = ""
    host: str = ""  # the node's machine and rank-0 process: a node killed on the reader's machine is gone at once
    pid: int = 0
    pid_started: str = ""  # the process's start time as the kernel keeps it (a reused pid is another process)

    def gone(self, now: float) -> bool:
        """It ended, fell silent for METER_STALE_S, or is a process of this machine that no longer exists (its
        worker's machine was the node and it was killed: a rerun need not wait out the silence)."""
        if self.ended_unix is not None or now - self.last_unix > METER_STALE_S:
            return True
        return bool(self.pid) and self.host == socket.gethostname() and not process_alive(self.pid, self.pid_started)

    def end_unix(self, now: float) -> float:
        """When it stopped billing: its end, else a beat after the last sign of life, else (alive) now."""
        if self.ended_unix is not None:
            return self.ended_unix
        return min(now, self.last_unix + METER_BEAT_S) if self.gone(now) else now


def _jsonl(text: str) -> list[Attempt]:
    return [Attempt(**json.loads(line)) for line in text.splitlines() if line.strip()]


def write_job_attempts(store: Store, run_id: str, job_id: str, attempts: list[Attempt]) -> None:
    """The watcher of ``job_id`` records that job's attempts (object stores have no append: the job's file whole)."""
    mine = [a for a in attempts if a.job_id == job_id]
    if not mine:  # a job whose first attempt is not known yet: no empty file for a reader to find
        return
    store.put_bytes(run_key(run_id, "ledger", f"{job_id}.jsonl"), "".join(json.dumps(a.row()) + "\n" for a in mine).encode())


def ledger_rows(store: Store, run_id: str) -> list[Attempt]:
    """The watchers' rows, every job (the per-job files win over an older whole-run ledger), oldest first."""
    by_job: dict[str, list[Attempt]] = defaultdict(list)
    try:
        for a in _jsonl(store.get_bytes(run_key(run_id, "ledger.jsonl")).decode()):
            by_job[a.job_id].append(a)
    except NotFound:
        pass
    for obj in store.list(run_key(run_id, "ledger") + "/"):
        if obj.key.endswith(".jsonl"):
            try:
                rows = _jsonl(store.get_bytes(obj.key).decode())
            except NotFound:
                continue
            if rows:
                by_job[rows[0].job_id] = rows
    return sorted((a for rows in by_job.values() for a in rows), key=lambda a: (a.started_unix, a.number))


def meter_key(run_id: str, record: MeterRecord) -> str:
    return run_key(run_id, "meter", record.job_id, f"{int(record.started_unix * 1000)}.json")


def write_meter(store: Store, run_id: str, record: MeterRecord) -> None:
    store.put_bytes(meter_key(run_id, record), record.model_dump_json().encode())


def read_meters(store: Store, run_id: str) -> list[MeterRecord]:
    out = []
    for obj in store.list(run_key(run_id, "meter") + "/"):
        if obj.key.endswith(".json"):
            try:
                out.append(MeterRecord.model_validate_json(store.get_bytes(obj.key)))
            except (NotFound, ValidationError):
                continue
    return sorted(out, key=lambda m: m.started_unix)


def _adopt_node_prices(row: Attempt, node: MeterRecord) -> None:
    """A row its watcher left open stopped being repriced when the watcher died; the node kept pricing itself. The
    dearer of the two views over the row's life counts (never less than was billed)."""
    if not node.segments:
        return
    theirs = Attempt(**{**row.row(), "segments": [list(s) for s in node.segments], "usd_per_hour": node.usd_per_hour,
                        "price_source": node.price_source})
    if theirs.cost_usd() > row.cost_usd():
        row.segments, row.usd_per_hour, row.price_source = theirs.segments, theirs.usd_per_hour, theirs.price_source


def reconcile(rows: list[Attempt], meters: list[MeterRecord], now: float) -> list[Attempt]:
    """The watchers' rows with the nodes' records folded in (pure; see the module docstring)."""
    rows_by_job: dict[str, list[Attempt]] = defaultdict(list)
    for a in rows:
        rows_by_job[a.job_id].append(a)
    meters_by_job: dict[str, list[MeterRecord]] = defaultdict(list)
    for m in meters:
        meters_by_job[m.job_id].append(m)
    out: list[Attempt] = []
    for job in sorted(set(rows_by_job) | set(meters_by_job)):
        job_rows = [Attempt(**a.row()) for a in rows_by_job.get(job, [])]
        job_meters = meters_by_job.get(job, [])
        last = job_rows[-1] if job_rows else None
        if last is not None and last.ended_unix is None:
            # open: its watcher may be gone. Every node record from this attempt on belongs to it or to a
            # recovery its watcher never saw; once they have all stopped, so has the billing.
            later = [m for m in job_meters if m.started_unix >= last.started_unix - METER_STALE_S]
            if later and all(m.gone(now) for m in later):
                ended = max(m.end_unix(now) for m in later)
                last.ended_unix = max(ended, last.started_unix)
                last.end_reason = later[-1].end or "lost"
                _adopt_node_prices(last, later[-1])
        else:
            after = last.ended_unix if last is not None else float("-inf")
            for m in (m for m in job_meters if m.started_unix > after):  # attempts no watcher recorded
                number = (job_rows[-1].number + 1) if job_rows else 1
                job_rows.append(Attempt(job, number, m.cloud, m.region or "?", m.instance, m.spot, m.usd_per_hour,
                                        m.nodes, m.started_unix, m.end_unix(now) if m.gone(now) else None,
                                        (m.end or "lost") if m.gone(now) else None,
                                        segments=[list(s) for s in m.segments] or None, price_source=m.price_source))
        out.extend(job_rows)
    return sorted(out, key=lambda a: (a.started_unix, a.number))


def read_attempts(store: Store, run_id: str, now: float | None = None) -> list[Attempt]:
    """Every attempt of every job of the run: the ledger, with the nodes' own records folded in."""
    return reconcile(ledger_rows(store, run_id), read_meters(store, run_id), time.time() if now is None else now)


def job_ended_at_cap(store: Store, run_id: str, job_id: str) -> MeterRecord | None:
    """The node record of ``job_id`` that says it stopped itself at the budget cap, if any."""
    return next((m for m in reversed(read_meters(store, run_id)) if m.job_id == job_id and m.end == "budget"), None)
