"""A Lightning script under Thrifty: the one line is `callbacks=[ThriftyCallback()]`.

`THRIFTY_RUN_CONFIG=CONFIG python examples/script/lightning_train.py` by hand, or `recipe: script` with this
command. Needs `pip install -e '.[lightning]'`.
"""

import argparse

import lightning.pytorch as pl
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from training.lightning import ThriftyCallback

parser = argparse.ArgumentParser()
parser.add_argument("--config")
parser.add_argument("--epochs", type=int, default=5)
args = parser.parse_args()


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


x, y = load_digits(return_X_y=True)
data = TensorDataset(torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y))
train, val = torch.utils.data.random_split(data, [1400, len(data) - 1400], generator=torch.Generator().manual_seed(0))
pl.seed_everything(0)
thrifty = ThriftyCallback()  # the one line, in callbacks=[...] below
trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[thrifty])
trainer.fit(Classifier(), DataLoader(train, batch_size=32, shuffle=True), DataLoader(val, batch_size=256))
if thrifty.stopped:  # a spot notice or the budget cap: the checkpoint is saved and the job resumes it; end here
    raise SystemExit(0)
