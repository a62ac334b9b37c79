"""``thrifty.session``: what a training script of your own needs to run on spot instances, safely.

In the script (run by ``recipe: script``, or by hand with a config for local development)::

    from thrifty import session

    sess = session.init(total_steps=1000)         # $THRIFTY_RUN_CONFIG (JSON on a node, or a file's path by hand)
    sess.seed(); model, opt = build()             # seeds from train.seed
    step, state = sess.load_latest() or (0, None) # the run's newest complete checkpoint (RNG restored too)
    if state: model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"])
    while step < sess.total_steps:
        idx = sess.batch_indices(step, n_examples, batch_size)  # resumable data order
        ...; step += 1
        sess.log(step, loss=loss)                 # metrics, progress, the budget projection, early stopping
        stop = sess.should_stop()                 # spot notice, budget cap, early stop, step limit: once a step
        if stop or sess.should_save(step):
            sess.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)
        if stop:
            break
    if sess.stopped:                              # a spot notice, the budget cap: the job resumes; end here
        raise SystemExit(0)

The implementation lives in ``training.session`` (it needs torch); this module names it by module
path, like the CLI names its commands, so importing ``thrifty`` loads no torch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from thrifty.config import RunConfig

IMPLEMENTATION = "training.session"


def init(config: "str | Path | RunConfig | None" = None, *, total_steps: int | None = None) -> Any:
    """The session of this run: ``config`` is a RunConfig, a path to one, or None (``$THRIFTY_RUN_CONFIG``, as a
    node gets it, else ``--config FILE`` on the command line). ``total_steps`` tells the budget gate the run's length."""
    return importlib.import_module(IMPLEMENTATION).init(config, total_steps=total_steps)
