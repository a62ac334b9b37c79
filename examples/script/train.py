"""Your own training script under Thrifty: a plain PyTorch MLP on scikit-learn's digits.

Run it through the pipeline (`thrifty run --config examples/script.yaml`) or by hand
(`python examples/script/train.py --config examples/script.yaml`). Five session calls make it
spot-safe: init, load_latest, log, save, should_stop. Resume is bit-exact: the session restores
the RNG streams with the checkpoint and `batch_indices` is a pure function of the step.
"""

import argparse

import torch
from sklearn.datasets import load_digits

from thrifty import session

parser = argparse.ArgumentParser()
parser.add_argument("--config")  # for local runs; a node gets the config from the environment
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--lr", type=float, default=1e-3)
args = parser.parse_args()

x, y = load_digits(return_X_y=True)
x = torch.tensor(x / 16.0, dtype=torch.float32)
y = torch.tensor(y)
n_train = int(0.8 * len(x))
(x_train, y_train), (x_val, y_val) = (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
steps_per_epoch = n_train // args.batch

sess = session.init(total_steps=args.epochs * steps_per_epoch)
sess.seed()
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(128, 10))
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

step = 0
resumed = sess.load_latest()  # the newest complete checkpoint of this run, or None
if resumed is not None:
    step, state = resumed
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])

while step < sess.total_steps:
    idx = torch.from_numpy(sess.batch_indices(step, n_train, args.batch))
    loss = torch.nn.functional.cross_entropy(model(x_train[idx]), y_train[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    sess.log(step, loss=loss.item())
    if step % steps_per_epoch == 0:  # an evaluation per epoch: early stopping watches val_loss
        model.eval()
        with torch.no_grad():
            logits = model(x_val)
        model.train()
        sess.log(step, val_loss=torch.nn.functional.cross_entropy(logits, y_val).item(),
                 val_accuracy=(logits.argmax(1) == y_val).float().mean().item())
    stop = sess.should_stop()  # a spot notice, the budget cap, early stopping or a step limit: asked once a step
    if stop or sess.should_save(step) or step == sess.total_steps:
        sess.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)
    if stop:
        break
