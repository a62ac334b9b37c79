"""Scale-out as teams run it: a Prefect server on PostgreSQL (Debian's, on loopback), `thrifty deploy
--pool-concurrency 2`, two process workers on the pool, eight train runs at once plus two nightly ones, and a worker
killed mid-run whose run the other worker resumes from its last checkpoint.

PostgreSQL must be installed (`.ci/run` installs it); without it the test fails with the install command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from deployments.deploy import WORK_POOL
from prefect_server import Server, deployed_server, descendants, postgres_cluster, stop, tail
from thrifty.runs.checkpoints import committed
from thrifty.money.ledger import read_attempts
from thrifty.protocol import TRAINING_JOBS_LIMIT
from thrifty.runs import read_metrics
from thrifty.storage import open_store

pytestmark = pytest.mark.slow

POOL_LIMIT = 2
TRAIN, NIGHTLY = "thrifty-train/train", "thrifty-train/nightly-retrain"
# Prefect's flow heartbeat is 30 s at the least (prefect.yaml beats every 30 s): two missed beats, where the deployed
# automation waits for three, still leaves a live run a whole beat of slack on a loaded machine
ZOMBIE_WINDOW_S = 60
# the workers' training jobs take at least 10 ms a step (thrifty.faults.pace): the run killed mid-run below (800 steps)
# is still training when the kill comes, however fast this machine trains
PACE = {"THRIFTY_MIN_STEP_S": "0.01"}


def tiny(run_name: str, store: Path, **train: Any) -> dict[str, Any]:
    """A digits run of a few seconds: what the UI form would send."""
    return {"run_name": run_name, "recipe": "digits", "store": str(store),
            "recipe_params": {"hidden": 32, "limit": 400},
            "train": {"max_epochs": 1, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 5,
                      "log_every": 5, "early_stopping": {"enabled": False}, **train}}


def submit(server: Server, deployment: str, config: dict[str, Any]) -> str:
    with server.client() as client:
        dep = client.read_deployment_by_name(deployment)
        run = client.create_flow_run_from_deployment(dep.id, parameters={"config": config, "poll_s": 0.5})
    return str(run.id)


def wait_all(server: Server, ids: list[str], workers: list[subprocess.Popen], timeout_s: float) -> dict[str, Any]:
    """Flow run id -> its final flow run; fails with the workers' logs when one ends otherwise than Completed."""
    done: dict[str, Any] = {}
    deadline = time.monotonic() + timeout_s
    with server.client() as client:
        while len(done) < len(ids):
            for fid in ids:
                if fid not in done:
                    run = client.read_flow_run(fid)
                    if run.state is not None and run.state.is_final():
                        done[fid] = run
            for i, w in enumerate(workers):
                assert w.poll() is None, f"worker {i} exited {w.returncode}:\n{tail(server.home / f'worker{i}.log')}"
            assert time.monotonic() < deadline, (f"{len(ids) - len(done)} run(s) not final after {timeout_s:.0f} s:\n"
                                                 f"{tail(server.home / 'worker0.log')}\n{tail(server.home / 'worker1.log')}")
            time.sleep(0.5)
    bad = {r.name: f"{r.state_name}: {r.state.message}" for r in done.values() if not r.state.is_completed()}
    assert not bad, f"runs not completed: {bad}\n{tail(server.home / 'worker0.log')}\n{tail(server.home / 'worker1.log')}"
    return done


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (an end at the same instant as a start does not overlap it)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, delta in edges:
        now += delta
        most = max(most, now)
    return most


def training_intervals(store: Path, run_name: str) -> list[tuple[float, float]]:
    rows = read_attempts(open_store(str(store)), run_name)
    assert rows and all(a.ended_unix for a in rows), f"{run_name}: attempts without an end: {rows}"
    return [(a.started_unix, a.ended_unix) for a in rows]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[tuple[Server, list[subprocess.Popen], str]]:
    """PostgreSQL, a Prefect server on it, `thrifty deploy --pool-concurrency 2`, and two workers."""
    home = tmp_path_factory.mktemp("pg-scale")
    with postgres_cluster() as db_url, deployed_server(
            home, deploy_args=("--pool-concurrency", str(POOL_LIMIT)),
            env={"PREFECT_API_DATABASE_CONNECTION_URL": db_url}) as server:
        workers = [server.spawn(f"worker{i}", "worker", "start", "--pool", WORK_POOL, "--name", f"worker{i}", env=PACE)
                   for i in range(2)]
        yield server, workers, db_url


