"""Deploy thrifty to a Prefect server: make sure the work pool exists, then `prefect deploy --all`.

``--pool-type`` picks the pool and its prefect.yaml: ``process`` (prefect.yaml, the default), ``docker`` or
``kubernetes`` (deployments/prefect.<type>.yaml: flow runs in the image the top-level Dockerfile builds).

`thrifty deploy` calls :func:`deploy_all`. Each step is one function that raises :class:`DeployError`
with a message saying what to change. After the deploy, the scheduled deployments' upcoming runs are scheduled and
named as they will run (deployments.upcoming); the last step installs deployments/automations.yaml.
The server is whatever PREFECT_API_URL names: a laptop's `prefect server start` (SQLite) or a team's server on
PostgreSQL (its PREFECT_API_DATABASE_CONNECTION_URL; deployments/docker-compose.postgres.yml), served by any
number of workers; ``--pool-concurrency N`` caps the flow runs the pool runs at once across all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from thrifty.config.echo import redact_urls
from thrifty.protocol import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, TRAINING_JOBS_LIMIT

WORK_POOL = "thrifty-process"  # prefect.yaml's deployments name this pool; a test keeps them in step
WORK_POOL_TYPE = "process"  # runs flows as subprocesses of the worker: no Docker or cluster needed
PREFECT_FILE = "prefect.yaml"
WEBHOOK_SECRET = "webhook_url"  # the key of the custom-webhook block's secrets that holds --alerts-webhook's URL
# schedule slugs prefect.yaml no longer declares (they became the names the deployment page shows): `prefect deploy`
# keeps a schedule whose slug is gone and adds the renamed one beside it, and its `replaces:` fails every later deploy
RETIRED_SCHEDULE_SLUGS = ("nightly-0300", "weekly-sun-0500")
IMAGE = "thrifty:0.1.0"  # the tag README says to build the Dockerfile with; the docker/kubernetes variants run it


@dataclass(frozen=True)
class PoolKind:
    """A Prefect worker type, the pool thrifty creates for it and the prefect.yaml whose deployments use it."""

    type: str  # Prefect's worker type: the pool's `type`, `prefect worker start` picks the worker by it
    pool: str
    prefect_file: str  # relative to the project directory
    worker_package: str | None  # the package the worker machine needs for this type (None: Prefect itself)


POOL_KINDS = {
    "process": PoolKind("process", WORK_POOL, PREFECT_FILE, None),
    "docker": PoolKind("docker", "thrifty-docker", "deployments/prefect.docker.yaml", "prefect-docker"),
    "kubernetes": PoolKind("kubernetes", "thrifty-kubernetes", "deployments/prefect.kubernetes.yaml",
                           "prefect-kubernetes"),
}


class DeployError(Exception):
    """A deploy step failed; ``exit_code`` 2 means the user's setup needs a change, 1 that Prefect failed."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED):
        super().__init__(message)
        self.exit_code = exit_code


