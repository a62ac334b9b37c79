"""``ThriftyCallback``: a Lightning ``Trainer`` under a thrifty session, in one line.

    trainer = Trainer(..., callbacks=[ThriftyCallback()])

It resumes the fit from the run's newest complete checkpoint (Lightning's own restore code reads
it, as it would from ``ckpt_path``) at the exact batch: a plain ``DataLoader`` is rebuilt as
torchdata's ``StatefulDataLoader`` (``training.lightning_data``), and the RNG streams are set back as
they were at the save. It saves Lightning's full checkpoint through the session on the run's
cadence (``train.checkpoint_every``) and after a validation that is a new best (so the best metric's
weights exist), logs the training loss and ``val*`` metrics, and on a stop
request (spot notice, budget cap, early stopping, step limit) saves at once and stops the Trainer
after the step it finished, without the validation Lightning would add: no step is lost. After
``fit()`` returns, ``callback.stopped`` says whether the run was stopped unfinished (skip the test and
the export then; the job resumes). Lightning's default logger and default ``ModelCheckpoint`` are
turned off (they wrote ``lightning_logs/version_N`` into the project on every attempt); a logger or
``ModelCheckpoint`` you pass yourself is kept. Needs the ``lightning`` extra.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from training.lightning_data import ResumableSource, epoch_done
from training.runtime import rng_state, set_rng_state
from training.session import ScriptError, Session, init

log = logging.getLogger("thrifty.session")

UNSAVED_KEYS = ("hyper_parameters", "datamodule_hyper_parameters", "hparams_name", "hparams_type")  # rebuilt by the
#                 script; they may hold objects torch.load(weights_only=True) refuses


class ThriftyCallback(pl.Callback):
    """Checkpoint, resume and stop a Lightning fit through the run's session (``thrifty.session.init()``).

    ``exact_resume=False`` lets a training loader that cannot resume at its exact batch (an iterable dataset
    without state) through with a warning instead of stopping the fit (exit 2) before it trains."""

    def __init__(self, session: Session | None = None, config: Any = None, exact_resume: bool = True):
        self._session = session
        self._config = config
        self._exact_resume = exact_resume
        self._saved_step: int | None = None
        self._rng: dict[str, Any] | None = None  # the RNG streams of the checkpoint resumed from
        self._loader_rng = torch.Generator()  # the rebuilt training loader's (workers' seeds): checkpointed here
        self._save_after_validation = False  # a save due where Lightning validates next: taken after it

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = init(self._config)
        return self._session

    @property
    def stopped(self) -> bool:
        """True when the fit was stopped with the run unfinished (a spot notice, the budget cap, the smoke test's step
        limit): its checkpoint is saved and the job resumes it. Check it after ``fit()`` and end the script then."""
        return self._session is not None and self._session.stopped

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        _quiet_defaults(trainer)
        self._loader_rng.manual_seed(torch.initial_seed() + 1)  # from the script's seed; a resume restores its state
        trainer.fit_loop._data_source = ResumableSource(trainer.fit_loop._data_source, self._inexact, self._loader_rng)
        sess = self.session
        loaded = sess.load_latest(like={"state_dict": pl_module.state_dict()})  # exit 2 if the model changed
        if loaded is not None:
            step, checkpoint = loaded
            # the Trainer restores model, optimizers, schedulers, loops and callbacks from this, as from ckpt_path
            trainer._checkpoint_connector._loaded_checkpoint = checkpoint
            self._saved_step = step
            self._rng = rng_state()

    def _inexact(self, why: str) -> None:
        if self._exact_resume:
            raise ScriptError(f"{why}. (ThriftyCallback(exact_resume=False) accepts it.)")
        log.warning("%s; a resumed fit restarts this epoch (ThriftyCallback(exact_resume=False))", why)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # fit() composed its own SIGTERM handler with the session's; Lightning's raises SystemExit at the next loop
        # boundary it checks (after a batch, inside validation), before this callback can save. Make the session's
        # the only one: the stop then comes through should_stop() below, with the step saved. (Lightning restores
        # the handler it found, the session's, when the fit ends.)
        self.session.stop.install()
        if self._rng is not None:  # building the loaders drew from them since the load: train on from the save's
            set_rng_state(self._rng)
            self._rng = None
        total = trainer.estimated_stepping_batches
        if isinstance(total, int) or (isinstance(total, float) and math.isfinite(total)):
            self.session.set_total_steps(int(total))
        self.session.describe(parameters=sum(p.numel() for p in pl_module.parameters()),
                              examples_per_step=_examples_per_step(trainer))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        sess, step = self.session, trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        sess.log(step, **({"loss": float(loss)} if loss is not None else {}))
        stop = sess.should_stop()
        if stop or sess.should_save(step):
            # Lightning validates after this batch (an epoch's end, val_check_interval): save after that, as its own
            # ModelCheckpoint does; a resume from here would skip the validation (and its draws of the RNG)
            if trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
                self._save_after_validation = True
            else:
                self._save(trainer, step, batch_end=True)
        if stop:
            trainer.should_stop = True
            if not self._save_after_validation:  # none of the validation Lightning adds for a stop: it would log a
                trainer.fit_loop.epoch_loop._skip_next_val = True  # half-trained model as best, move early stopping

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val")}
        if metrics:
            self.session.log(trainer.global_step, **metrics)
        new_best = bool(metrics) and self.session.should_save(trainer.global_step)  # its weights are saved now
        if self._save_after_validation or new_best:
            self._save_after_validation = False
            self._save(trainer, trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"loader_rng": self._loader_rng.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "loader_rng" in state_dict:
            self._loader_rng.set_state(state_dict["loader_rng"])

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._saved_step != trainer.global_step:
            self._save(trainer, trainer.global_step)

    def _save(self, trainer: pl.Trainer, step: int, batch_end: bool = False) -> None:
        if self._saved_step == step:
            return
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        for key in UNSAVED_KEYS:
            checkpoint.pop(key, None)
        if batch_end and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:  # (after a validation Lightning
            epoch_done(checkpoint)  # starts the next epoch by itself)
        self.session.save(checkpoint, step)
        self._saved_step = step


def _quiet_defaults(trainer: pl.Trainer) -> None:
    """Turn off what Lightning adds by default and Thrifty does itself: the logger that writes
    ``lightning_logs/version_N`` (Thrifty's metric lines hold the loss and ``val*``) and the ``ModelCheckpoint``
    that writes a second set of checkpoints there. A logger or ModelCheckpoint the script passed is kept."""
    root = Path(trainer.default_root_dir).resolve()
    default_logs = [lg for lg in trainer.loggers if type(lg) in (TensorBoardLogger, CSVLogger)
                    and lg.name == "lightning_logs" and Path(lg.save_dir or "").resolve() == root]
    if default_logs:
        trainer.loggers = [lg for lg in trainer.loggers if lg not in default_logs]
    for lg in default_logs:  # Lightning made its version_N folder before any callback could stop it: a new one
        with contextlib.suppress(Exception):  # (the next free number), empty but for a writer's header: remove it
            lg.finalize("success")
            made = Path(lg.log_dir)
            if made.is_dir() and all(f.is_file() and f.stat().st_size < 65536 for f in made.iterdir()):
                shutil.rmtree(made)
                made.parent.rmdir()  # lightning_logs itself, when nothing else is in it
    for cb in [cb for cb in trainer.callbacks if _default_checkpointing(cb)]:
        trainer.callbacks.remove(cb)  # in place: the setup hooks being called skip it


def _default_checkpointing(cb: Any) -> bool:
    return (type(cb) is ModelCheckpoint and cb.dirpath is None and cb.monitor is None and cb.filename is None
            and cb.save_top_k == 1 and not cb.save_last and cb._every_n_train_steps == 0
            and cb._train_time_interval is None and cb._every_n_epochs == 1)


def _examples_per_step(trainer: pl.Trainer) -> int | None:
    """Examples one optimizer step trains on, when the training loader says its batch size."""
    batch = getattr(trainer.train_dataloader, "batch_size", None)
    if not isinstance(batch, int):
        return None
    return batch * trainer.accumulate_grad_batches * trainer.world_size
