"""Start-up a node pays before its first step: training imports no torch._dynamo (1-2 s, and a torchinductor_<user>
folder in the temp directory) while nothing compiles, and compiling still works when something does."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import PYTHON, REPO, python_env

TRAIN = '''
import json, sys
from thrifty.config import build_config
from training.loop import train
result = train(build_config(json.loads(sys.argv[1])))
print(json.dumps({"status": result.status, "dynamo": sorted(m for m in sys.modules if m.startswith("torch._dynamo.")),
                  "inductor": "torch._inductor" in sys.modules}))
'''

COMPILE = '''
import copy, json, sys, torch
from training.lazy_dynamo import defer_dynamo_import
assert defer_dynamo_import()
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)
x = torch.randn(8, 4)

def forward_backward():
    opt.zero_grad()  # one of the optimizer's calls the stand-in answered: traced once the real module is in
    loss = model(x).pow(2).mean()
    loss.backward()
    return loss.detach()

def train(fn):
    losses = []
    for _ in range(3):
        losses.append(fn().item())
        opt.step()
    return losses

start = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
eager = train(forward_backward)
before = sorted(m for m in sys.modules if m.startswith("torch._dynamo."))
model.load_state_dict(start[0])
opt.load_state_dict(start[1])
compiled = train(torch.compile(forward_backward, backend="eager"))
print(json.dumps({"eager": eager, "compiled": compiled, "before": before,
                  "traced": "torch._dynamo.convert_frame" in sys.modules}))
'''


def run(code: str, tmp_path: Path, *args: str) -> dict:
    env = {**python_env(), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir(parents=True)
    out = subprocess.run([PYTHON, "-c", code, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_training_imports_no_dynamo_while_nothing_compiles(tmp_path):
    cfg = {"run_name": "nodynamo", "recipe": "digits", "store": str(tmp_path / "store"),
           "recipe_params": {"hidden": 16, "limit": 400},
           "train": {"max_epochs": 1, "micro_batch": 32, "checkpoint_every": 4, "ema_decay": 0.9}}
    got = run(TRAIN, tmp_path, json.dumps(cfg))
    assert got["status"] == "completed"  # steps, evaluations, checkpoints (optimizer state_dict), the EMA
    assert got["dynamo"] == [] and not got["inductor"], "an optimizer imported torch._dynamo though nothing compiles"
    assert not list((tmp_path / "tmp").glob("torchinductor_*"))


def test_compiling_still_works_and_traces_what_torch_traces(tmp_path):
    got = run(COMPILE, tmp_path)
    assert got["before"] == [], "eager steps, zero_grad, state_dict and load_state_dict: no torch._dynamo"
    assert got["traced"], "torch.compile loaded the real torch._dynamo"
    assert got["compiled"] == got["eager"], "the compiled forward and backward train exactly as the eager ones"