def require_api_url() -> str:
    """The configured Prefect API URL; deploying to a throwaway ephemeral server would be lost on exit."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise DeployError(
            "no Prefect server to deploy to: PREFECT_API_URL is not set. Start one with `prefect server start` "
            "and set PREFECT_API_URL (e.g. `export PREFECT_API_URL=http://127.0.0.1:4200/api`), then run again.",
            EXIT_BAD_INPUT,
        )
    return url


def read_deployment_pools(project_dir: Path, prefect_file: str = PREFECT_FILE) -> dict[str, str | None]:
    """Deployment name -> work pool name, as the prefect.yaml declares them."""
    path = project_dir / prefect_file
    if not path.is_file():
        raise DeployError(f"{path} does not exist; run `thrifty deploy` from the project root "
                          "(the directory holding prefect.yaml) or pass --project-dir", EXIT_BAD_INPUT)
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise DeployError(f"{path} is not valid YAML: {exc}", EXIT_BAD_INPUT) from exc
    deployments = spec.get("deployments") or []
    if not deployments:
        raise DeployError(f"{path} declares no deployments", EXIT_BAD_INPUT)
    return {d.get("name", "?"): (d.get("work_pool") or {}).get("name") for d in deployments}


def check_pools_match(pools: dict[str, str | None], pool: str, prefect_file: str = PREFECT_FILE) -> None:
    """`prefect deploy --all` ignores --pool, so every deployment must already name the pool we create."""
    wrong = {name: p for name, p in pools.items() if p != pool}
    if wrong:
        listed = ", ".join(f"{name!r} uses {p!r}" for name, p in wrong.items())
        raise DeployError(f"{prefect_file}: {listed}, but the work pool being created is {pool!r}; "
                          f"set work_pool.name to {pool!r} in each deployment", EXIT_BAD_INPUT)


def base_job_template(pool_type: str) -> dict[str, Any]:
    """The template `prefect work-pool create --type TYPE` stores: the process worker's own, else the one in the
    worker metadata Prefect ships (read offline, so the deploying machine needs no prefect-docker/-kubernetes)."""
    if pool_type == "process":
        from prefect.workers.process import ProcessWorker

        return ProcessWorker.get_default_base_job_template()
    import json
    from importlib import resources

    ref = resources.files("prefect.server.api.collections_data") / "views" / "aggregate-worker-metadata.json"
    for collection in json.loads(ref.read_text()).values():
        worker = collection.get(pool_type)
        if worker and worker.get("type") == pool_type:
            return worker["default_base_job_configuration"]
    raise DeployError(f"Prefect {ref} has no {pool_type!r} worker; use --pool-type {' or '.join(POOL_KINDS)}",
                      EXIT_BAD_INPUT)


def ensure_work_pool(pool: str, url: str, pool_type: str = WORK_POOL_TYPE) -> bool:
    """Create the work pool of ``pool_type`` unless it exists; True when it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        unreachable = client.api_healthcheck()
        if unreachable is not None:
            raise DeployError(f"cannot reach the Prefect server at {url} ({unreachable}). Start one with "
                              "`prefect server start` or point PREFECT_API_URL at a running one.", EXIT_BAD_INPUT)
        try:
            existing = client.read_work_pool(pool)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(
                name=pool, type=pool_type, base_job_template=base_job_template(pool_type),
                description=POOL_DESCRIPTIONS.get(pool_type, f"thrifty: flow runs on a {pool_type} worker"),
            ))
            return True
    if existing.type != pool_type:
        raise DeployError(f"work pool {pool!r} exists with type {existing.type!r}, not {pool_type!r}; "
                          f"delete it (`prefect work-pool delete {pool}`) or deploy to another pool", EXIT_BAD_INPUT)
    return False


def set_pool_concurrency(pool: str, limit: int | None) -> str:
    """Set how many flow runs the pool runs at once, across all its workers (None: no limit); returns it in words.

    The server enforces it, so it holds however many workers serve the pool: runs past it wait Scheduled."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    if limit is not None and limit < 1:
        raise DeployError(f"--pool-concurrency {limit}: give at least 1 (flow runs at once), or 0 to remove the "
                          "limit", EXIT_BAD_INPUT)
    with get_client(sync_client=True) as client:
        # concurrency_limit is in the update's fields set even when None, so None clears a limit set earlier
        client.update_work_pool(pool, WorkPoolUpdate(concurrency_limit=limit))
        # ...but workers take runs against a snapshot of the pool's free slots, so two workers polling in the same
        # second can start up to twice the limit (seen on PostgreSQL: 4 flow runs under a limit of 2). The
        # training job itself holds a slot of this global limit, which the server leases atomically.
        if limit:
            client.upsert_global_concurrency_limit_by_name(TRAINING_JOBS_LIMIT, limit)
        else:
            with contextlib.suppress(ObjectNotFound):
                client.delete_global_concurrency_limit_by_name(TRAINING_JOBS_LIMIT)
    return (f"at most {limit} flow run(s) at once, and at most {limit} training job(s) at once (global concurrency "
            f"limit {TRAINING_JOBS_LIMIT!r})" if limit else "no concurrency limit")


POOL_DESCRIPTIONS = {
    "process": "thrifty: flow runs as subprocesses of a `prefect worker start --pool` process",
    "docker": f"thrifty: flow runs as containers of the {IMAGE} image (the project's Dockerfile)",
    "kubernetes": f"thrifty: flow runs as Kubernetes Jobs of the {IMAGE} image (the project's Dockerfile)",
}


def run_prefect_deploy(project_dir: Path, prefect_file: str = PREFECT_FILE) -> None:
    """`prefect --no-prompt deploy --all` in the project, with this interpreter's Prefect; output goes to the terminal.
    Entrypoints resolve from the project directory whichever file is deployed."""
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all", "--prefect-file", prefect_file]
    try:
        proc = subprocess.run(cmd, cwd=project_dir, check=False)
    except OSError as exc:
        raise DeployError(f"could not start `{' '.join(cmd)}`: {exc}") from exc
    if proc.returncode != 0:
        raise DeployError(f"`prefect deploy --all` failed with exit code {proc.returncode}; its output is above")


def name_upcoming_runs(deployment_names: list[str], pool: str) -> list[str]:
    """Schedule the upcoming runs of the scheduled deployments among ``deployment_names`` (in ``pool``) now, and
    give them the names they will run under; returns one line per deployment. Never raises: the deploy stands, and a
    failure is a line that says the runs will be named when the next one starts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, WorkPoolFilter, WorkPoolFilterName

    from deployments.upcoming import name_upcoming_runs as rename, schedule_runs, upcoming_runs

    lines = []
    try:
        with get_client(sync_client=True) as client:
            found = client.read_deployments(deployment_filter=DeploymentFilter(
                name=DeploymentFilterName(any_=deployment_names)), work_pool_filter=WorkPoolFilter(
                name=WorkPoolFilterName(any_=[pool])))
            for deployment in sorted(found, key=lambda d: d.name):
                for schedule in deployment.schedules:
                    if schedule.slug in RETIRED_SCHEDULE_SLUGS:  # a deploy adds a renamed schedule beside the old
                        client.delete_deployment_schedule(deployment.id, schedule.id)
                if not [s for s in deployment.schedules if s.slug not in RETIRED_SCHEDULE_SLUGS]:
                    continue
                schedule_runs(client, deployment.id)  # the deploy deleted the runs scheduled under the old version
                rename(client, deployment.id)
                runs = upcoming_runs(client, deployment.id)
                lines.append(f"upcoming runs of {deployment.name}: {', '.join(r.name for r in runs[:3]) or 'none scheduled'}"
                             + (f" and {len(runs) - 3} more" if len(runs) > 3 else ""))
    except Exception as exc:  # noqa: BLE001 - the names are a courtesy; each run takes its own when it starts
        lines.append(f"could not name the upcoming runs ({redact_urls(str(exc))[:300]}); each scheduled run names "
                     "the next ones when it starts")
    return lines


