"""Budget alerts from inside a flow run: Prefect events, notification blocks, and the watch-loop guard."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from typing import Any, Callable

from prefect.events import emit_event

from thrifty.money.budget import AlertState, Snapshot, due_alerts, gpus_per_node, snapshot, stop_margin_s
from thrifty.config import RunConfig
from thrifty.config.echo import redact_urls
from thrifty.money.estimate import Estimate
from thrifty.money.ledger import Attempt
from thrifty.money.utilisation import Starvation, StarvationWatch, wait_readings
from thrifty.runs import run_key
from thrifty.storage import NotFound, Store

NOTIFY_TIMEOUT_S = 15.0  # a slow webhook must not hold up the watch loop or a hook

log = logging.getLogger("thrifty.alerts")


class RedactUrls(logging.Filter):
    """Cuts every URL in a record to its scheme and host. On the HTTP client's loggers: at INFO and below they
    name each request's URL, and a webhook's holds its token."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_urls(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


for _name in ("httpx", "httpcore"):
    if not any(isinstance(f, RedactUrls) for f in logging.getLogger(_name).filters):
        logging.getLogger(_name).addFilter(RedactUrls())


def notify(targets: list[str], subject: str, body: str, logger: logging.Logger | logging.LoggerAdapter = log) -> int:
    """Send ``body`` to each 'block-type/name' notification block; returns how many succeeded. Never raises."""
    sent = 0
    for ref in targets:
        done = threading.Event()
        errors: list[BaseException] = []

        def send(ref: str = ref) -> None:
            try:
                from prefect.blocks.core import Block

                Block.load(ref).notify(body=body, subject=subject)
            except BaseException as exc:  # noqa: BLE001 - reported below, never raised
                errors.append(exc)
            finally:
                done.set()

        threading.Thread(target=send, daemon=True, name=f"notify-{ref}").start()
        if not done.wait(NOTIFY_TIMEOUT_S):
            logger.warning("notification to %s timed out after %.0f s", ref, NOTIFY_TIMEOUT_S)
        elif errors:  # the error quotes the webhook's URL, token and all: only its host reaches the log
            logger.warning("notification to %s failed: %s: %s", ref, type(errors[0]).__name__,
                           redact_urls(str(errors[0])))
        else:
            sent += 1
    return sent


def run_resource(run_id: str) -> dict[str, str]:
    return {"prefect.resource.id": f"thrifty.run.{run_id}", "prefect.resource.name": run_id}


def deadline_switch(config: RunConfig, message: str, payload: dict[str, Any], logger: Any) -> None:
    """A move between spot and on-demand to meet ``compute.deadline_h``: logged, the ``thrifty.deadline.switch``
    event, and the notification blocks of ``budget.notify`` (on-demand costs several times spot)."""
    logger.warning("deadline: %s", message)
    emit_event(event="thrifty.deadline.switch", resource=run_resource(config.run_name), payload=payload)
    notify(config.budget.notify, f"Thrifty deadline: {config.run_name}", message, logger)


