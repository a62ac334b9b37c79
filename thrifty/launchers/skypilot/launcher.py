"""SkyPilotLauncher: managed jobs submitted, followed (with priced ledger Attempts) and cancelled through SkyPilot's SDK."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from thrifty.money.budget import TEARDOWN_S, world_size
from thrifty.config import ConfigError, RunConfig
from thrifty.money.estimate import Estimate
from thrifty.launchers.base import JobStatus, LaunchError
from thrifty.launchers.skypilot.queue import QUEUE_FIELDS, _value, record_state, skypilot_task_id, update_attempts
from thrifty.launchers.skypilot.candidates import KUBERNETES, candidates, kubernetes_quote
from thrifty.launchers.skypilot.task import build_task, ranked_candidates, task_config
from thrifty.money.pricing import PricingError
from thrifty.money.prices import LivePrices, PriceKey, quote_accelerator
from thrifty.money.prices.repricing import change_from, point_seen_unix, seen_unix
from thrifty.money.prices.skypilot import sky_calls
from thrifty.money.ledger import Attempt
from thrifty.protocol import SKYPILOT_JOB_PREFIX, STOP_KEY, STOPPED_KEY

log = logging.getLogger("thrifty.launch")

JOB_PREFIX = SKYPILOT_JOB_PREFIX  # our job ids: sky-<managed job id> (the node derives the same)


def _number(job_id: str) -> int:
    if not job_id.startswith(JOB_PREFIX) or not job_id[len(JOB_PREFIX):].isdigit():
        raise LaunchError(f"{job_id!r} is not a SkyPilot job id of this launcher (expected {JOB_PREFIX}<number>)")
    return int(job_id[len(JOB_PREFIX):])


class SkyPilotLauncher:
    """Managed jobs through SkyPilot's SDK; one instance may watch jobs it did not submit (ids ``sky-<n>``)."""

    def __init__(self, cfg: RunConfig | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time):
        self.cfg, self.sleep, self.clock = cfg, sleep, clock
        self._attempts: dict[str, list[Attempt]] = {}
        self._nodes: dict[str, int] = {}
        # (job, attempt) -> when its price was last read, and when that price was last seen in force at its source
        self._priced_at: dict[tuple[str, int], tuple[float, float]] = {}
        self._live: LivePrices | None = None

    # ------------------------------------------------------------ submit
    @sky_calls()
    def submit(self, cfg: RunConfig, env: dict[str, str] | None = None, estimate: Estimate | None = None) -> str:
        import sky

        self.cfg = cfg
        ranking = None
        if estimate is not None and estimate.speeds is not None:  # the gate's speeds: cheapest run first
            examples = estimate.steps * cfg.train.examples_per_step(world_size(cfg))
            ranking = ranked_candidates(cfg, speeds=estimate.speeds, examples=examples)
        config = task_config(cfg, ranking=ranking)
        config["envs"].update(env or {})
        workdir = Path(cfg.compute.workdir).resolve()
        if not (workdir / "pyproject.toml").is_file():
            raise ConfigError(f"'compute.workdir': {str(workdir)!r} has no pyproject.toml; point it at the thrifty "
                              "project directory (setup installs it on the node)")
        config["workdir"] = str(workdir)
        task = build_task(config)
        name = config["name"]
        request = sky.jobs.launch(task, name=name)
        job_ids, _handle = sky.get(request)
        ids = job_ids if isinstance(job_ids, list) else [job_ids]
        if not ids or ids[0] is None:
            raise LaunchError(f"SkyPilot accepted job {name!r} but returned no job id")
        job_id = f"{JOB_PREFIX}{int(ids[0])}"
        self._attempts[job_id], self._nodes[job_id] = self._seed(job_id), cfg.compute.num_nodes
        log.info("submitted SkyPilot managed job %s (%s): `sky jobs logs %d` follows it", job_id, name, ids[0])
        return job_id

    # ------------------------------------------------------------ status
    @sky_calls()
    def _record(self, job_id: str) -> Any:
        import sky

        number = _number(job_id)
        result = sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=False, job_ids=[number], fields=QUEUE_FIELDS))
        records = result[0] if isinstance(result, tuple) else result
        mine = [r for r in records if _value(r, "job_id") == number]
        if not mine:
            raise LaunchError(f"SkyPilot has no managed job {number} ({job_id}); `sky jobs queue` lists the jobs")
        return mine[0]

    def _seed(self, job_id: str) -> list[Attempt]:
        """Attempts this run's ledger already holds for ``job_id`` (a restarted watcher keeps its history)."""
        if self.cfg is None:
            return []
        try:
            from thrifty.money.ledger import read_attempts
            from thrifty.storage import open_store

            attempts = read_attempts(open_store(self.cfg.store), self.cfg.run_name)
        except Exception:
            return []
        return [a for a in attempts if a.job_id == job_id]

    def _prices(self) -> LivePrices:
        """The freshest prices (the clouds' sources, cached in the run's store), one chain per launcher."""
        if self._live is None:
            store = None
            if self.cfg is not None:
                try:
                    from thrifty.storage import open_store

                    store = open_store(self.cfg.store)
                except Exception:  # the cache is a convenience: without it every look reads the sources
                    store = None
            self._live = LivePrices.for_config(self.cfg, store, clock=self.clock) if self.cfg is not None else \
                LivePrices(None, clock=self.clock)
        return self._live

    def _quote(self, cloud: str, instance: str | None, accelerator: str | None, spot: bool,
               region: str | None = None, zone: str | None = None) -> tuple[float, str, float]:
        """$/hour of one node where the job runs, where that price came from, and when it was last seen in force
        (:func:`seen_unix`): the instance's freshest price in its region and zone (the clouds' sources, SkyPilot's
        catalog, the dated table), else its accelerator's."""
        now = self.clock()
        if cloud == KUBERNETES and accelerator and self.cfg is not None:  # the user's cluster: the user's rate
            q = kubernetes_quote(self.cfg, accelerator)
            return q.usd_per_hour, q.source, now
        live = self._prices()
        if instance:
            try:
                point = live.lookup(PriceKey(cloud, instance, spot, region, zone, accelerator or ""))
                return point.usd_per_hour, point.describe(now), point_seen_unix(point, now)
            except PricingError:
                pass
        if accelerator:
            try:
                q = quote_accelerator(cloud, accelerator, spot, live=live, region=region)
                return (q.usd_per_hour, f"{q.source} (its {accelerator}'s cheapest instance: {instance} is priced nowhere)",
                        seen_unix(q.fetched_unix, now))
            except PricingError:
                pass
        # Never $0: charge the dearest candidate this run allows on that cloud, or fail loudly.
        if self.cfg is not None:
            cands = [k.quote.usd_per_hour for k in candidates(self.cfg)[0] if k.cloud == cloud]
            if cands:
                log.warning("no price for %s %s (%s); metering at the dearest candidate, $%.3f/h", cloud, instance,
                            accelerator, max(cands))
                return max(cands), f"the dearest candidate on {cloud}: no price for {instance}", now
        raise LaunchError(f"no price for {cloud} {instance} ({accelerator}); add it to thrifty/money/pricing.py")

    def _price(self, cloud: str, instance: str | None, accelerator: str | None, spot: bool,
               region: str | None = None, zone: str | None = None) -> float:
        """$/hour of one node (see :meth:`_quote`)."""
        return self._quote(cloud, instance, accelerator, spot, region, zone)[0]

    def _reprice(self, job_id: str, rec: Any, attempts: list[Attempt]) -> None:
        """The open attempt's price read again once it is older than budget.spot_price_max_age_s: a new price is a
        new segment (a fall from now, a rise from when the old price was last seen in force: see
        :mod:`thrifty.money.prices.repricing`), so the watch loop's cap meters each interval at the price in force."""
        if not attempts or attempts[-1].ended_unix is not None:
            return
        a, now = attempts[-1], self.clock()
        key = (job_id, a.number)
        accs = _value(rec, "accelerators") or {}
        accelerator = next((f"{n}:{int(k)}" for n, k in dict(accs).items()), None)

        def quote() -> tuple[float, str, float]:
            return self._quote(a.cloud, a.instance, accelerator, a.spot, a.region or None, _value(rec, "zone") or None)

        if key not in self._priced_at:  # priced as it opened, in this poll: the store's cache says when it was seen
            self._priced_at[key] = (now, quote()[2])
            return
        read_at, seen_at = self._priced_at[key]
        if now - read_at < self._prices().max_age_s(a.spot):
            return
        usd, source, seen = quote()
        self._priced_at[key] = (now, seen)
        if a.repriced(usd, source, change_from(a.usd_per_hour, usd, seen_at, now)):
            log.warning("job %s attempt %d: its price moved to $%.4f/h (%s)", job_id, a.number, usd, source)

    def status(self, job_id: str) -> JobStatus:
        rec = self._record(job_id)
        state, sky_state = record_state(rec)
        if job_id not in self._attempts:
            self._attempts[job_id] = self._seed(job_id)
        nodes = self._nodes.get(job_id) or (self.cfg.compute.num_nodes if self.cfg else 1)
        self._attempts[job_id] = update_attempts(self._attempts[job_id], rec, job_id, nodes, self._quote, self.clock())
        attempts = self._attempts[job_id]
        self._reprice(job_id, rec, attempts)
        where = ""
        if attempts:
            a = attempts[-1]
            where = f" on {a.cloud} {a.region} {a.instance} {'spot' if a.spot else 'on-demand'}"
        recoveries = int(_value(rec, "recovery_count") or 0)
        parts = [f"SkyPilot {sky_state}{where}", f"{recoveries} recovery(ies)"]
        if _value(rec, "failure_reason"):
            parts.append(str(_value(rec, "failure_reason")))
        elif _value(rec, "details"):
            parts.append(str(_value(rec, "details")))
        task_id = skypilot_task_id(rec)
        if task_id:
            parts.append(f"task {task_id}")
        return JobStatus(job_id, state, [replace(a) for a in attempts], "; ".join(parts))

    def attempts(self, job_id: str) -> list[Attempt]:
        return self.status(job_id).attempts

    # ------------------------------------------------------------ cancel
    @sky_calls()
    def cancel(self, job_id: str, deadline_s: float | None = None) -> None:
        """Checkpoint first, then tear down.

        ``sky.jobs.cancel(graceful=True)`` SIGTERMs the job's process group and flushes MOUNT_CACHED
        uploads, but does not wait for the trainer to save. So a running job is first asked to stop
        through the store (the node's watcher SIGTERMs the trainer and acknowledges once the
        checkpoint is written), and only then, or after ``stop_checkpoint_timeout_s``, cancelled.
        A stop at the budget cap (``deadline_s``) waits for the checkpoint only as long as leaves
        time to tear the nodes down before it.
        """
        import sky

        number = _number(job_id)
        state, sky_state = record_state(self._record(job_id))
        if state.terminal or sky_state == "CANCELLING":
            return
        if sky_state == "RUNNING" and self.cfg is not None:
            wait_s = self.cfg.compute.stop_checkpoint_timeout_s
            if deadline_s is not None:
                wait_s = min(wait_s, max(0.0, deadline_s - TEARDOWN_S["skypilot"]))
            self._request_stop(job_id, number, wait_s)
        sky.get(sky.jobs.cancel(job_ids=[number], graceful=True))
        log.info("cancelled SkyPilot managed job %s", job_id)

    def _request_stop(self, job_id: str, number: int, wait_s: float) -> None:
        from thrifty.runs import run_key
        from thrifty.storage import NotFound, open_store

        assert self.cfg is not None
        store, run_id = open_store(self.cfg.store), self.cfg.run_name
        store.put_bytes(run_key(run_id, STOP_KEY), json.dumps(
            {"managed_job_id": number, "job_id": job_id, "requested_unix": self.clock(), "reason": "cancel"}).encode())
        deadline = self.clock() + wait_s
        ack = run_key(run_id, STOPPED_KEY.format(job=number))
        next_status = 0.0
        while self.clock() < deadline:
            try:
                store.get_bytes(ack)
                log.info("job %s saved its checkpoint; tearing it down", job_id)
                return
            except NotFound:
                pass
            if self.clock() >= next_status:  # the job may end on its own meanwhile
                if record_state(self._record(job_id))[0].terminal:
                    return
                next_status = self.clock() + 15.0
            self.sleep(2.0)
        log.warning("job %s did not confirm a checkpoint within %.0f s; cancelling anyway", job_id,
                    wait_s)