def create_webhook_block(url: str, ref: str | None) -> str:
    """Save a custom-webhook notification block posting alerts to ``url`` (JSON ``{"text": ...}``, which Slack,
    Mattermost and most chat webhooks take); returns its ``type/name``."""
    from deployments.automations import DEFAULT_ALERTS_BLOCK

    ref = ref or DEFAULT_ALERTS_BLOCK
    slug, _, name = ref.partition("/")
    if slug != "custom-webhook" or not name:
        raise DeployError(f"--alerts-webhook creates a custom-webhook block, but --alerts-block is {ref!r}; "
                          "drop --alerts-block or name one like custom-webhook/NAME", EXIT_BAD_INPUT)
    if not url.startswith(("https://", "http://")):
        raise DeployError("--alerts-webhook is not an http(s) URL (not echoed: a webhook's URL holds its token); pass "
                          "the webhook's full URL, e.g. https://hooks.slack.com/services/...", EXIT_BAD_INPUT)
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    # the whole URL is a secret: webhooks carry their token in the path or the query. The plain `url` field holds
    # only a placeholder, filled from `secrets` when a notification is sent; the API shows secrets masked
    try:
        CustomWebhookNotificationBlock(name=name, url="{{" + WEBHOOK_SECRET + "}}", secrets={WEBHOOK_SECRET: url},
                                       json_data={"text": "{{subject}}\n{{body}}"}).save(name, overwrite=True)
    except Exception as exc:  # noqa: BLE001 - reported as a deploy failure with the cause
        raise DeployError(f"saving the notification block {ref} failed: {redact_urls(str(exc))}") from None
    return ref


def form_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A deployment's parameter schema as the Prefect UI's form should draw it: no null defaults.

    The UI fills each field from the schema's defaults; a null one selects the ``None`` branch of an optional field,
    which the form draws as the words 'Property is type "None"' instead of an input. Without the null, it draws the
    field's input, empty; an empty field is left out of the parameters, and the model's own default (None) applies:
    the same run. Null stays an allowed value (a client may still send it)."""

    def no_nulls(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: no_nulls(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [no_nulls(v) for v in value]
        return value

    def tidy(prop: dict[str, Any]) -> dict[str, Any]:
        prop = dict(prop)
        if "default" in prop:
            if prop["default"] is None:
                del prop["default"]
            else:
                prop["default"] = no_nulls(prop["default"])
        return prop

    out = dict(schema)
    out["properties"] = {name: tidy(prop) for name, prop in (schema.get("properties") or {}).items()}
    for key in ("definitions", "$defs"):
        if key in schema:
            out[key] = {name: {**model, "properties": {k: tidy(p) for k, p in (model.get("properties") or {}).items()}}
                        if "properties" in model else model for name, model in schema[key].items()}
    return out


def tidy_forms(names: list[str]) -> list[str]:
    """Give the named deployments the UI-friendly parameter schema (:func:`form_schema`); returns the updated ones.

    ``prefect deploy`` writes the schema pydantic generates from the flow's signature; this replaces it in place,
    so each `thrifty deploy` leaves the forms tidy."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    async def go() -> list[str]:
        done = []
        async with get_client() as client:
            found = await client.read_deployments(deployment_filter=DeploymentFilter(
                name=DeploymentFilterName(any_=names)))
            for dep in found:
                schema = dep.parameter_openapi_schema or {}
                tidy = form_schema(schema)
                if tidy != schema:
                    await client.update_deployment(dep.id, DeploymentUpdate(parameter_openapi_schema=tidy))
                    done.append(dep.name)
        return sorted(done)

    try:
        return asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - reported as a deploy failure with the cause
        raise DeployError(f"tidying the deployments' forms failed: {exc}") from exc


