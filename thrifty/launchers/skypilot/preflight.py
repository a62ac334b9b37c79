"""Checks before spending (offline): everything about a SkyPilot launch that can be checked without a cloud."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import yaml

from thrifty.config import ConfigError, RunConfig
from thrifty.launchers.skypilot.candidates import KUBERNETES
from thrifty.launchers.skypilot.task import build_task, candidates, store_mount_source, task_config
from thrifty.numbers import money

log = logging.getLogger("thrifty.launch")

CREDENTIAL_HINTS = {
    "aws": "run `aws configure` (or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE), then `sky check aws`",
    "gcp": "run `gcloud auth login` and `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
           "to a service-account key file), then `sky check gcp`",
    "azure": "run `az login` and `az account set -s <subscription>` (or set AZURE_CLIENT_ID, AZURE_TENANT_ID and "
             "AZURE_CLIENT_SECRET), then `sky check azure`",
}


def _home(environ: dict[str, str]) -> Path:
    return Path(environ.get("HOME") or Path.home())


def remote_api_server(environ: dict[str, str] | None = None) -> str | None:
    """The SkyPilot API server endpoint when it is not this machine (credentials then live on the server)."""
    env = dict(os.environ) if environ is None else environ
    endpoint = env.get("SKYPILOT_API_SERVER_ENDPOINT")
    if not endpoint:
        path = _home(env) / ".sky" / "config.yaml"
        try:
            endpoint = ((yaml.safe_load(path.read_text()) or {}).get("api_server") or {}).get("endpoint")
        except (OSError, yaml.YAMLError, AttributeError):
            endpoint = None
    if endpoint and not re.match(r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0)(:|/|$)", endpoint):
        return endpoint
    return None


def has_credentials(cloud: str, environ: dict[str, str] | None = None) -> bool:
    """Whether this machine has the files or variables the cloud's SDK reads (a cheap, offline look; not `sky check`)."""
    env = dict(os.environ) if environ is None else environ
    home = _home(env)

    def file(var: str, default: Path) -> bool:
        return Path(env.get(var) or default).expanduser().is_file()

    if cloud == "aws":
        return bool((env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"))
                    or env.get("AWS_WEB_IDENTITY_TOKEN_FILE") or env.get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                    or env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
                    or file("AWS_SHARED_CREDENTIALS_FILE", home / ".aws" / "credentials")
                    or file("AWS_CONFIG_FILE", home / ".aws" / "config"))
    if cloud == "gcp":
        gcloud = Path(env.get("CLOUDSDK_CONFIG") or home / ".config" / "gcloud")
        return bool((env.get("GOOGLE_APPLICATION_CREDENTIALS") and Path(env["GOOGLE_APPLICATION_CREDENTIALS"]).is_file())
                    or (gcloud / "application_default_credentials.json").is_file())
    if cloud == "azure":
        az = Path(env.get("AZURE_CONFIG_DIR") or home / ".azure")
        return bool((env.get("AZURE_CLIENT_ID") and env.get("AZURE_TENANT_ID"))
                    or (az / "azureProfile.json").is_file() or (az / "msal_token_cache.json").is_file())
    raise ValueError(f"unknown cloud {cloud!r}")


def kubeconfig(environ: dict[str, str] | None = None) -> str | None:
    """Where SkyPilot will find the cluster: a kubeconfig file (``$KUBECONFIG``'s list, else ~/.kube/config), or the
    service account of the pod this runs in; None when there is none (a cheap, offline look; not `sky check`)."""
    env = dict(os.environ) if environ is None else environ
    paths = [p for p in (env.get("KUBECONFIG") or "").split(os.pathsep) if p] or [str(_home(env) / ".kube" / "config")]
    for path in paths:
        if Path(path).expanduser().is_file():
            return path
    if env.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT_TOKEN).is_file():
        return "in-cluster service account"
    return None


KUBECONFIG_HINT = ("SkyPilot's kubernetes infra needs a kubeconfig: set KUBECONFIG to yours (or write ~/.kube/config, e.g. "
                   "`kind get kubeconfig > ~/.kube/config`, `gcloud container clusters get-credentials ...`, "
                   "`aws eks update-kubeconfig ...`), then `sky check kubernetes`")
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def preflight(cfg: RunConfig, environ: dict[str, str] | None = None) -> None:
    """Everything about a SkyPilot launch that can be checked offline; one ConfigError listing every problem."""
    import importlib.util

    from thrifty.money.prices import offers

    c = cfg.compute
    problems: list[str] = []
    if importlib.util.find_spec("sky") is None:
        raise ConfigError("'compute.launcher': skypilot needs SkyPilot on this machine: "
                          "pip install -e '.[cloud]' (skypilot==0.14.1), or use compute.launcher=local")
    try:
        if c.store_access == "mount_cached":
            store_mount_source(cfg.store)
        elif "://" not in cfg.store or cfg.store.startswith("file://"):
            store_mount_source(cfg.store)  # raises: a local store is unreachable from a node
    except ConfigError as exc:
        problems.append(str(exc))
    for acc in c.accelerators:  # a kubernetes candidate is always priced (compute.kubernetes_usd_per_gpu_hour)
        if not any(cloud == KUBERNETES or offers(cloud, acc)[0] for cloud in c.clouds):
            problems.append(f"'compute.accelerators': no price for {acc} on any of {c.clouds}; "
                            "`thrifty prices` lists what each cloud offers")
    cands, _ = candidates(cfg)
    if cands and not any(k.within_cap for k in cands):
        cheapest = min(k.quote.usd_per_hour for k in cands)
        problems.append(f"'compute.max_hourly_cost': ${c.max_hourly_cost:g}/h is below every candidate "
                        f"(cheapest {money(cheapest)}/h per node); raise it or add cheaper accelerators")
    endpoint = remote_api_server(environ)
    if endpoint is None:
        for cloud in c.clouds:
            if cloud == KUBERNETES:  # no cloud account: the cluster's kubeconfig, and SkyPilot's client for it
                if kubeconfig(environ) is None:
                    problems.append(f"'compute.clouds': no kubeconfig on this machine (KUBECONFIG unset, no "
                                    f"~/.kube/config): {KUBECONFIG_HINT}; or remove kubernetes from compute.clouds")
                if importlib.util.find_spec("kubernetes") is None:
                    problems.append("'compute.clouds': kubernetes needs SkyPilot's Kubernetes client on this machine: "
                                    "pip install 'skypilot[kubernetes]==0.14.1'; or remove kubernetes from compute.clouds")
                continue
            if not has_credentials(cloud, environ):
                problems.append(f"'compute.clouds': no {cloud} credentials on this machine: {CREDENTIAL_HINTS[cloud]}; "
                                f"or remove {cloud} from compute.clouds")
    else:
        log.info("SkyPilot API server %s holds the cloud credentials; not checking them here", endpoint)
    if not (Path(c.workdir) / "pyproject.toml").is_file():
        problems.append(f"'compute.workdir': {c.workdir!r} has no pyproject.toml; point it at the thrifty project "
                        "directory (setup installs it on the node)")
    if not problems:
        try:
            build_task(task_config(cfg))
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("SkyPilot launch is not ready:\n  - " + "\n  - ".join(problems))
