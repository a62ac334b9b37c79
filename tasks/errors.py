"""How a step ends on an error its user can fix: a Failed state carrying the message alone.

Raised, such an error would be logged with its traceback by the task, again by the flow, and
once more by the hooks. A task decorated with :func:`fails_quietly` returns ``Failed`` named
``BadInput`` instead; the flow ends with the same message and ``thrifty run`` exits 2.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, TypeVar

from prefect.states import Failed, State

from thrifty.config import ConfigError
from thrifty.config.echo import shorten_words
from thrifty.money.estimate import OverBudgetPlan
from thrifty.storage import StoreError, StoreUnavailable
from training.validate import SmokeTestFailed

BAD_INPUT = "BadInput"  # the name of a Failed state a user error ends in
USER_ERRORS = (ConfigError, StoreError, OverBudgetPlan, SmokeTestFailed)

F = TypeVar("F", bound=Callable[..., Any])


class _NoEmptyTraceback(logging.Filter):
    """Prefect logs a task's returned Failed state with ``exc_info=True`` and no exception in flight, which prints
    a bare "NoneType: None" under the message: drop the empty exception info, keep the line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[0] is None:
            record.exc_info = None
        return True


logging.getLogger("prefect.task_runs").addFilter(_NoEmptyTraceback())


class _NoTracebackForAFailedState(logging.Filter):
    """A deployed flow run that ends Failed (bad input, a stop at the cap, parameters the flow refused) makes
    Prefect's engine log "Engine execution exited with unexpected exception" with a traceback of its own internals
    under the state's message: keep the line and the message, drop the traceback that says nothing more."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and record.getMessage().startswith("Engine execution exited"):
            from prefect.exceptions import FailedRun, ParameterTypeError

            if isinstance(exc, (FailedRun, ParameterTypeError, *USER_ERRORS)):
                record.msg, record.args, record.exc_info = f"the flow run ended failed: {exc}", None, None
        return True


logging.getLogger("prefect.flow_runs").addFilter(_NoTracebackForAFailedState())


def bad_input(exc: BaseException) -> State:
    return Failed(name=BAD_INPUT, message=shorten_words(f"{type(exc).__name__}: {exc}"))


def fails_quietly(fn: F) -> F:
    """Turn the user errors ``fn`` raises into a ``BadInput`` Failed state (for a Prefect task's body), and a store
    that stayed down past its retry window into a plain Failed one with the store's words (not the user's fault)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as exc:
            return bad_input(exc)
        except StoreUnavailable as exc:
            return Failed(message=f"StoreUnavailable: {exc}")

    return wrapper  # type: ignore[return-value]
