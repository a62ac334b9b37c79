"""``python -m training --config run.yaml``: what a training node runs (SkyPilot's ``run:``, the local launcher)."""

import sys

from training.cli import main

if __name__ == "__main__":
    sys.exit(main())
