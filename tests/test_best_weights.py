"""The best metric names weights that exist: an evaluation that is a new best is saved at once, in recipe mode, in
script mode and with the Lightning callback, and a sweep's gold is the weights its reported metric was measured on.
Each test loads the gold weights, evaluates them on CPU and gets the reported metric exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scripting import committed_steps, start, summary, write_config
from thrifty.config import RunConfig, build_config
from thrifty.runs.checkpoints import committed, step_prefix
from thrifty.storage import join_key, open_store

# min_delta no evaluation can beat: the first evaluation stays the best, patience runs out two evaluations later,
# so the best lands between checkpoints, never on the cadence nor at the end
UNBEATABLE = 1e6


def evaluate_checkpoint(cfg: RunConfig, step: int) -> dict[str, float]:
    """Load the recipe's model from the run's checkpoint at ``step`` and evaluate it as the loop does."""
    from training.data import open_cache
    from training.steps import evaluate
    from training.validate import check_config

    recipe, params = check_config(cfg)
    store = open_store(cfg.store)
    cache, splits = open_cache(store, recipe, params)
    model = recipe.make_model(params, cache.manifest["meta"])
    state = torch.load(store.local_path(join_key(step_prefix(cfg.run_name, step), "state.pt")), weights_only=True)
    model.load_state_dict(state["model"])
    return evaluate(model, recipe, splits, torch.device("cpu"), None, cfg.train.micro_batch * cfg.train.grad_accum_steps)


def recipe_config(tmp_path: Path, run_name: str, recipe: str, metric: str, mode: str, **train) -> RunConfig:
    return build_config({
        "run_name": run_name, "recipe": recipe, "store": str(tmp_path / "store"),
        "recipe_params": {"limit": 400, "dropout": 0.1},  # 320 train examples: 10 steps an epoch of 32
        "train": {"max_epochs": 6, "micro_batch": 32, "precision": "fp32", "checkpoint_every": 15, "lr": 0.05,
                  "early_stopping": {"metric": metric, "mode": mode, "patience": 2, "min_delta": UNBEATABLE},
                  **train}})


def test_an_own_recipes_best_checkpoint_holds_the_weights_that_scored_it(tmp_path):
    """SGD + OneCycleLR + its own metric: the best (step 10) comes between checkpoints (every 15); the summary's
    checkpoint_step is the best's step and those weights score the reported value exactly."""
    from training.loop import train

    cfg = recipe_config(tmp_path, "own", "recipes_custom:onecycle", "val_hit", "max")
    result = train(cfg)
    best = result.summary.best_metric
    assert result.summary.stopped_early and (best.name, best.step) == ("val_hit", 10)
    assert best.checkpoint_step == best.step, best
    assert evaluate_checkpoint(cfg, best.checkpoint_step)["val_hit"] == best.value
    # retention keeps it beside the last two, and its COMMIT names the metric it scored
    infos = {c.step: c for c in committed(open_store(cfg.store), "own")}
    assert 10 in infos and infos[10].metric == best.value
    assert all(c.metric is None for s, c in infos.items() if s != 10), "only a new best's COMMIT names a metric"
    from thrifty.archive.store import run_facts  # archival keeps those weights hot

    s = open_store(cfg.store)
    assert run_facts(s, "own", s.list("runs/own/")).best_steps == {10}


def test_a_resumed_run_keeps_its_best_weights(tmp_path):
    """Killed after its best (SIGTERM-like stop by max_steps) and resumed: the best checkpoint survives retention."""
    from training.loop import train

    first = recipe_config(tmp_path, "resumed", "digits", "val_loss", "min", keep_last=1, max_steps=25)
    train(first)
    cfg = recipe_config(tmp_path, "resumed", "digits", "val_loss", "min", keep_last=1)
    best = train(cfg).summary.best_metric
    assert best.checkpoint_step == best.step == 10
    assert evaluate_checkpoint(cfg, 10)["val_loss"] == best.value


SCRIPT_DATA = '''
import torch
g = torch.Generator().manual_seed(0)
x, w_true = torch.randn(256, 8, generator=g), torch.randn(8, 1, generator=g)
y = x @ w_true + 0.3 * torch.randn(256, 1, generator=g)
x_val = torch.randn(64, 8, generator=g)
y_val = x_val @ w_true

def val_loss(model):
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x_val), y_val).item()
'''

SCRIPT = SCRIPT_DATA + '''
from thrifty import session

sess = session.init(total_steps=80)
sess.seed()
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.02)
step = 0
resumed = sess.load_latest()
if resumed is not None:
    step, state = resumed
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
while step < sess.total_steps:
    idx = torch.from_numpy(sess.batch_indices(step, 256, 32))
    loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    sess.log(step, loss=loss.item())
    if step % 8 == 0:
        sess.log(step, val_loss=val_loss(model))
    stop = sess.should_stop()
    if stop or sess.should_save(step) or step == sess.total_steps:
        sess.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)
    if stop:
        break
'''


