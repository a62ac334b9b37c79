"""Shared test setup: one thread, a private HOME/PREFECT_HOME, no analytics, no cloud metadata."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="thrifty-test-home-"))
_OWNER = os.getpid()


@atexit.register  # registered before Prefect's and the fixtures' handlers, it runs after them
def _remove_session_home() -> None:
    if os.getpid() == _OWNER:  # not in a forked child (a DataLoader worker), which inherits this handler
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


os.environ.update(
    {
        "HOME": str(_SESSION_HOME),  # `import sky` writes ~/.sky; nothing may touch the real home
        "PREFECT_HOME": str(_SESSION_HOME / "prefect"),
        "DO_NOT_TRACK": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "AWS_EC2_METADATA_DISABLED": "true",
        "OMP_NUM_THREADS": "1",
        "THRIFTY_LOCAL_CACHE": str(_SESSION_HOME / "shard-cache"),
        # live price sources (thrifty.money.prices) answer from loopback stand-ins only: by default a closed port,
        # so a test that did not start one gets "no answer" at once and falls back, never the internet
        "THRIFTY_AZURE_PRICES_URL": "http://127.0.0.1:9/api/retail/prices",
        "AWS_ENDPOINT_URL_EC2": "http://127.0.0.1:9",
        "AWS_ENDPOINT_URL_STS": "http://127.0.0.1:9",  # SkyPilot's AWS catalog asks STS who the caller is
    }
)

for _mlflow_var in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
                    "MLFLOW_TRACKING_PASSWORD"):  # a developer's own MLflow server never receives test runs
    os.environ.pop(_mlflow_var, None)

import torch  # noqa: E402

torch.set_num_threads(1)

from prefect.logging.configuration import setup_logging  # noqa: E402

# Prefect sets up its logging lazily, binding its console handler to sys.stderr as it is then: in the first test that
# logs through Prefect, which may be a test's capsys stream, closed when that test ends ("I/O operation on closed
# file" in whichever test logs next). Set it up now, on the session's own stream.
setup_logging()

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def python_env() -> dict[str, str]:
    """Environment for a child training process: the repo importable, one thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    return env


PYTHON = sys.executable


def agrees(shown: str, source: float, slack: float = 1e-12) -> bool:
    """A figure printed with d decimals agrees with its source (a ledger's sum) when it is that figure rounded to d
    (``slack``: what the source may be off by, e.g. a sum of figures each kept to 9 places)."""
    decimals = len(shown.partition(".")[2])
    return abs(float(shown) - source) <= 0.5 * 10 ** -decimals + slack


def latest_artifacts(*keys: str) -> dict[str, Any]:
    """The newest artifact of each of ``keys`` on the session's Prefect server, by key (the server holds every other
    test's artifacts too: a read of the latest N would lose them as the session grows)."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactCollectionFilter, ArtifactCollectionFilterKey

    async def read() -> list[Any]:
        async with get_client() as client:
            return await client.read_latest_artifacts(
                artifact_filter=ArtifactCollectionFilter(key=ArtifactCollectionFilterKey(any_=list(keys))))

    return {a.key: a for a in asyncio.run(read())}


@pytest.fixture(scope="session")
def prefect_harness():
    """One Prefect test server for the whole session (~15 s to start); request it only where flows run."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=300):  # a starved machine starts it slowly, never fails it
        yield


# object-store stand-ins (moto, gcp-storage-emulator, Azurite): one of each per session, started on first use
from stores import azure_standin, backend, gcs_standin, loopback_only, s3_standin  # noqa: E402,F401
# price sources' stand-ins: the Azure Retail Prices API on loopback, EC2 spot price history on moto, SkyPilot's catalog
from price_standins import azure_prices, ec2_spot, sky_catalog  # noqa: E402,F401
# a switchable fault proxy in front of moto: refused, reset, hung or 503 (tests/faultproxy.py)
from faultproxy import s3_proxy  # noqa: E402,F401
# one deployed Prefect server (with its UI and a worker) for the modules that run flows through deployments
from prefect_server import SHARED, deployed_ui_server  # noqa: E402,F401


# The longest files first (their idle-run seconds, slowest first): `make test` hands whole files to its workers in
# this order (--no-loadscope-reorder: xdist's default order is the most tests first, which handed the one-test
# PostgreSQL file out last and left one worker alone with it for minutes at the end of the suite)
LONGEST_FIRST = ("test_postgres_scale.py", "test_ui_browser.py", "test_deployments_e2e.py", "test_cap_hang.py",
                 "test_deadline_flow.py", "test_money.py", "test_sweep.py", "test_lightning_exact.py",
                 "test_levers_compile.py", "test_script_mode.py", "test_multinode.py", "test_mlflow.py", "test_ends.py",
                 "test_chaos.py", "test_budget.py", "test_live_prices.py", "test_lightning_callback.py",
                 "test_failures.py", "test_work_pools.py", "test_storage.py", "test_archive.py", "test_store_faults.py")


def pytest_collection_modifyitems(session, config, items) -> None:
    """The longest files first (LONGEST_FIRST), each file's tests in their own order; the tests on the shared deployed
    server run one after another: the server starts once for all of them and is stopped after the last (an idle
    server and worker cost CPU beside the rest)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    users = [item for item in items if SHARED in item.fixturenames]
    if users:
        first = items.index(users[0])
        rest = [item for item in items if SHARED not in item.fixturenames]
        items[:] = rest[:first] + users + rest[first:]
