"""Budget alerts from inside a flow run: Prefect events, notification blocks, and the watch-loop guard."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from typing import Any

from prefect.events import emit_event

from thrifty.budget import AlertState, Snapshot, due_alerts, gpus_per_node, snapshot
from thrifty.config import RunConfig
from thrifty.runs import Attempt, run_key
from thrifty.storage import NotFound, Store

NOTIFY_TIMEOUT_S = 15.0  # a slow webhook must not hold up the watch loop or a hook

log = logging.getLogger("thrifty.alerts")


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
        elif errors:
            logger.warning("notification to %s failed: %s", ref, errors[0])
        else:
            sent += 1
    return sent


def run_resource(run_id: str) -> dict[str, str]:
    return {"prefect.resource.id": f"thrifty.run.{run_id}", "prefect.resource.name": run_id}


class BudgetGuard:
    """Watches spend during the run: emits events and notifications at thresholds, says when to stop."""

    def __init__(self, config: RunConfig, store: Store, run_id: str, logger: Any):
        self.config, self.store, self.run_id, self.logger = config, store, run_id, logger
        self.key = run_key(run_id, "budget-alerts.json")
        try:
            self.state = AlertState(**json.loads(store.get_bytes(self.key)))
        except NotFound:
            self.state = AlertState()
        self.gpus = gpus_per_node(config)
        self._first: tuple[float, int] | None = None  # (time, step) of the first progress seen this attempt
        self._attempt = 0

    def steps_per_s(self, attempt_number: int, step: int | None, now: float) -> float | None:
        if step is None:
            return None
        if self._first is None or attempt_number != self._attempt:
            self._first, self._attempt = (now, step), attempt_number
            return None
        t0, s0 = self._first
        return (step - s0) / (now - t0) if now > t0 and step > s0 else None

    def check(self, attempts: list[Attempt], progress: dict[str, Any]) -> tuple[Snapshot, bool]:
        """One look at the money; returns the snapshot and whether the hard cap was reached."""
        now = time.time()
        rate = self.steps_per_s(len(attempts), progress.get("step"), now)
        snap = snapshot(attempts, progress, rate, self.config.budget, self.gpus, now)
        before = (list(self.state.fired), self.state.last_burn_alert_unix)
        exceeded = False
        for alert in due_alerts(snap, self.config.budget, self.state, self.run_id, now):
            exceeded = exceeded or alert.kind == "exceeded"
            self.logger.warning("budget: %s", alert.message)
            emit_event(event=f"thrifty.budget.{alert.kind}", resource=run_resource(self.run_id), payload=alert.payload)
            notify(self.config.budget.notify, f"Thrifty budget: {self.run_id}", alert.message, self.logger)
        if (list(self.state.fired), self.state.last_burn_alert_unix) != before:
            self.store.put_bytes(self.key, json.dumps(asdict(self.state)).encode())
        return snap, exceeded
