"""``ThriftyCallback``: a Lightning ``Trainer`` under a thrifty session, in one line.

    trainer = Trainer(..., callbacks=[ThriftyCallback()])

It resumes the fit from the run's newest complete checkpoint (Lightning's own restore code reads
it, as it would from ``ckpt_path``), saves Lightning's full checkpoint through the session on the
run's cadence (``train.checkpoint_every``) and after a validation that is a new best (so the best metric's
weights exist), logs the training loss and ``val*`` metrics, and on a
stop request (spot notice, budget cap, early stopping, step limit) saves at once and stops the
Trainer after the step it finished: no step is lost. Needs the ``lightning`` extra.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl

from training.session import Session, init

UNSAVED_KEYS = ("hyper_parameters", "datamodule_hyper_parameters", "hparams_name", "hparams_type")  # rebuilt by the
#                 script; they may hold objects torch.load(weights_only=True) refuses


class ThriftyCallback(pl.Callback):
    """Checkpoint, resume and stop a Lightning fit through the run's session (``thrifty.session.init()``)."""

    def __init__(self, session: Session | None = None, config: Any = None):
        self._session = session
        self._config = config
        self._saved_step: int | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = init(self._config)
        return self._session

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        sess = self.session
        loaded = sess.load_latest()
        if loaded is not None:
            step, checkpoint = loaded
            # the Trainer restores model, optimizers, schedulers, loops and callbacks from this, as from ckpt_path
            trainer._checkpoint_connector._loaded_checkpoint = checkpoint
            self._saved_step = step

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # fit() composed its own SIGTERM handler with the session's; Lightning's raises SystemExit at the next loop
        # boundary it checks (after a batch, inside validation), before this callback can save. Make the session's
        # the only one: the stop then comes through should_stop() below, with the step saved. (Lightning restores
        # the handler it found, the session's, when the fit ends.)
        self.session.stop.install()
        total = trainer.estimated_stepping_batches
        if isinstance(total, int) or (isinstance(total, float) and math.isfinite(total)):
            self.session.set_total_steps(int(total))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        sess, step = self.session, trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        sess.log(step, **({"loss": float(loss)} if loss is not None else {}))
        stop = sess.should_stop()
        if stop or sess.should_save(step):
            self._save(trainer, step)
        if stop:
            trainer.should_stop = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        if metrics:
            self.session.log(trainer.global_step, **metrics)
            if self.session.should_save(trainer.global_step):  # a new best: the weights it scored are saved now
                self._save(trainer, trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._saved_step != trainer.global_step:
            self._save(trainer, trainer.global_step)

    def _save(self, trainer: pl.Trainer, step: int) -> None:
        if self._saved_step == step:
            return
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        for key in UNSAVED_KEYS:
            checkpoint.pop(key, None)
        self.session.save(checkpoint, step)
        self._saved_step = step
