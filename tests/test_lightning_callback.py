"""The Lightning callback: a Trainer with `callbacks=[ThriftyCallback()]` resumes after kill -9 from its last
COMMIT and, on SIGTERM (a spot notice), saves the step it reached and stops: no step lost."""

from __future__ import annotations

import signal
import time

import pytest

from conftest import REPO
from scripting import committed_steps, kill_group, logged_step, records, start, starts, summary, wait_for_step, \
    write_config

pytestmark = pytest.mark.slow

SCRIPT = REPO / "examples" / "script" / "lightning_train.py"

def test_lightning_resumes_after_kill_and_loses_no_step_on_sigterm(tmp_path):
    store = tmp_path / "store"
    config = write_config(tmp_path, "lit", f"python {SCRIPT} --epochs 4")  # 4 x 44 batches: room for the signals

    t0 = time.time()
    proc = start(config, tmp_path)
    wait_for_step(proc, store, "lit", 25, since=t0)
    kill_group(proc)  # kill -9: the wrapper and the script
    killed_at = committed_steps(store, "lit")[-1]
    # checkpoints every 10 steps, written in the background: step 20's may still be in flight, never step 10's too
    assert killed_at >= 10, "checkpoints every 10 steps"

    t0 = time.time()
    proc = start(config, tmp_path)
    wait_for_step(proc, store, "lit", killed_at + 12, since=t0)
    proc.send_signal(signal.SIGTERM)  # a spot notice to the node program, forwarded to the script
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    reached = logged_step(store, "lit", since=t0)
    stopped = [r for r in records(store, "lit") if r.get("event") == "interrupted"][-1]
    assert stopped["reason"] == "signal"
    assert committed_steps(store, "lit")[-1] == stopped["step"] == reached, "0 steps lost on SIGTERM"

    proc = start(config, tmp_path)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert starts(store, "lit") == [0, killed_at, reached], "each attempt resumed from the last COMMIT"
    done = summary(store, "lit")
    assert done["status"] == "completed" and done["resumes"] == 2
    assert done["steps"] == done["total_steps"] == 176


SELF_TERM = '''
import os, signal
import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset
from training.lightning import ThriftyCallback

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)
    def training_step(self, batch, _):
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

class Notice(pl.Callback):  # after ThriftyCallback: the notice lands once it has looked for one at this step
    def on_train_batch_end(self, trainer, *_):
        if trainer.global_step == 15:
            os.kill(os.getpid(), signal.SIGTERM)

torch.manual_seed(0)
data = TensorDataset(torch.randn(320, 8), torch.randint(0, 2, (320,)))
pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
           enable_model_summary=False, callbacks=[ThriftyCallback(), Notice()]).fit(Net(), DataLoader(data, 8))
'''


def test_a_notice_lightning_sees_first_still_saves_the_step_and_is_never_called_complete(tmp_path):
    """Lightning composes its own SIGTERM handler with the session's and exits at the next loop boundary it checks;
    a notice arriving after the callback looked for one must still end in a saved step and an 'interrupted' run."""
    script = tmp_path / "self_term.py"
    script.write_text(SELF_TERM)
    store = tmp_path / "store"
    proc = start(write_config(tmp_path, "notice", f"python {script}"), tmp_path)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stopped = [r for r in records(store, "notice") if r.get("event") in ("interrupted", "end")]
    assert [r["event"] for r in stopped] == ["interrupted"], stopped
    assert stopped[0]["reason"] == "signal" and stopped[0]["step"] == 16, "the step after the notice, then stop"
    assert committed_steps(store, "notice")[-1] == 16, "the step it stopped at is saved: 0 steps lost"
    assert not (store / "runs" / "notice" / "summary.json").exists(), "an interrupted run has no final summary"
