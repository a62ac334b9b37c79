"""The node's cap when the job is alone and the store hangs (issue 21.1): moto behind the fault proxy, blackholed.

The issue's run: `thrifty run` on S3, the flow's process group killed, then a store that accepts connections and
never answers. The training thread blocked in a checkpoint save for minutes and never reached its cap check: $1.63
against $0.80, and the store afterwards said $0.666. Now a watchdog on the node ends the job at the cap whatever its
threads wait on, and the meter's record, kept on the node's disk, reaches the store once it answers, so what the
store reports is what was billed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from stores import child_env
from thrifty.config import build_config
from thrifty.money.budget import spend_usd
from thrifty.money.ledger import MeterRecord, read_attempts, read_meters
from thrifty.money.meter import NodeMeter, Price
from thrifty.money.meter_local import flush, local_dir
from thrifty.procs import process_alive
from thrifty.protocol import EXIT_BUDGET
from thrifty.storage import open_store


def test_the_watchdog_ends_the_job_at_the_cap_while_a_store_call_hangs_and_its_record_reaches_the_store_later(
        s3_proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("THRIFTY_SPOOL", str(tmp_path / "spool"))
    from training.cap_watchdog import CapWatchdog

    cfg = build_config({"run_name": "hang", "store": f"s3://{s3_proxy.bucket}/runs", "store_retry_s": 5,
                        "budget": {"max_usd": 0.06}})
    store = open_store(cfg.store, retry_s=cfg.store_retry_s)
    started = time.time()
    meter = NodeMeter(store, cfg, "local-hang-1", Price("aws", "p5.48xlarge", True, 36.0), "test", 1, started)
    s3_proxy.proxy.mode = "blackhole"  # accepts, never answers
    hung = threading.Thread(target=store.put_bytes, args=("runs/hang/ckpt/step-9/state.pt", b"x"), daemon=True)
    hung.start()  # a checkpoint write that will not return
    ended: list[tuple[int, float]] = []
    dog = CapWatchdog(meter, end=lambda code: ended.append((code, time.time()))).start()
    cap_at = started + cfg.budget.max_usd / 36.0 * 3600  # $0.01 a second: 6 s
    deadline = cap_at + 30
    while not ended and time.time() < deadline:
        time.sleep(0.05)
    dog.stop()
    assert ended, "the watchdog never ended the job"
    [(code, at)] = ended
    assert code == EXIT_BUDGET and at <= cap_at, f"ended {at - cap_at:+.2f} s from the cap"
    assert hung.is_alive(), "the store call was still hanging: nothing but the watchdog could have ended the job"

    [kept] = [MeterRecord.model_validate_json(p.read_bytes()) for p in local_dir(store).rglob("*.json")]
    assert kept.end == "budget" and kept.ended_unix is not None
    billed = spend_usd([a for a in read_attempts_from(kept)])
    assert billed <= cfg.budget.max_usd and kept.ended_unix >= at, "the record covers the exit and is under the cap"

    s3_proxy.proxy.mode = "pass"  # the store is back: the next look from this machine writes the record
    assert flush(open_store(cfg.store), "hang") == [kept]
    [stored] = read_meters(open_store(cfg.store), "hang")
    assert stored == kept and not list(local_dir(store).rglob("*.json"))


def read_attempts_from(record: MeterRecord):
    from thrifty.money.ledger import reconcile

    return reconcile([], [record], time.time())


# --------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_job_left_alone_holds_its_cap_when_the_store_hangs(prefect_harness, s3_proxy, tmp_path):
    from test_money import THRIFTY, cli_env

    rate = 0.918  # aws p3.2xlarge spot, the emulated instance
    cap = 0.018  # ~70 s of billing: room for the node to start and commit a checkpoint before the store hangs
    cfg = tmp_path / "hang.yaml"
    cfg.write_text(yaml.safe_dump({
        "run_name": "alone", "recipe": "digits", "store": f"s3://{s3_proxy.bucket}/runs",
        "recipe_params": {"hidden": 512},
        "train": {"max_epochs": 2000, "micro_batch": 16, "precision": "fp32", "checkpoint_every": 25,
                  "log_every": 5, "early_stopping": {"enabled": False}},
        "compute": {"emulate": "aws:p3.2xlarge"},
        "budget": {"max_usd": cap, "allow_over_budget": True, "stop_margin_s": 3.0,
                   "burn_rate_alert_usd_per_hour": None},
    }))
    # a fixed pace (thrifty.faults.pace): the cap is in wall time, and a node training flat out would take a whole
    # core from the rest of the suite for the minute it waits
    env = {**child_env(cli_env(), s3_proxy.env), "THRIFTY_SPOOL": str(tmp_path / "spool"), "THRIFTY_MIN_STEP_S": "0.01"}
    direct, bucket = s3_proxy.direct, s3_proxy.bucket

    def objects(prefix: str) -> list[str]:
        return [o["Key"] for o in direct.list_objects_v2(Bucket=bucket, Prefix=f"runs/runs/alone/{prefix}")
                .get("Contents", [])]

    flow = subprocess.Popen([*THRIFTY, "run", "--config", str(cfg)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not any(k.endswith("/COMMIT") for k in objects("ckpt/")) and time.time() < deadline:
            assert flow.poll() is None, flow.stdout.read()
            time.sleep(0.5)
        assert any(k.endswith("/COMMIT") for k in objects("ckpt/")), "the job never committed a checkpoint"
        os.killpg(flow.pid, signal.SIGKILL)  # the flow and its watch loop: the job is alone now
        flow.wait(timeout=30)
        s3_proxy.proxy.mode = "blackhole"  # the store accepts connections and never answers
        hung_at = time.time()
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
    [key] = objects("meter/")
    record = MeterRecord.model_validate_json(direct.get_object(Bucket=bucket, Key=key)["Body"].read())
    cap_at = record.started_unix + cap / rate * 3600
    assert hung_at < cap_at - 10, "the store must hang well before the cap for this test to say anything"
    while process_alive(record.pid, record.pid_started) and time.time() < cap_at + 30:
        time.sleep(0.05)
    gone_at = time.time()
    assert not process_alive(record.pid, record.pid_started), \
        f"the job was still running {gone_at - cap_at:.0f} s past its cap, the store hanging"
    assert gone_at <= cap_at, f"the job ended {gone_at - cap_at:.1f} s after its cap"

    s3_proxy.proxy.mode = "pass"  # the store is back; the next look from this machine writes what the node kept
    report = subprocess.run([*THRIFTY, "report", "--config", str(cfg)], env=env, cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    assert report.returncode == 0, report.stderr
    store = open_store(f"s3://{bucket}/runs")
    [meter] = read_meters(store, "alone")
    assert meter.end == "budget", "the node's own word: it stopped at the cap"
    attempts = read_attempts(store, "alone")
    spent = spend_usd(attempts)
    billed = (gone_at - record.started_unix) / 3600 * rate  # the job's life, as the local launcher bills it
    print(f"\n[cap] store hung {cap_at - hung_at:.0f} s before the cap; job gone {gone_at - cap_at:+.2f} s from it; "
          f"recorded ${spent:.5f}, billed ${billed:.5f}, cap ${cap}")
    assert spent <= cap, f"recorded ${spent:.5f} over the ${cap} cap"
    assert spent >= billed, f"recorded ${spent:.5f} but ${billed:.5f} was billed"
    assert [a.end_reason for a in attempts] == ["budget"] and "closed now" in report.stderr
    assert Path(tmp_path / "spool").is_dir() and not list((tmp_path / "spool" / "meter").rglob("*.json"))
