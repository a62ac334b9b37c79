"""Launchers: where a training job runs. One protocol; local (emulated spot) and SkyPilot managed jobs."""

from thrifty.launchers.base import Attempt, JobState, JobStatus, Launcher, LaunchError, make_launcher, node_env

__all__ = ["Attempt", "JobState", "JobStatus", "LaunchError", "Launcher", "make_launcher", "node_env"]
