"""``python -m training --config run.yaml``: what a training node runs (SkyPilot's ``run:``, the local launcher)."""

import sys

from training import signals

signals.install_early()  # before torch loads: a spot notice during start-up ends the run cleanly, not with -15

from training.cli import main  # noqa: E402

if __name__ == "__main__":
    code = main()
    signals.ignore_from_now_on()
    sys.exit(code)
