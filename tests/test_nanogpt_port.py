"""A script of nanoGPT's shape ported to script mode keeps working: module-level settings overridden by an exec-style
configurator that rejects unknown keys (so no ``--config`` on its command line), a batch prefetched before the loop
and carried in the checkpoint, an evaluation every N iterations. It resumes bit-exact after a notice, runs by hand
with ``THRIFTY_RUN_CONFIG=run.yaml``, and a changed model (``--n_embd``) on a run with a checkpoint ends with exit 2
naming the mismatch before it trains, instead of failing (and being billed) on every restart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import PYTHON, python_env
from scripting import records, start, summary, write_config

pytestmark = pytest.mark.slow

TRAIN = '''
import os, signal, sys
from ast import literal_eval
import torch
from thrifty import session

# -----------------------------------------------------------------------------
eval_interval = 5   # iterations between evaluations
eval_iters = 2      # batches per evaluation
batch_size = 8
block_size = 16
n_embd = 32
max_iters = 30
learning_rate = 1e-3
config_keys = [k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))]
for arg in sys.argv[1:]:  # nanoGPT's configurator: --key=value for known keys only
    key, val = arg[2:].split("=")
    if key not in globals():
        raise ValueError(f"Unknown config key: {key}")
    globals()[key] = literal_eval(val)
# -----------------------------------------------------------------------------

sess = session.init(total_steps=max_iters)
sess.seed()
data = torch.randint(0, 50, (2000,), generator=torch.Generator().manual_seed(0))

def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    return torch.stack([data[i:i + block_size] for i in ix]), torch.stack([data[i + 1:i + 1 + block_size] for i in ix])

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(50, n_embd)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(n_embd, 50)
    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.head(self.drop(self.wte(x))).view(-1, 50), y.view(-1))

model = Model()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
iter_num = 0
X, Y = get_batch()  # the first batch, prefetched
resumed = sess.load_latest()
if resumed is not None:
    iter_num, checkpoint = resumed
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    X, Y = checkpoint["X"], checkpoint["Y"]

notice_at = int(os.environ.get("NOTICE_AT", "0"))
while iter_num < max_iters:
    if iter_num % eval_interval == 0:
        model.eval()
        with torch.no_grad():
            val = sum(model(*get_batch()).item() for _ in range(eval_iters)) / eval_iters
        model.train()
        sess.log(iter_num, val_loss=val)
    loss = model(X, Y)
    X, Y = get_batch()  # prefetch the next batch while the GPU works
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    iter_num += 1
    sess.log(iter_num, loss=loss.item())
    if iter_num == notice_at:
        os.kill(os.getpid(), signal.SIGTERM)
    stop = sess.should_stop()
    if stop or sess.should_save(iter_num) or iter_num == max_iters:
        sess.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "X": X, "Y": Y}, iter_num)
    if stop:
        break
'''


def port(tmp: Path, name: str, args: str = "") -> Path:
    script = tmp / "train.py"
    script.write_text(TRAIN)
    return write_config(tmp, name, f"python {script} {args}".strip(), checkpoint_every=7,
                        early_stopping={"enabled": False})


def run(config: Path, tmp: Path, **env: str) -> tuple[int, str]:
    proc = start(config, tmp, **env)
    _, err = proc.communicate(timeout=180)
    return proc.returncode, err


def test_a_nanogpt_style_port_resumes_bit_exact_after_a_notice(tmp_path):
    assert run(port(tmp_path, "straight"), tmp_path)[0] == 0
    config = port(tmp_path, "noticed")
    code, err = run(config, tmp_path, NOTICE_AT="12")
    assert code == 0, err[-3000:]
    assert [r["step"] for r in records(tmp_path / "store", "noticed") if r.get("event") == "interrupted"] == [12]
    code, err = run(config, tmp_path)
    assert code == 0, err[-3000:]
    assert summary(tmp_path / "store", "noticed")["weights_sha256"] == summary(tmp_path / "store", "straight")[
        "weights_sha256"], "the weights, the optimizer and the prefetched batch are those of a run never stopped"
    evals = [r["step"] for r in records(tmp_path / "store", "noticed") if r.get("event") == "eval"]
    assert evals == [0, 5, 10, 15, 20, 25], "every 5 iterations, none twice, none skipped"
    saves = [r["step"] for r in records(tmp_path / "store", "noticed") if r.get("event") == "checkpoint"]
    assert saves == [7, 12, 14, 21, 28, 30], "on multiples of checkpoint_every across the resume, a stop's save beside"


def test_a_changed_model_on_a_run_with_a_checkpoint_is_exit_2_naming_the_mismatch(tmp_path):
    code, err = run(port(tmp_path, "gpt"), tmp_path, NOTICE_AT="9")
    assert code == 0, err[-3000:]
    code, err = run(port(tmp_path, "gpt", "--n_embd=48"), tmp_path)
    assert code == 2, err[-3000:]
    assert "run 'gpt' has a checkpoint (step 9) that does not fit the model this script built" in err
    assert "size mismatch for wte.weight" in err
    assert "recipe_params.command was" in err and "--n_embd=48" in err, "what changed since it was saved"
    assert not [r for r in records(tmp_path / "store", "gpt") if r.get("step", 0) > 9 and "loss" in r], "nothing trained"


def test_running_the_port_by_hand_takes_its_config_from_the_environment(tmp_path):
    """nanoGPT's configurator refuses `--config`, so by hand the RunConfig comes from THRIFTY_RUN_CONFIG (a file)."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    cfg = {"run_name": "by-hand", "recipe": "script", "store": str(tmp_path / "store"),
           "recipe_params": {"command": f"python {script}"},
           "train": {"checkpoint_every": 10, "early_stopping": {"enabled": False}}}
    (tmp_path / "nanogpt.yaml").write_text(yaml.safe_dump(cfg))
    refused = subprocess.run([PYTHON, str(script), "--config=nanogpt.yaml"], cwd=tmp_path, env=python_env(),
                             capture_output=True, text=True, timeout=120)
    assert "Unknown config key: config" in refused.stderr  # the script's own rule, which thrifty must not need
    by_hand = subprocess.run([PYTHON, str(script), "--max_iters=20"], cwd=tmp_path, capture_output=True, text=True,
                             env={**python_env(), "THRIFTY_RUN_CONFIG": "nanogpt.yaml"}, timeout=120)
    assert by_hand.returncode == 0, by_hand.stderr[-3000:]
    done = summary(tmp_path / "store", "by-hand")
    assert done["status"] == "completed" and done["steps"] == 20