def narrow_zombie_window(client: Any) -> None:
    """thrifty-zombie-run as deployed (90 s: three missed 30 s beats), its window cut to ZOMBIE_WINDOW_S on this
    server: the dead run below is marked by the same automation without a minute and a half of waiting."""
    from prefect.events.schemas.automations import AutomationCore

    [zombie] = client.read_automations_by_name("thrifty-zombie-run")
    assert zombie.trigger.within.total_seconds() == 90, zombie.trigger
    fields = {k: v for k, v in zombie.model_dump().items() if k in AutomationCore.model_fields and v is not None}
    fields["trigger"]["within"] = ZOMBIE_WINDOW_S
    client.update_automation(zombie.id, AutomationCore.model_validate(fields))
    [zombie] = client.read_automations_by_name("thrifty-zombie-run")
    assert zombie.trigger.within.total_seconds() == ZOMBIE_WINDOW_S


def count_flow_runs(db_url: str) -> int:
    """Flow runs in the PostgreSQL database itself: the server keeps its state there, not in SQLite."""
    import asyncio

    import asyncpg

    async def go() -> int:
        conn = await asyncpg.connect(db_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            return int(await conn.fetchval("SELECT count(*) FROM flow_run"))
        finally:
            await conn.close()

    return asyncio.run(go())


@pytest.mark.timeout(600)
def test_two_workers_on_postgres_share_a_pool_limit_and_survive_a_dead_worker(cluster, tmp_path):
    server, workers, db_url = cluster
    assert f"work pool {WORK_POOL!r}: at most {POOL_LIMIT} flow run(s) at once" in server.deploy_output.stderr
    with server.client() as client:
        assert client.read_work_pool(WORK_POOL).concurrency_limit == POOL_LIMIT
        assert client.read_global_concurrency_limit_by_name(TRAINING_JOBS_LIMIT).limit == POOL_LIMIT
        narrow_zombie_window(client)
    assert not list(server.home.rglob("*.db")), "no SQLite database: the server runs on PostgreSQL"
    store, tag = tmp_path / "store", uuid.uuid4().hex[:6]

    # one run alone: its wall time is the yardstick (and it fills the shared preprocessing cache)
    t0 = time.monotonic()
    wait_all(server, [submit(server, TRAIN, tiny(f"one-{tag}", store))], workers, 240)
    one_s = time.monotonic() - t0

    # eight train runs and two nightly ones at once
    names = [f"batch-{tag}-{i}" for i in range(8)]
    nightly = [f"nightly-{tag}-{i}" for i in range(2)]
    t0 = time.monotonic()
    ids = [submit(server, TRAIN, tiny(n, store)) for n in names] + [submit(server, NIGHTLY, tiny(n, store))
                                                                     for n in nightly]
    done = wait_all(server, ids, workers, 420)
    batch_s = time.monotonic() - t0
    assert sorted(r.name for r in done.values()) == sorted(names + nightly)  # flow_run_name="{config.run_name}"
    flows = [(r.start_time.timestamp(), r.end_time.timestamp()) for r in done.values()]
    # the pool's own limit is applied by each worker against a snapshot of free slots: two workers polling in the
    # same second may each start up to it (seen: 4 flow runs at once). The training jobs hold the global limit.
    assert POOL_LIMIT <= max_overlap(flows) <= 2 * POOL_LIMIT, "the pool ran flow runs side by side, within reason"
    intervals = {n: training_intervals(store, n) for n in names + nightly}
    overlap = max_overlap([iv for ivs in intervals.values() for iv in ivs])
    assert 1 <= overlap <= POOL_LIMIT, f"{overlap} training jobs at once; the pool allows {POOL_LIMIT}"
    assert max_overlap(intervals[nightly[0]] + intervals[nightly[1]]) == 1, "nightly-retrain's concurrency_limit 1"
    for i in range(2):  # both workers took runs
        assert "submitting flow run" in (server.home / f"worker{i}.log").read_text(), tail(server.home / f"worker{i}.log")
    print(f"\n[pg-scale] one run alone {one_s:.1f} s; 8 train + 2 nightly runs at once on 2 workers, pool limit "
          f"{POOL_LIMIT}: {batch_s:.1f} s ({batch_s / one_s:.1f}x one run's wall for 10x the runs); at most "
          f"{overlap} training jobs at once")

    # a worker dies mid-run (with its flow-run process and the training job it started: its machine is gone)
    run_name = f"killed-{tag}"
    config = tiny(run_name, store, max_epochs=40, checkpoint_every=20, log_every=1)
    config["recipe_params"] = {"hidden": 32, "limit": 800}
    killed_id = submit(server, TRAIN, config)
    s = open_store(str(store))
    deadline = time.monotonic() + 180
    while True:  # past a checkpoint, and some steps beyond it that the kill will lose
        ckpts = committed(s, run_name)
        steps = [r["step"] for r in read_metrics(s, run_name) if "loss" in r]
        if ckpts and steps and max(steps) >= ckpts[-1].step + 5:
            break
        assert time.monotonic() < deadline, f"no checkpoint after 180 s:\n{tail(server.home / 'worker0.log')}"
        time.sleep(0.2)
    busy = [w for w in workers if descendants(w.pid)]
    assert len(busy) == 1, "exactly one worker runs the flow"
    victim = busy[0]
    survivor_log = server.home / f"worker{1 - workers.index(victim)}.log"
    survivor = next(w for w in workers if w is not victim)
    tree = [victim.pid, *descendants(victim.pid)]
    for pid in tree:  # SIGKILL all at once: nothing gets to clean up or checkpoint
        os.kill(pid, signal.SIGKILL)
    victim.wait(10)
    killed_at = time.time()
    ckpt_step = committed(s, run_name)[-1].step
    last_step = max(r["step"] for r in read_metrics(s, run_name) if "loss" in r)

    # the same run_name again: the surviving worker takes it; the lease of the dead holder does not block it
    rerun_id = submit(server, TRAIN, config)
    wait_all(server, [rerun_id], [survivor], 240)
    assert f"submitting flow run '{rerun_id}'" in survivor_log.read_text()
    starts = [r for r in read_metrics(s, run_name) if r.get("event") == "start"]
    assert [r["step"] for r in starts] == [0, ckpt_step], "the rerun resumes from the last checkpoint, not step 0"
    resumed_s = starts[-1]["time_unix"] - killed_at
    summary = json.loads((store / "runs" / run_name / "summary.json").read_text())
    assert summary["steps"] > ckpt_step

    # the dead run is marked Crashed by thrifty-zombie-run once its heartbeats stop: it no longer holds a pool slot
    deadline = time.monotonic() + 180
    with server.client() as client:
        while not (dead := client.read_flow_run(killed_id)).state.is_final():
            assert time.monotonic() < deadline, f"killed run still {dead.state_name} 180 s after its worker died"
            time.sleep(0.5)
    crashed_s = time.time() - killed_at
    assert dead.state.type.value == "CRASHED" and "no heartbeat" in dead.state.message, dead.state
    print(f"[pg-scale] worker killed at step {last_step} (checkpoint at {ckpt_step}): the other worker resumed from "
          f"step {ckpt_step} {resumed_s:.1f} s after the kill, {last_step - ckpt_step} steps redone; "
          f"the dead run marked Crashed after {crashed_s:.0f} s (zombie window {ZOMBIE_WINDOW_S} s)")
    assert count_flow_runs(db_url) >= 12
    stop(survivor)