@pytest.mark.slow
def test_a_scripts_best_evaluation_is_saved_when_should_save_says_so(tmp_path):
    """A script that logs val_loss every 8 steps and saves when sess.should_save(step) says so (checkpoint_every
    50): its best (step 8) is saved, and those weights score the reported value."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    config = write_config(tmp_path, "script-best", f"python {script}", checkpoint_every=50,
                          early_stopping={"metric": "val_loss", "patience": 2, "min_delta": UNBEATABLE})
    proc = start(config, tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    store = tmp_path / "store"
    best = summary(store, "script-best")["best_metric"]
    assert best["step"] == 8 and best["checkpoint_step"] == 8, best
    assert committed_steps(store, "script-best") == [8, 24]
    namespace: dict = {}
    exec(SCRIPT_DATA, namespace)
    model = torch.nn.Linear(8, 1)
    state = torch.load(store / "runs" / "script-best" / "ckpt" / "step-000000008" / "state.pt", weights_only=True)
    model.load_state_dict(state["state"]["model"])
    assert namespace["val_loss"](model) == best["value"]


LIGHTNING = '''
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset
from training.lightning import ThriftyCallback

g = torch.Generator().manual_seed(0)
x, y = torch.randn(256, 8, generator=g), torch.randint(0, 3, (256,), generator=g)
x_val, y_val = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 3)
    def training_step(self, batch, _):
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
    def validation_step(self, batch, _):
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1]))
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

if __name__ == "__main__":
    pl.seed_everything(0)
    pl.Trainer(max_epochs=6, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, callbacks=[ThriftyCallback()]).fit(
        Net(), DataLoader(TensorDataset(x, y), batch_size=32), DataLoader(TensorDataset(x_val, y_val), batch_size=64))
'''


@pytest.mark.slow
def test_lightnings_best_validation_is_saved_and_scores_the_reported_value(tmp_path, monkeypatch):
    """Validation after each epoch of 8 steps, checkpoints every 100: the best validation (step 8) is saved by the
    callback at once, and its state_dict scores the reported val_loss exactly."""
    script = tmp_path / "lit.py"
    script.write_text(LIGHTNING)
    config = write_config(tmp_path, "lit-best", f"python {script}", checkpoint_every=100,
                          early_stopping={"metric": "val_loss", "patience": 2, "min_delta": UNBEATABLE})
    proc = start(config, tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    store = tmp_path / "store"
    best = summary(store, "lit-best")["best_metric"]
    assert best["step"] == 8 and best["checkpoint_step"] == 8, best
    monkeypatch.syspath_prepend(str(tmp_path))
    import lit  # the module's data and model, not its fit (guarded by __main__)

    net = lit.Net()
    state = torch.load(store / "runs" / "lit-best" / "ckpt" / "step-000000008" / "state.pt", weights_only=True)
    net.load_state_dict(state["state"]["state_dict"])
    net.eval()
    with torch.no_grad():
        value = torch.nn.functional.cross_entropy(net.net(lit.x_val), lit.y_val).item()
    assert value == best["value"]


@pytest.mark.parametrize("metric, mode", [("val_loss", None), ("val_accuracy", "max")])
def test_a_sweeps_gold_is_the_weights_its_reported_metric_was_measured_on(tmp_path, metric, mode):
    """Two trials trained to their end: the winner's gold checkpoint, loaded and evaluated, scores what the search
    reports for it, whether the search ranks by the early-stopping metric (the best, between checkpoints) or by
    another (the last evaluation, of the final weights)."""
    from tasks.sweep_report import mark_gold
    from thrifty.sweep import best_trial, build_sweep, load_state, observe
    from training.loop import train

    base = recipe_config(tmp_path, "x", "digits", "val_loss", "min").model_dump(mode="json")
    cfg = build_sweep({"name": "gold", "base": base, "max_trials": 2, "min_epochs": 2, "eta": 3, "max_epochs": 6,
                       "metric": metric, **({"mode": mode} if mode else {}),
                       "space": {"train.lr": {"choice": [0.01, 0.05]}, "train.seed": {"int": [0, 99]}}})
    store = open_store(cfg.base.store)
    for i in range(cfg.max_trials):
        train(cfg.trial(i))
    trials = load_state(store, cfg).trials
    for t in trials:
        observe(store, cfg, t)
    best = best_trial(trials, cfg.rank_mode)
    assert best is not None and best.status == "finished"
    gold = mark_gold(store, cfg, best)
    step = int(gold.rstrip("/").rsplit("-", 1)[1])
    assert evaluate_checkpoint(cfg.trial(best.index), step)[metric] == best.ranking_value()
    policy = json.loads((Path(cfg.base.store) / "archive-policy.json").read_text())
    assert gold in policy["gold"]


def test_a_trials_milestones_hold_that_epochs_evaluation_and_its_result_the_best(tmp_path):
    """state.json's metrics[k] is the evaluation at the end of epoch k (its rung's, and the last one's at the full
    budget), not the run's best; what the trial is ranked by once trained to its end is its result: the best."""
    from thrifty.runs import read_metrics
    from thrifty.sweep import build_sweep, load_state, observe
    from training.loop import train

    # the first evaluation stays the best (nothing beats it by min_delta) and patience never runs out: the run trains
    # all 6 epochs and its best (epoch 1) is not its last evaluation (epoch 6)
    base = recipe_config(tmp_path, "x", "digits", "val_loss", "min").model_dump(mode="json")
    base["train"]["early_stopping"]["patience"] = 50
    cfg = build_sweep({"name": "epochs", "base": base, "max_trials": 1, "min_epochs": 2, "eta": 3, "max_epochs": 6,
                       "space": {"train.lr": {"choice": [0.05]}}})
    train(cfg.trial(0, stop_at_epoch=2))
    train(cfg.trial(0))
    store = open_store(cfg.base.store)
    [t] = load_state(store, cfg).trials
    observe(store, cfg, t)
    evals = {r["step"]: r["val_loss"] for r in read_metrics(store, t.run_name) if r.get("event") == "eval"}
    assert t.status == "finished" and t.reached == 6
    assert t.metrics == {2: evals[20], 6: evals[60]}, (t.metrics, evals)
    assert (t.result, t.result_step) == (evals[10], 10) and t.ranking_value() == evals[10] != evals[60]