def install_automations(alerts_block: str | None, skipped: list[str] | None = None) -> list[str]:
    """Budget cut-off and failure alerts from deployments/automations.yaml (replaced by name: idempotent)."""
    import asyncio

    from prefect.client.orchestration import get_client

    from deployments.automations import install

    async def go() -> list[str]:
        async with get_client() as client:
            return await install(client, notify_block=alerts_block, skipped=skipped)

    try:
        return asyncio.run(go())
    except Exception as exc:  # noqa: BLE001 - reported as a deploy failure with the cause
        raise DeployError(f"installing automations failed: {exc}") from exc


def deploy_all(project_dir: str | Path = ".", pool: str | None = None,
               echo: Callable[[str], Any] = lambda msg: print(msg, file=sys.stderr),
               alerts_block: str | None = None, alerts_webhook: str | None = None, pool_type: str = WORK_POOL_TYPE,
               pool_concurrency: int | None = None) -> int:
    """Create the work pool if missing and deploy everything in the prefect.yaml of ``pool_type`` (``POOL_KINDS``)
    in ``project_dir``; returns an exit code."""
    project_dir = Path(project_dir).resolve()
    skipped: list[str] = []
    try:
        if pool_type not in POOL_KINDS:
            raise DeployError(f"--pool-type {pool_type!r}: use one of {', '.join(POOL_KINDS)}", EXIT_BAD_INPUT)
        kind = POOL_KINDS[pool_type]
        pool = pool or kind.pool
        url = require_api_url()
        pools = read_deployment_pools(project_dir, kind.prefect_file)
        check_pools_match(pools, pool, kind.prefect_file)
        created = ensure_work_pool(pool, url, kind.type)
        echo(f"work pool {pool!r} ({kind.type}) {'created' if created else 'already exists'} on {url}")
        if pool_concurrency is not None:  # unset: a limit set earlier (in the UI or by a deploy) is kept
            echo(f"work pool {pool!r}: {set_pool_concurrency(pool, pool_concurrency or None)}")
        if alerts_webhook:
            alerts_block = create_webhook_block(alerts_webhook, alerts_block)
            echo(f"notification block {alerts_block} saved: failure alerts post to it")
        run_prefect_deploy(project_dir, kind.prefect_file)
        tidy_forms(sorted(pools))
        for line in name_upcoming_runs(sorted(pools), pool):
            echo(line)
        installed = install_automations(alerts_block, skipped)
        echo(f"automations installed: {', '.join(installed) or 'none'}")
    except DeployError as exc:
        echo(f"error: {exc}")
        return exc.exit_code
    echo(f"deployed {', '.join(sorted(pools))}")
    serve = (f"serve them with `PREFECT_API_URL={url} prefect worker start --pool {pool}`: one or more workers, on "
             "any machines that reach the server" + (" and have this project checked out at the same path"
                                                     if not kind.worker_package else ""))
    if kind.worker_package:
        serve = (f"build the image (`docker build -t {IMAGE} .`; on a cluster, load or push it where the nodes pull "
                 f"from), then {serve}, with `pip install {kind.worker_package}`")
    steps = [serve, *skipped]
    echo("next steps:\n" + "\n".join(f"  {i}. {step}" for i, step in enumerate(steps, 1)))
    return EXIT_OK


def cmd_deploy(args: argparse.Namespace) -> int:
    """``thrifty deploy``: create the work pool and deploy prefect.yaml's deployments to the server at PREFECT_API_URL."""
    return deploy_all(args.project_dir, alerts_block=args.alerts_block, alerts_webhook=args.alerts_webhook,
                      pool_type=getattr(args, "pool_type", WORK_POOL_TYPE), pool_concurrency=args.pool_concurrency)