class BudgetGuard:
    """Watches spend during the run: emits events and notifications at thresholds, says when to stop.

    The stop comes while ``spend + burn x reserve`` is still under the cap, the reserve being the gap
    until the next look (the poll interval, or the loop's measured pace when slower) plus the stop
    itself (``stop_margin_s``, after which the launcher makes it a hard stop). Until throughput is
    measured, the projection is the pre-launch estimate's.
    """

    def __init__(self, config: RunConfig, store: Store, run_id: str, logger: Any, estimate: Estimate | None = None,
                 poll_s: float = 1.0):
        self.config, self.store, self.run_id, self.logger = config, store, run_id, logger
        self.estimate, self.poll_s = estimate, poll_s
        self.key = run_key(run_id, "budget-alerts.json")
        try:
            self.state = AlertState(**json.loads(store.get_bytes(self.key)))
        except (NotFound, ValueError, TypeError):  # none yet, or unreadable: alert again rather than never
            self.state = AlertState()
        self.gpus = gpus_per_node(config)
        self.margin_s = stop_margin_s(config)
        self._first: tuple[float, int] | None = None  # (time, step) of the first progress seen this attempt
        self._attempt = 0
        self._last_check: float | None = None
        self.gap_s = poll_s  # the loop's pace: the slower of the poll interval and the measured gap between looks

    @property
    def reserve_s(self) -> float:
        return self.margin_s + self.gap_s

    def steps_per_s(self, attempt_number: int, step: int | None, now: float) -> float | None:
        if step is None:
            return None
        if self._first is None or attempt_number != self._attempt:
            self._first, self._attempt = (now, step), attempt_number
            return None
        t0, s0 = self._first
        return (step - s0) / (now - t0) if now > t0 and step > s0 else None

    def check(self, attempts: list[Attempt], progress: dict[str, Any],
              reached_end: Callable[[], bool] | None = None) -> tuple[Snapshot, bool]:
        """One look at the money; returns the snapshot and whether the job must be stopped now. ``reached_end`` is
        asked before the cap says so: a job that has just reached its end is never alerted or stopped as over
        budget."""
        now = time.time()
        if self._last_check is not None:
            self.gap_s = max(self.poll_s, 1.5 * (now - self._last_check))  # a slow look leaves less time
        self._last_check = now
        rate = self.steps_per_s(len(attempts), progress.get("step"), now)
        est = self.estimate
        if est is not None:
            progress = {**progress, "estimated_steps": est.total_steps}
        snap = snapshot(attempts, progress, rate, self.config.budget, self.gpus, now,
                        estimated_step_s=est.step_s if est else None,
                        planned_usd_per_hour=est.usd_per_hour if est else 0.0)
        before = (list(self.state.fired), self.state.last_burn_alert_unix)
        exceeded = False
        for alert in due_alerts(snap, self.config.budget, self.state, self.run_id, now, self.reserve_s,
                                est.usd_per_hour if est else None):
            if alert.kind == "exceeded" and reached_end is not None and reached_end():
                continue
            exceeded = exceeded or alert.kind == "exceeded"
            self._send(alert.kind, alert.message, alert.payload)
        if (list(self.state.fired), self.state.last_burn_alert_unix) != before:
            self.store.put_bytes(self.key, json.dumps(asdict(self.state)).encode())
        return snap, exceeded

    def stopped(self, message: str, payload: dict[str, Any]) -> None:
        """The job stopped at the cap: ``thrifty.budget.stopped``, which the server-side backstop waits for (an
        event only: the run's end is notified once, by its end hook)."""
        self._send("stopped", message, payload, notify_blocks=False)

    def _send(self, kind: str, message: str, payload: dict[str, Any], notify_blocks: bool = True) -> None:
        self.logger.warning("budget: %s", message)
        emit_event(event=f"thrifty.budget.{kind}", resource=run_resource(self.run_id), payload=payload)
        if notify_blocks:
            notify(self.config.budget.notify, f"Thrifty budget: {self.run_id}", message, self.logger)


class StarvedAlert:
    """The GPU starved of data (``train.starved_alert_share`` of step time waiting, for ``starved_alert_minutes``):
    the ``thrifty.gpu.starved`` event and the notification blocks of ``budget.notify``, once per spell, priced at the
    run's $/h. Reads the data-wait share of the node's metric lines, so it works on a CPU too."""

    def __init__(self, config: RunConfig, logger: Any):
        self.config, self.logger = config, logger
        self.watch = StarvationWatch(config.train.starved_alert_share, config.train.starved_alert_minutes)

    def check(self, records: list[dict[str, Any]], usd_per_hour: float, now: float | None = None) -> Starvation | None:
        found = self.watch.check(wait_readings(records), time.time() if now is None else now, usd_per_hour)
        if found is not None:
            run_id = self.config.run_name
            message = found.message(run_id)
            self.logger.warning("utilisation: %s", message)
            emit_event(event="thrifty.gpu.starved", resource=run_resource(run_id),
                       payload={"run_id": run_id, "data_wait_share": round(found.share, 4),
                                "minutes": round(found.minutes, 1), "since_unix": found.since_unix,
                                "usd_per_hour_waiting": round(found.usd_per_hour, 5)})
            notify(self.config.budget.notify, f"Thrifty GPU starved: {run_id}", message, self.logger)
        return found
