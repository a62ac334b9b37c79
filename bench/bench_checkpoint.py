"""Checkpoint cost, measured side by side in one run (digits MLP, CPU, one torch thread).

1. Speed: Thrifty's training loop, checkpoints in the background (``thrifty``, the default) and on the
   training thread (``thrifty-sync``), against a raw torch loop of the same model, data, optimizer and
   checkpoint cadence (every 25 steps, and off), and against Lightning's Trainer when it is installed.
   Arms interleave, round after round, in a rotating order; CPU time (``time.process_time``, every
   thread) is the measure, the training thread's own CPU time and wall time are shown beside it. A
   ratio is the raw loop's time over the other's: 1.00 = as fast as raw torch, 0.87 = 13 % slower.
2. Checkpoint time per save: the loop's ``block_s`` (the step path) and ``write_s`` (the write) from
   its metric lines, and the raw loop's ``torch.save`` + rename, on the same store.
   Then codelm (a small GPT) at ``checkpoint_every: auto``, background and foreground: the checkpoint
   time on the step path as a share of wall (the run's ``checkpoint_time_fraction``).
3. Lost work: ``python -m training`` is started again and again on one run (checkpoint every 25,
   a metric line every step) and SIGKILLed or SIGTERMed at a random moment after a random number
   of steps; the steps lost are the last step it reported minus the step the next attempt resumes
   from. A SIGKILL may lose up to one interval; a SIGTERM (a spot notice) must lose nothing.

    python bench/bench_checkpoint.py               # ~3-4 min on a 2-core CPU
    python bench/bench_checkpoint.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from thrifty.runs.checkpoints import committed  # noqa: E402
from thrifty.config import RunConfig  # noqa: E402
from thrifty.storage import open_store  # noqa: E402
from training.data import epoch_permutation, open_cache  # noqa: E402
from training.loop import train  # noqa: E402
from training.recipes import lr_factor  # noqa: E402
from training.recipes.base import resolve_recipe  # noqa: E402

OFF = 10**9  # checkpoint_every for "off": only the final save
PARAMS: dict[str, Any] = {"hidden": 128}


def config(store: str, name: str, every: int, steps: int, log_every: int = 10, background: bool = True) -> RunConfig:
    return RunConfig(run_name=name, recipe="digits", recipe_params=PARAMS, store=store, train={
        "max_steps": steps, "max_epochs": 10**6, "micro_batch": 32, "precision": "fp32", "device": "cpu",
        "checkpoint_every": every, "eval_every": steps, "log_every": log_every, "early_stopping": {"enabled": False},
        "async_checkpoint": background})


# ---------------------------------------------------------------- the arms


def checkpoint_events(store: Path, name: str) -> list[dict[str, Any]]:
    return [r for p in (store / "runs" / name / "metrics").glob("*.jsonl") for line in p.read_text().splitlines()
            if (r := json.loads(line)).get("event") == "checkpoint"]


def thrifty_arm(store: Path, name: str, every: int, steps: int, background: bool = True) -> dict[str, float]:
    summary = train(config(str(store), name, every, steps, background=background)).summary
    saves = checkpoint_events(store, name)[:-1] or checkpoint_events(store, name)  # the last one waits: the end
    mean = lambda key: statistics.mean(r[key] for r in saves) if saves else 0.0  # noqa: E731
    return {"saves": len(saves) + 1, "save_s": mean("save_s"), "block_s": mean("block_s"), "write_s": mean("write_s"),
            "lag_steps": mean("committed_at_step") - mean("step"), "val_loss": summary.final_metrics["val_loss"]}


def codelm_auto(store: Path, seconds: float) -> dict[str, Any]:
    """A short codelm run at ``checkpoint_every: auto``: the checkpoint time on the step path as a share of wall."""
    base = {"recipe": "codelm", "recipe_params": {"max_bytes": 400_000}, "store": str(store)}
    tc = {"max_epochs": 10**6, "micro_batch": 8, "precision": "fp32", "device": "cpu", "log_every": 10,
          "eval_every": 10**6, "early_stopping": {"enabled": False}}
    probe = train(RunConfig(run_name="codelm-probe", **base, train={**tc, "max_steps": 5, "checkpoint_every": 5}))
    step_s = probe.summary.wall_time_s / 5  # the first steps are slower: a conservative count
    steps = max(30, int(seconds / step_s))
    out = {}
    for background in (True, False):
        name = f"codelm-auto-{'async' if background else 'sync'}"
        summary = train(RunConfig(run_name=name, **base, train={**tc, "max_steps": steps, "checkpoint_every": "auto",
                                                               "async_checkpoint": background})).summary
        saves = checkpoint_events(store, name)
        out["async" if background else "sync"] = {
            "steps": steps, "wall_s": summary.wall_time_s, "saves": len(saves),
            "step_path_fraction": summary.checkpoint_time_fraction,
            "step_path_fraction_periodic": sum(r["block_s"] for r in saves[:-1]) / summary.wall_time_s,
            "block_s": [r["block_s"] for r in saves], "write_s": [r["write_s"] for r in saves],
            "bytes": committed(open_store(str(store)), name)[-1].commit["bytes"]}
    return out


def raw_arm(data: dict[str, Any], ckpt_dir: Path, every: int, steps: int,
            device: torch.device = torch.device("cpu")) -> dict[str, float]:
    """The loop a careful person writes by hand: same model, batches, AdamW, schedule, clipping, one eval;
    a checkpoint is ``torch.save`` to a temp file and a rename. On a GPU the batches are gathered on the host and
    copied over, as Thrifty's loop does."""
    recipe, params, cfg = data["recipe"], data["params"], data["cfg"]
    torch.manual_seed(cfg.train.seed)
    model = recipe.build_model(params, data["meta"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.train, steps))
    x, y, n, batch = data["x"], data["y"], len(data["y"]), cfg.train.micro_batch
    per_epoch = n // batch
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    save_times = []

    def save(step: int) -> None:
        t0 = time.perf_counter()
        tmp = ckpt_dir / "state.pt.tmp"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "step": step, "rng": torch.get_rng_state()}, tmp)
        os.replace(tmp, ckpt_dir / f"step-{step}.pt")
        save_times.append(time.perf_counter() - t0)

    model.train()
    for step in range(steps):
        epoch, i = divmod(step, per_epoch)
        if i == 0:
            perm = torch.from_numpy(epoch_permutation(n, cfg.train.seed, epoch))
        idx = perm[i * batch:(i + 1) * batch]
        opt.zero_grad(set_to_none=True)
        xb, yb = x[idx], y[idx]
        if device.type != "cpu":
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        out = recipe.step(model, {"x": xb, "y": yb})
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        opt.step()
        sched.step()
        if (step + 1) % every == 0 or step + 1 == steps:
            save(step + 1)
    model.eval()
    with torch.no_grad():
        val_loss = float(recipe.step(model, {"x": data["vx"].to(device), "y": data["vy"].to(device)}).loss)
    return {"saves": len(save_times), "save_s": statistics.mean(save_times), "val_loss": val_loss}


