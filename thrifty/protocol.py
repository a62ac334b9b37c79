"""What a training node and the machine that launched it agree on: exit codes, environment, control objects.

The launchers (``thrifty.launchers``), the node-side notice watcher (``thrifty.launchers.notice``)
and the training program (``training``) all read these names from here, so none of them has to
import another to know what an exit code or a stop request means.
"""

from __future__ import annotations

# ---------------------------------------------------------------- exit codes of the training program and the node

EXIT_OK = 0  # finished (or stopped on a signal with its work saved)
EXIT_FAILED = 1  # a bug or a service failure: worth a restart (up to compute.max_restarts)
EXIT_BAD_INPUT = 2  # the config or the data needs a change: never worth a restart, never rented for
EXIT_BUDGET = 3  # stopped itself at the run's budget cap, with a checkpoint: never restarted (the node wrapper
#                  turns it into 0 for SkyPilot, whose managed jobs retry any other non-zero code)
EXIT_RESUMABLE = 75  # EX_TEMPFAIL: stopped on a spot notice with a checkpoint, run me again (SkyPilot recover_on_exit_codes)

# ---------------------------------------------------------------- the node's environment

ENV_CONFIG = "THRIFTY_RUN_CONFIG"  # the RunConfig as JSON
ENV_PRICES = "THRIFTY_PRICES"  # JSON list of the candidates the job may land on, each with its $/hour per node
ENV_JOB_ID = "THRIFTY_JOB_ID"  # the launcher's job id (SkyPilot nodes derive it from SKYPILOT_MANAGED_JOB_ID)
ENV_BILLING_START = "THRIFTY_BILLING_START_UNIX"  # when this attempt began to bill (local); cloud nodes use boot time
ENV_LEASE_TOKEN = "THRIFTY_LEASE_TOKEN"  # the run's lease this job trains under (thrifty.runs.lease)
ENV_PREEMPT_AT_STEP = "THRIFTY_PREEMPT_AT_STEP"  # local launcher: the preemption it injects (compute.preempt_after_steps)
#                 as JSON {"step", "node", "mode", "flag", "launcher_pid"}: that node stops after that step, writes the
#                 flag file and waits for the launcher to preempt it there (training.boundary)
SKYPILOT_JOB_PREFIX = "sky-"  # our ids of SkyPilot managed jobs: sky-<managed job id>

# ---------------------------------------------------------------- control objects under runs/<run_id>/

STOP_KEY = "control/stop.json"  # the launcher asks a job to checkpoint and stop (names the job)
STOPPED_KEY = "control/stopped-{job}.json"  # the node's answer: checkpoint saved, safe to tear down

# ---------------------------------------------------------------- names on the Prefect server

TRAINING_JOBS_LIMIT = "thrifty-training-jobs"  # global concurrency limit a flow's training job holds a slot of
#                                                (flows.slots; set by `thrifty deploy --pool-concurrency`)
