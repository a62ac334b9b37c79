"""Utilisation in dollars: sampling, the starvation alert, the cost map, MFU and right-size advice.

Every clock and counter is injected or scripted: nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from thrifty.config import build_config
from thrifty.money.devices import device_spec
from thrifty.money.utilisation import StarvationWatch, model_flops, right_size, starving_since, wait_readings
from thrifty.report.utilisation import cost_map_lines, utilisation_rows
from training.telemetry import Nvml, Telemetry

# ---------------------------------------------------------------- metric lines on the step path


def test_step_lines_reach_the_file_within_flush_s_and_event_lines_at_once(tmp_path):
    """A flush per metric line cost ~10 us of a ~0.4 ms step (bench_loop_overhead.py): step lines are flushed at most
    FLUSH_S apart, an event line (and everything before it) at once, and everything at close."""
    from thrifty.storage import open_store
    from training.progress import MetricsWriter

    now = [1000.0]
    w = MetricsWriter(open_store(str(tmp_path)), "r", clock=lambda: now[0])
    on_disk = lambda: [json.loads(line).get("event", json.loads(line)["step"])  # noqa: E731
                       for line in w.path.read_text().splitlines()]
    w.write({"step": 10, "loss": 1.0})  # the first line: flushed
    w.write({"step": 20, "loss": 0.9})
    now[0] += MetricsWriter.FLUSH_S / 2
    w.write({"step": 30, "loss": 0.8})
    assert on_disk() == [10]
    w.write({"event": "eval", "step": 30, "val_loss": 0.7})
    assert on_disk() == [10, 20, 30, "eval"]
    w.write({"step": 40, "loss": 0.6})
    now[0] += MetricsWriter.FLUSH_S
    w.write({"step": 50, "loss": 0.5})
    assert on_disk() == [10, 20, 30, "eval", 40, 50]
    w.write({"step": 60, "loss": 0.4})
    w.close()
    assert on_disk()[-1] == 60


def test_a_telemetry_window_without_a_reading_has_only_the_loops_shares():
    tel = Telemetry(every_s=None, read_gpu=lambda: {"gpu_busy_pct": 50.0}, clock=iter([0.0, 1.0, 2.0]).__next__,
                    cpu_clock=iter([0.0, 0.5, 1.5]).__next__)
    assert tel.window(10, 1.0, 0.1) == {"data_wait_share": 0.1, "checkpoint_share": 0.0}
    tel.sample()
    out = tel.window(10, 1.0, 0.2)
    assert out["gpu_busy_pct"] == 50.0 and out["cpu_pct"] == 50.0 and out["data_wait_share"] == 0.2  # 0.5 s CPU in 1 s
    assert "gpu_busy_pct" not in tel.window(10, 1.0, 0.1)  # that reading was this window's only


# ---------------------------------------------------------------- the starvation rule (pure, scripted clock)


def test_starvation_alerts_once_the_wait_share_has_lasted_its_minutes():
    watch = StarvationWatch(share=0.3, minutes=10)
    readings = [(0.0, 0.1), (60.0, 0.5), (120.0, 0.4)]
    assert watch.check(readings, now=120.0, usd_per_hour=2.0) is None  # a minute in: not yet
    readings += [(t, 0.45) for t in range(180, 661, 60)]
    assert watch.check(readings, now=600.0, usd_per_hour=2.0) is None  # 9 minutes since the spell began at 60 s
    found = watch.check(readings, now=660.0, usd_per_hour=2.0)
    assert found is not None and found.since_unix == 60.0 and found.minutes == pytest.approx(10.0)
    mean = (0.5 + 0.4 + 0.45 * 9) / 11
    assert found.share == pytest.approx(mean)
    assert found.usd_per_hour == pytest.approx(mean * 2.0)  # what waiting costs: share x the run's $/h
    assert "$" in found.message("r") and "waited on data" in found.message("r")
    assert watch.check(readings, now=900.0, usd_per_hour=2.0) is None  # once per spell


def test_a_reading_under_the_share_ends_the_spell_and_rearms_the_alert():
    watch = StarvationWatch(share=0.3, minutes=1)
    spell1 = [(0.0, 0.9), (60.0, 0.9)]
    assert watch.check(spell1, now=60.0, usd_per_hour=1.0) is not None
    fed = spell1 + [(90.0, 0.05)]
    assert watch.check(fed, now=90.0, usd_per_hour=1.0) is None
    spell2 = fed + [(120.0, 0.8), (200.0, 0.8)]
    again = watch.check(spell2, now=200.0, usd_per_hour=1.0)
    assert again is not None and again.since_unix == 120.0


def test_starvation_off_and_readings_from_metric_lines():
    assert StarvationWatch(share=None, minutes=1).check([(0.0, 1.0)], now=1e9, usd_per_hour=5.0) is None
    assert starving_since([(0.0, 0.5), (1.0, 0.2)], 0.3) is None
    records = [{"event": "start", "time_unix": 1.0}, {"time_unix": 2.0, "loss": 1.0, "data_wait_share": 0.4},
               {"time_unix": 3.0, "loss": 1.0}, {"event": "eval", "time_unix": 4.0, "data_wait_share": 0.9}]
    assert wait_readings(records) == [(2.0, 0.4)]


def test_the_watch_loop_emits_the_starved_event_and_notifies(monkeypatch):
    import tasks.alerts as alerts

    events, notes = [], []
    monkeypatch.setattr(alerts, "emit_event", lambda **kw: events.append(kw))
    monkeypatch.setattr(alerts, "notify", lambda targets, subject, body, logger: notes.append((targets, body)))
    cfg = build_config({"run_name": "starved", "train": {"starved_alert_share": 0.25, "starved_alert_minutes": 2},
                        "budget": {"notify": ["slack-webhook/ops"]}})
    alert = alerts.StarvedAlert(cfg, alerts.log)
    records = [{"time_unix": float(t), "loss": 1.0, "data_wait_share": 0.5} for t in range(0, 181, 30)]
    assert alert.check(records[:3], usd_per_hour=3.0, now=60.0) is None
    found = alert.check(records, usd_per_hour=3.0, now=180.0)
    assert found is not None
    assert [e["event"] for e in events] == ["thrifty.gpu.starved"]
    assert events[0]["payload"]["usd_per_hour_waiting"] == pytest.approx(1.5)
    assert notes and notes[0][0] == ["slack-webhook/ops"] and "$1.50/h" in notes[0][1]


# ---------------------------------------------------------------- sampling (fake counters, fake clocks)


class Clocks:
    def __init__(self):
        self.wall, self.cpu = 0.0, 0.0


def test_telemetry_aggregates_per_window_and_over_the_attempt():
    c = Clocks()
    gpu = iter([{"gpu_busy_pct": 40.0, "gpu_memory_used_gb": 3.0, "gpu_power_w": 100.0},
                {"gpu_busy_pct": 60.0, "gpu_memory_used_gb": 5.0, "gpu_power_w": 140.0},
                {"gpu_busy_pct": 90.0, "gpu_memory_used_gb": 4.0}])  # a card without a power reading
    t = Telemetry(1.0, read_gpu=lambda: next(gpu), clock=lambda: c.wall, cpu_clock=lambda: c.cpu,
                  checkpoint_total_s=7.0)  # a resume: the checkpoint time of earlier attempts is not this window's
    c.wall, c.cpu = 1.0, 0.5
    t.sample()
    c.wall, c.cpu = 2.0, 1.5
    t.sample()
    w = t.window(steps=10, step_s=4.0, wait_s=1.0, checkpoint_total_s=8.0)
    assert w == {"gpu_busy_pct": 50.0, "gpu_memory_used_gb": 4.0, "gpu_power_w": 120.0, "cpu_pct": 75.0,
                 "data_wait_share": 0.25, "checkpoint_share": 0.2}
    c.wall, c.cpu = 4.0, 1.5
    t.sample()
    w2 = t.window(steps=10, step_s=4.0, wait_s=0.0, checkpoint_total_s=8.0)
    assert w2 == {"gpu_busy_pct": 90.0, "gpu_memory_used_gb": 4.0, "cpu_pct": 0.0, "data_wait_share": 0.0,
                  "checkpoint_share": 0.0}
    avg = t.averages()
    assert avg["gpu_busy_pct"] == pytest.approx(63.333, abs=1e-3) and avg["gpu_memory_peak_gb"] == 5.0
    assert avg["gpu_power_w"] == 120.0 and avg["data_wait_share"] == 0.125 and t.steps == 20


def test_no_nvml_no_gpu_fields_and_off_starts_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: the import fails
    assert Nvml().read() == {}
    off = Telemetry(None).start()
    assert off._thread is None and off._read_gpu is None  # no thread, NVML never touched
    assert set(off.window(5, 1.0, 0.1)) == {"data_wait_share", "checkpoint_share"}  # the loop's own shares stay
    off.close()


def test_nvml_reads_what_the_gpu_reports(monkeypatch):
    def fail():
        raise RuntimeError("not supported")

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: "h",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=37),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2.5e9),
        nvmlDeviceGetPowerUsage=lambda h: fail())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert Nvml().read() == {"gpu_busy_pct": 37.0, "gpu_memory_used_gb": 2.5}


# ---------------------------------------------------------------- MFU


def test_device_names_match_the_table_by_whole_word():
    assert device_spec("NVIDIA A10G").name == "A10G"
    assert device_spec("NVIDIA A10").name == "A10"
    assert device_spec("NVIDIA A100-SXM4-40GB").name == "A100"
    assert device_spec("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert device_spec("NVIDIA H100 80GB HBM3").name == "H100"
    assert device_spec("Tesla T4").name == "T4" and device_spec("NVIDIA L4").name == "L4"
    assert device_spec("cpu") is None


def test_mfu_against_the_peak_and_none_on_a_cpu():
    gpu = model_flops(1e9, examples=70_000, seconds=2.0, device_name="NVIDIA A10G", precision="bf16")
    assert gpu["achieved_tflops"] == pytest.approx(35.0) and gpu["mfu"] == pytest.approx(0.5)
    assert "A10G bf16 peak 70" in gpu["mfu_basis"]
    cpu = model_flops(1e9, examples=1000, seconds=1.0, device_name=None, precision="fp32")
    assert cpu == {"achieved_tflops": 1.0}  # achieved only: no peak for a CPU
    assert model_flops(None, 10, 1.0, "NVIDIA A10G", "bf16") == {}  # the recipe states no FLOPs
    assert "mfu" not in model_flops(1e9, 10, 1.0, "Tesla T4", "bf16")  # a T4 has no bf16


def test_codelm_flops_per_example_counts_the_model_it_builds():
    from training.recipes.codelm import CodeLMParams, build_model, flops_per_example, recipe

    params = CodeLMParams(n_layer=2, n_head=2, n_embd=32, seq_len=16)
    meta = {"vocab_size": 300, "seq_len": 16}
    model = build_model(params, meta)
    n = sum(p.numel() for p in model.parameters()) - model.pos_emb.weight.numel()  # nanoGPT leaves these out
    assert flops_per_example(params, meta) == 16 * (6 * n + 12 * 2 * 32 * 16)
    assert recipe().flops_per_example is flops_per_example


# ---------------------------------------------------------------- right-size advice


def test_right_size_advises_a_cheaper_gpu_when_this_one_idled():
    advice = right_size("A100:1", busy_pct=20.0, memory_peak_gb=6.0, runtime_h=2.0, actual_usd=2 * 1.469, spot=True,
                        clouds=["aws", "gcp", "azure"])
    assert advice is not None and advice.usd < advice.actual_usd * 0.95
    assert "busy 20 %" in advice.line and "assuming" in advice.line
    assert right_size("A100:1", 80.0, 6.0, 2.0, 2.938, True, ["gcp"]) is None  # a busy GPU: no advice
    fits = right_size("A100:1", 20.0, 30.0, 2.0, 2.938, True, ["aws", "gcp", "azure"])  # 30 GB: no 24 GB card
    assert fits is None or device_spec(fits.accelerator.split(":")[0]).memory_gb >= 36.0


# ---------------------------------------------------------------- the report's words


def test_report_rows_and_cost_map_lines():
    rows = dict(utilisation_rows({"gpu_busy_pct": 35.0, "data_wait_share": 0.2, "achieved_tflops": 0.5,
                                  "device_name": "cpu"}, run_usd=10.0))
    assert rows["GPU busy"].startswith("35 %") and "$2.00 of this run" in rows["waiting for data"]
    assert "no MFU" in rows["achieved"] and "GPU power" not in rows
    lines = cost_map_lines({"ops": [{"name": "aten::addmm", "share": 0.41, "projected_usd": 1.0}],
                            "steps_profiled": 4, "windows": 2}, run_usd=30.0)
    assert "- `aten::addmm`: 41% of step time, about $12.30 of this run" in lines


def test_telemetry_settings_leave_the_fingerprint_alone():
    base = build_config({"run_name": "f"})
    other = base.updated({"train": {"utilisation_every_s": None, "profile_steps": 3, "starved_alert_share": 0.5,
                                    "starved_alert_minutes": 1}})
    assert other.training_fingerprint() == base.training_fingerprint()


# ---------------------------------------------------------------- in the loop


def run_cfg(tmp_path: Path, name: str, **train) -> dict:
    return {"run_name": name, "store": str(tmp_path / "store"),
            "recipe_params": {"hidden": 16, "dropout": 0.0, "limit": 400},
            "train": {"max_epochs": 2, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 100,
                      "log_every": 2, "early_stopping": {"enabled": False}, **train}}


def metric_lines(tmp_path: Path, name: str) -> list[dict]:
    (path,) = (tmp_path / "store" / "runs" / name / "metrics").iterdir()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_profiling_off_creates_no_profiler_and_the_lines_carry_the_shares(tmp_path, monkeypatch):
    from training.loop import train

    def forbidden(*args, **kwargs):
        raise AssertionError("a torch.profiler object was created with train.profile_steps = 0")

    monkeypatch.setattr(torch.profiler, "profile", forbidden)
    monkeypatch.setattr(torch.profiler, "schedule", forbidden)
    result = train(build_config(run_cfg(tmp_path, "off")))
    lines = [m for m in metric_lines(tmp_path, "off") if m.get("event") is None]
    assert lines and all("data_wait_share" in m and "checkpoint_share" in m for m in lines)
    assert not (tmp_path / "store" / "runs" / "off" / "profile.json").exists()
    u = result.summary.utilisation
    assert u["device_name"] == "cpu" and "data_wait_share" in u and "gpu_busy_pct" not in u  # no GPU: absent


def test_profiling_on_writes_the_cost_map(tmp_path):
    from training.loop import train

    train(build_config(run_cfg(tmp_path, "on", profile_steps=2, utilisation_every_s=None)))
    profile = json.loads((tmp_path / "store" / "runs" / "on" / "profile.json").read_text())
    assert profile["windows"] == 2 and profile["steps_profiled"] == 4  # one window per epoch
    assert profile["ops"] and all(0.0 < op["share"] <= 1.0 for op in profile["ops"])
    assert any(op["name"] in ("aten::addmm", "aten::mm", "aten::linear") for op in profile["ops"])


def test_the_cost_map_sums_operators_as_key_averages_does(tmp_path):
    from thrifty.storage import open_store
    from training.profiling import CostMap

    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cmap = CostMap(3, open_store(str(tmp_path)), "r", 100, 2.0, torch.device("cpu"))
    seen = {}

    def collect(prof):
        seen.update({e.key: e.self_cpu_time_total for e in prof.key_averages() if e.self_cpu_time_total > 0})
        cmap._collect(prof)

    with torch.profiler.profile(schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
                                on_trace_ready=collect) as prof:
        for _ in range(4):
            model(torch.randn(8, 16)).sum().backward()
            prof.step()
    assert "ProfilerStep*" in seen, "key_averages counts the profiler's span between steps"
    del seen["ProfilerStep*"]  # not an operator: the cost map leaves it out (its share could pass 100 %)
    assert seen and set(cmap._self_us) == set(seen)
    for key, us in seen.items():
        assert cmap._self_us[key] == pytest.approx(us, rel=1e-6, abs=1e-3), key


def test_script_mode_refuses_a_cost_map():
    from thrifty.config import ConfigError
    from training.validate import check_config

    cfg = build_config({"run_name": "s", "recipe": "script", "recipe_params": {"command": ["python", "-c", "pass"]},
                        "train": {"profile_steps": 3}})
    with pytest.raises(ConfigError, match="profile_steps"):
        check_config(cfg)


def test_the_report_section_shows_utilisation_advice_and_the_cost_map(tmp_path):
    from thrifty.money.ledger import Attempt
    from thrifty.report.utilisation import section
    from thrifty.runs import BestMetric, RunSummary
    from thrifty.storage import open_store

    store = open_store(str(tmp_path))
    summary = RunSummary(
        run_id="r", recipe="codelm", status="completed", steps=10, total_steps=10, epochs=1.0, stopped_early=False,
        best_metric=BestMetric(name="val_loss", value=1.0, step=10, checkpoint_step=10), wall_time_s=3600.0,
        data_wait_fraction=0.3, checkpoint_time_fraction=0.0, checkpoints_written=1, resumes=0, precision="bf16",
        device="cuda", world_size=1, cache_key="k", weights_sha256="0" * 64,
        utilisation={"gpu_busy_pct": 25.0, "gpu_memory_used_gb": 3.0, "gpu_memory_peak_gb": 4.0, "cpu_pct": 98.0,
                     "data_wait_share": 0.3, "checkpoint_share": 0.01, "achieved_tflops": 14.0, "mfu": 0.04487,
                     "mfu_basis": "A100 bf16 peak 312 TFLOPS (datasheets)", "device_name": "NVIDIA A100-SXM4-40GB"})
    attempts = [Attempt("j", 1, "gcp", "us-central1", "a2-highgpu-1g", True, 1.469, 1, 0.0, 7200.0, "succeeded")]
    assert section(store, "r", None, [], 0.0, ["gcp"]) == ""  # nothing measured: no section
    store.put_bytes("runs/r/profile.json", json.dumps({"ops": [{"name": "aten::mm", "share": 0.5}],
                                                       "steps_profiled": 5, "windows": 1}).encode())
    text = section(store, "r", summary, attempts, 2.938, ["gcp"])
    assert "## Utilisation" in text and "| GPU busy | 25 % of the time |" in text
    assert "MFU 4.5% of the A100 bf16 peak" in text
    assert "Right-size: the GPU was busy 25 %" in text and "n1-standard-4+T4" in text  # a T4 holds 4 GB x 1.2
    assert "## Cost map" in text and "`aten::mm`: 50% of step time, about $1.469 of this run" in text