def lightning_arm(data: dict[str, Any], ckpt_dir: Path, every: int, steps: int) -> dict[str, float]:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)  # its INFO lines would drown the table

    recipe, params, cfg = data["recipe"], data["params"], data["cfg"]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(cfg.train.seed)
            self.model = recipe.build_model(params, data["meta"])

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return recipe.step(self.model, {"x": batch[0], "y": batch[1]}).loss

        def configure_optimizers(self) -> Any:
            opt = torch.optim.AdamW(self.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg.train, steps))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data["x"], data["y"]),
                                         batch_size=cfg.train.micro_batch, shuffle=True, drop_last=True)
    callbacks = [ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=every, save_top_k=-1)] if every < OFF else []
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=bool(callbacks), callbacks=callbacks,
                        gradient_clip_val=cfg.train.grad_clip, num_sanity_val_steps=0, default_root_dir=ckpt_dir)
    module = Module()
    trainer.fit(module, loader)
    if not callbacks:
        trainer.save_checkpoint(ckpt_dir / "final.ckpt")
    with torch.no_grad():
        val_loss = float(recipe.step(module.model.eval(), {"x": data["vx"], "y": data["vy"]}).loss)
    return {"saves": len(list(ckpt_dir.glob("*.ckpt"))), "save_s": float("nan"), "val_loss": val_loss}


