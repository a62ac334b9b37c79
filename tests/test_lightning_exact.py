"""A Lightning fit under ThriftyCallback resumes at the exact batch: a plain shuffled DataLoader over a map-style
dataset, num_workers 0 and 2, stopped by a spot notice mid-epoch or at an epoch's end, ends with weights
bit-identical to a fit never stopped (CPU). What cannot resume exactly stops the smoke test, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scripting import records, start, write_config
from thrifty.config import build_config
from training.smoke import smoke_test
from training.validate import SmokeTestFailed

pytestmark = pytest.mark.slow

# dropout, a shuffled loader and AdamW: a batch trained twice or skipped, or an RNG stream off by one draw, shows in
# every weight. NOTICE_AT=N sends the script SIGTERM after step N (the session sees it at the next step).
SCRIPT = '''
import os, signal, sys
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset
from training.lightning import ThriftyCallback

workers, validate = int(sys.argv[1]), sys.argv[2] == "val"
notice_at = int(os.environ.get("NOTICE_AT", "0"))

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                       torch.nn.Linear(16, 2))
    def training_step(self, batch, _):
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
    def validation_step(self, batch, _):
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1]))
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)

class Notice(pl.Callback):
    def on_train_batch_end(self, trainer, *_):
        if trainer.global_step == notice_at:
            os.kill(os.getpid(), signal.SIGTERM)

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(200, 8, generator=g), torch.randint(0, 2, (200,), generator=g))  # 25 batches of 8
pl.seed_everything(0)
model, thrifty = Net(), ThriftyCallback()
trainer = pl.Trainer(max_epochs=2, accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[thrifty, Notice()])
trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True, num_workers=workers),
            DataLoader(data, batch_size=50, num_workers=workers) if validate else None)
if thrifty.stopped:  # a spot notice: the job resumes; the weights of a finished fit only
    sys.exit(0)
torch.save(model.state_dict(), os.environ["WEIGHTS_OUT"])
'''


def fit(tmp: Path, name: str, workers: int, validate: bool, *notices: int) -> dict[str, torch.Tensor]:
    script = tmp / "fit.py"
    script.write_text(SCRIPT)
    config = write_config(tmp, name, f"python {script} {workers} {'val' if validate else 'noval'}", checkpoint_every=5)
    for notice in notices:
        proc = start(config, tmp, NOTICE_AT=str(notice), WEIGHTS_OUT=str(tmp / f"{name}.pt"))
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    return torch.load(tmp / f"{name}.pt")


@pytest.mark.parametrize("workers, validate", [
    (2, True),   # worker processes; the epoch's last batch comes before its validation: saved after it
    (0, False),  # no validation: at the epoch's end the next epoch starts from the saved shuffle
])
def test_a_fit_stopped_by_notices_ends_bit_identical_to_one_never_stopped(tmp_path, workers, validate):
    straight = fit(tmp_path, "straight", workers, validate, 0)
    # a notice mid-epoch (saved at step 13, off the 5-step cadence), then one at the first epoch's last batch
    resumed = fit(tmp_path, "resumed", workers, validate, 12, 24, 0)
    runs = records(tmp_path / "store", "resumed")
    assert [r["step"] for r in runs if r.get("event") == "interrupted"] == [13, 25], "each stop the step after its notice"
    assert [r["step"] for r in runs if r.get("event") == "start"] == [0, 13, 25], "each attempt resumed where it stopped"
    different = [k for k in straight if not torch.equal(straight[k], resumed[k])]
    assert not different, f"weights differ after the resumes: {different}"
    evals = [r["step"] for r in runs if r.get("event") == "eval"]
    assert evals == ([25, 50] if validate else []), "no validation added by a stop, none skipped by a resume"
    assert not (tmp_path / "lightning_logs").exists(), "Lightning's default logger and checkpoints are off"


ITERABLE = '''
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, IterableDataset
from training.lightning import ThriftyCallback

class Stream(IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(64):
            yield torch.randn(4, generator=g)

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, _):
        return self.net(batch).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

pl.Trainer(max_steps=40, accelerator="cpu", enable_progress_bar=False, callbacks=[ThriftyCallback()]).fit(
    Net(), DataLoader(Stream(), batch_size=8))
'''


def test_the_smoke_test_refuses_a_loader_that_cannot_resume_exactly_and_names_the_fix(tmp_path, monkeypatch):
    (tmp_path / "stream.py").write_text(ITERABLE)
    monkeypatch.chdir(tmp_path)
    cfg = build_config({"run_name": "stream", "recipe": "script", "store": str(tmp_path / "store"),
                        "recipe_params": {"command": "python stream.py", "total_steps": 40}})
    with pytest.raises(SmokeTestFailed) as err:
        smoke_test(cfg)
    assert "IterableDataset (Stream) without state_dict()/load_state_dict()" in str(err.value)
    assert "map-style Dataset" in str(err.value) and "StatefulDataLoader" in str(err.value)


GOES_ON = SCRIPT.replace('''if thrifty.stopped:  # a spot notice: the job resumes; the weights of a finished fit only
    sys.exit(0)
torch.save(model.state_dict(), os.environ["WEIGHTS_OUT"])''', '''print("stopped:", thrifty.stopped, flush=True)
trainer.test(model, DataLoader(data, batch_size=50), ckpt_path="best")  # no ModelCheckpoint: this raises''')


def test_after_a_stop_fit_returns_without_a_validation_and_the_job_ends_as_the_stop_says(tmp_path):
    """A script that goes on after fit() (test, predict) without checking callback.stopped: the stop added no
    validation (none logged, early stopping untouched), the script can tell, and whatever it does next the job
    ends as an interruption with its step saved (exit 0, resumed later), not as a failure to restart."""
    (tmp_path / "goes_on.py").write_text(GOES_ON)
    config = write_config(tmp_path, "goes-on", f"python {tmp_path / 'goes_on.py'} 0 val", checkpoint_every=5)
    proc = start(config, tmp_path, NOTICE_AT="12")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "stopped: True" in out
    assert "the script went on after the stop and failed" in err
    runs = records(tmp_path / "store", "goes-on")
    assert [r["step"] for r in runs if r.get("event") == "eval"] == [], "no validation of the half-trained model"
    assert [(r["event"], r["step"]) for r in runs if r.get("event") in ("interrupted", "end")] == [("interrupted", 13)]


def test_the_smoke_test_reports_what_a_lightning_script_uses(tmp_path, monkeypatch):
    (tmp_path / "fit.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    cfg = build_config({"run_name": "figures", "recipe": "script", "store": str(tmp_path / "store"),
                        "recipe_params": {"command": f"python {tmp_path / 'fit.py'} 0 val"},
                        "train": {"micro_batch": 64}})
    result = smoke_test(cfg)
    assert result.examples_per_step == 8, "the loader's batch, not the config's micro_batch"
    assert result.parameters == 8 * 16 + 16 + 16 * 2 + 2
    assert not (tmp_path / "lightning_logs").exists()