def timed(fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """CPU time of the process (every thread: the background writer's too), of the training thread alone, and wall."""
    c0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
    out = fn()
    return {**out, "cpu_s": time.process_time() - c0, "thread_cpu_s": time.thread_time() - t0,
            "wall_s": time.perf_counter() - w0}


# ---------------------------------------------------------------- lost steps per kill


def _records(store: Path, run: str) -> list[list[dict[str, Any]]]:
    """The run's metric records, one list per attempt (file), oldest first."""
    files = sorted((store / "runs" / run / "metrics").glob("*.jsonl"), key=lambda p: p.stat().st_mtime)
    out = []
    for p in files:
        recs = []
        for line in p.read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # the line a kill cut short
        out.append(recs)
    return out


def lost_steps(store: Path, kills: int, terms: int, every: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    run = "kills"
    store.parent.mkdir(parents=True, exist_ok=True)
    cfg_path = store.parent / "kills.json"
    cfg_path.write_text(config(str(store), run, every, 100_000, log_every=1).model_dump_json())
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    plan = ["kill"] * kills + ["term"] * terms
    rng.shuffle(plan)
    lost: dict[str, list[int]] = {"kill": [], "term": []}
    reached: list[tuple[str, int]] = []
    for how in plan + ["end"]:
        before = len(_records(store, run))
        proc = subprocess.Popen([sys.executable, "-m", "training", "--config", str(cfg_path)], cwd=store.parent,
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            start_step, target = None, None
            while time.monotonic() < deadline and proc.poll() is None:
                attempts = _records(store, run)
                mine = attempts[before] if len(attempts) > before else []
                steps = [r["step"] for r in mine if "loss" in r]
                if start_step is None and mine and mine[0].get("event") == "start":
                    start_step = mine[0]["step"]
                    target = start_step + rng.randint(30, 150)
                    if reached:  # the previous attempt's loss, now that we know where this one resumed
                        prev_how, prev_step = reached.pop()
                        lost[prev_how].append(prev_step - start_step)
                    if how == "end":  # resumed: that is all the last attempt was for
                        proc.kill()
                        break
                if target is not None and steps and steps[-1] >= target:
                    time.sleep(rng.uniform(0, 0.02))  # anywhere: inside a step, a metric line, a checkpoint write
                    proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
                    break
                time.sleep(0.002)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if how != "end":
            last = [r["step"] for r in _records(store, run)[before] if "loss" in r]
            reached.append((how, max(last)))
    return lost


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=600, help="optimizer steps per timed run (default 600)")
    ap.add_argument("--every", type=int, default=25, help="checkpoint cadence in steps (default 25)")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds of every arm (default 4)")
    ap.add_argument("--kills", type=int, default=5, help="SIGKILLs for the lost-steps count (default 5)")
    ap.add_argument("--terms", type=int, default=3, help="SIGTERMs for the lost-steps count (default 3)")
    ap.add_argument("--codelm-s", type=float, default=40.0, help="seconds of each codelm run at auto (0: skip)")
    ap.add_argument("--no-lightning", action="store_true", help="leave Lightning's Trainer out even when installed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)

    import importlib.util

    lightning = not args.no_lightning and importlib.util.find_spec("lightning") is not None
    work = Path(tempfile.mkdtemp(prefix="thrifty-bench-ckpt-"))
    try:
        store = work / "store"
        recipe = resolve_recipe("digits")
        params = recipe.parse_params(PARAMS)
        cache, splits = open_cache(open_store(str(store)), recipe, params)
        tr, va = splits["train"], splits["val"]
        data = {"recipe": recipe, "params": params, "meta": cache.manifest["meta"],
                "cfg": config(str(store), "x", 1, args.steps),
                "x": torch.from_numpy(tr.arrays["x"].take(np.arange(tr.n))),
                "y": torch.from_numpy(tr.arrays["y"].take(np.arange(tr.n))),
                "vx": torch.from_numpy(va.arrays["x"].take(np.arange(va.n))),
                "vy": torch.from_numpy(va.arrays["y"].take(np.arange(va.n)))}
        arms: dict[str, Callable[[int, int], dict[str, float]]] = {
            "thrifty": lambda every, r: thrifty_arm(store, f"t-{every}-{r}", every, args.steps),
            "thrifty-sync": lambda every, r: thrifty_arm(store, f"ts-{every}-{r}", every, args.steps, background=False),
            "raw": lambda every, r: raw_arm(data, work / f"raw-{every}-{r}", every, args.steps),
        }
        if lightning:
            arms["lightning"] = lambda every, r: lightning_arm(data, work / f"pl-{every}-{r}", every, args.steps)
        cadences = (args.every, OFF)
        for arm in arms.values():  # warm-up: imports, allocator, the first Lightning Trainer
            arm(OFF, -1)
        print(f"digits MLP (hidden {PARAMS['hidden']}), {args.steps} steps of 32, one torch thread, {args.rounds} "
              f"rounds; arms {', '.join(arms)} x checkpoint every {args.every} / off", flush=True)
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        order = [(a, c) for a in arms for c in cadences]
        for r in range(args.rounds):
            for arm, every in order[r % len(order):] + order[: r % len(order)]:  # rotate: drift spreads evenly
                results.setdefault((arm, every), []).append(timed(lambda: arms[arm](every, r)))
        cpu = {k: statistics.median(x["cpu_s"] for x in v) for k, v in results.items()}
        thread_cpu = {k: statistics.median(x["thread_cpu_s"] for x in v) for k, v in results.items()}
        wall = {k: statistics.median(x["wall_s"] for x in v) for k, v in results.items()}

        codelm = {}
        if args.codelm_s > 0:
            print(f"\ncodelm at checkpoint_every auto, ~{args.codelm_s:.0f} s a run, async and sync ...", flush=True)
            codelm = codelm_auto(work / "codelm", args.codelm_s)

        print(f"\nlosing steps: {args.kills} SIGKILLs and {args.terms} SIGTERMs at random moments ...", flush=True)
        lost = lost_steps(work / "kills" / "store", args.kills, args.terms, args.every, args.seed)

        rows: list[tuple[str, str]] = []
        for every in cadences:
            label = f"every {every}" if every < OFF else "off"
            for arm in arms:
                if arm == "raw":
                    continue
                rows.append((f"speed vs raw torch, {arm}, checkpoints {label} (CPU; training-thread CPU; wall)",
                             f"{cpu[('raw', every)] / cpu[(arm, every)]:.2f}x; "
                             f"{thread_cpu[('raw', every)] / thread_cpu[(arm, every)]:.2f}x; "
                             f"{wall[('raw', every)] / wall[(arm, every)]:.2f}x"))
        if not lightning:
            rows.append(("speed vs raw torch, lightning", "skipped: Lightning is not installed (pip install lightning)"))
        for arm in ("thrifty", "thrifty-sync", "raw"):
            saves = results[(arm, args.every)]
            med = lambda key: statistics.median(x[key] for x in saves) * 1000  # noqa: E731
            rows.append((f"checkpoint time per save, {arm} (mean over saves)",
                         f"{med('save_s'):.2f} ms ({saves[0]['saves']:.0f} saves a run)" if arm == "raw" else
                         f"{med('block_s'):.2f} ms on the step path, {med('write_s'):.2f} ms write "
                         f"({saves[0]['saves']:.0f} saves a run"
                         + (f"; {statistics.median(x['lag_steps'] for x in saves):.1f} steps trained while in flight)"
                            if arm == "thrifty" else ")")))
        step_ms = cpu[("raw", OFF)] / args.steps * 1000
        rows.append(("  for scale: one raw optimizer step (CPU)", f"{step_ms:.2f} ms"))
        if codelm:
            for mode, c in codelm.items():
                rows.append((f"codelm at auto, {mode}: checkpoint time on the step path / wall",
                             f"{c['step_path_fraction'] * 100:.3f} % ({c['saves']} saves in {c['wall_s']:.0f} s, "
                             f"{c['steps']} steps; periodic saves only {c['step_path_fraction_periodic'] * 100:.3f} %)"))
                rows.append((f"  codelm {mode}: block / write per save (ms)",
                             ", ".join(f"{b * 1000:.1f}/{w * 1000:.1f}" for b, w in zip(c["block_s"], c["write_s"]))))
        for how, name in (("kill", "SIGKILL"), ("term", "SIGTERM")):
            v = lost[how]
            rows.append((f"steps lost per {name} (every {args.every}): mean / max / n",
                         f"{statistics.mean(v):.1f} / {max(v)} / {len(v)}" if v else "none measured"))
        width = max(len(r[0]) for r in rows)
        print(f"\n{'measure':<{width}}  value")
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "args": vars(args), "rows": dict(rows), "lost_steps": lost, "codelm": codelm,
                "runs": {f"{a}/{e}": v for (a, e), v in results.items()}}, indent=2))
            print(f"\nwrote {args.json}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
