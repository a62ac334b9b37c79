"""The SkyPilot task for a RunConfig (candidates, scripts, task YAML, ``sky.Task``) and ``thrifty plan``; all offline.

The task: ``setup`` installs the project (synced as the workdir) on each node; ``run`` starts the
training program under the spot-notice watcher (``thrifty.launchers.notice``), through torchrun
across nodes with SkyPilot's node variables; ``envs`` carry the RunConfig (``node_env``).
Resources are ``ordered`` candidates, one per (cloud[/region], accelerator[, spot|on-demand]) that
the price source knows and the deadline allows, cheapest run first (``ranking``: rate x estimated
runtime, not $/hour; ``any_of`` would let SkyPilot pick the cheapest per hour), sharing one
``job_recovery`` (identical on every candidate, as SkyPilot requires) whose
``recover_on_exit_codes`` holds the watcher's "stopped on a notice" code.

The store key is the run name (``THRIFTY_RUN_ID``), not ``SKYPILOT_TASK_ID``: a run stopped at its
budget and resumed later under a new managed job continues from its checkpoints. The task id
(stable across recoveries of one job) is logged by the node and kept in every ledger row.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import yaml

from thrifty.config import ConfigError, RunConfig
from thrifty.launchers.base import node_env
from thrifty.money.prices.skypilot import sky_calls
from thrifty.launchers.skypilot.candidates import Candidate, candidates
from thrifty.launchers.skypilot.ranking import Ranking, rank
from thrifty.money.meter import Price
from thrifty.protocol import EXIT_RESUMABLE
from thrifty.money.throughput import Speeds, speeds_for

STORE_MOUNT = "/thrifty-store"  # where a MOUNT_CACHED store appears on the node
VENV = "~/.thrifty/venv"
MASTER_PORT = 29500


# ---------------------------------------------------------------- the task


def ranked_candidates(cfg: RunConfig, source: str = "auto", speeds: Speeds | None = None,
                      examples: float | None = None) -> Ranking:
    """The priced candidates ranked by the run's cost on each (``ranking``). Without ``speeds`` the throughput
    table's ratios alone rank them (per unit of work); with ``examples`` left to train and absolute speeds, by the
    estimated cost of the run, and ``compute.deadline_h`` applies."""
    cands, _ = candidates(cfg, source)
    if not cands:
        c = cfg.compute
        raise ConfigError(f"'compute.accelerators': none of {c.accelerators} has a known price on {c.clouds}; "
                          "run `thrifty prices` to see what is offered where")
    if speeds is None or any(k.accelerator.partition(":")[0] not in speeds.per_gpu for k in cands):
        speeds = speeds_for([k.accelerator for k in cands], {})
    return rank(cfg, cands, speeds, examples)


def job_name(cfg: RunConfig) -> str:
    """A SkyPilot-valid name (``[a-zA-Z0-9]+([._-]{1,2}[a-zA-Z0-9]+)*``) for the run."""
    name = re.sub(r"[._-]{3,}", "--", f"thrifty-{cfg.run_name}").rstrip("._-")
    return name


def store_mount_source(store: str) -> str:
    """The bucket source SkyPilot mounts for a store URI (Azure needs the account in the URL)."""
    scheme, _, rest = store.partition("://")
    if scheme in ("s3", "gs"):
        return store.rstrip("/")
    if scheme == "az":
        account = os.environ.get("AZURE_STORAGE_ACCOUNT")
        if not account:
            m = re.search(r"AccountName=([^;]+)", os.environ.get("AZURE_STORAGE_CONNECTION_STRING", ""))
            account = m.group(1) if m else None
        if not account:
            raise ConfigError("'compute.store_access': mounting an az:// store needs the storage account; set "
                              "AZURE_STORAGE_ACCOUNT (or AZURE_STORAGE_CONNECTION_STRING), or use store_access=sdk")
        return f"https://{account}.blob.core.windows.net/{rest.rstrip('/')}"
    raise ConfigError(f"'store': {store!r} is on this machine, which a cloud node cannot reach; "
                      "use s3://bucket/prefix, gs://bucket/prefix or az://container/prefix with compute.launcher=skypilot")


SETUP = f"""\
set -euo pipefail
# Install the project (the synced workdir) into its own Python 3.11 venv. uv is on every SkyPilot node
# (SkyPilot's own runtime uses Python 3.10, too old for this project). Recoveries run this again on each new VM.
UV="$HOME/.local/bin/uv"; command -v "$UV" >/dev/null || UV=uv
[ -x {VENV}/bin/python ] || "$UV" venv --python 3.11 {VENV}
"$UV" pip install --quiet --python {VENV}/bin/python .
# Azure turns Scheduled Events on at the first request (which may take minutes): ask now, before training.
{VENV}/bin/python -m thrifty.launchers.notice --prime
"""

_RUN_HEAD = f"""\
set -uo pipefail
source {VENV}/bin/activate
echo "thrifty: run $THRIFTY_RUN_ID, SkyPilot task ${{SKYPILOT_TASK_ID:-?}} (managed job ${{SKYPILOT_MANAGED_JOB_ID:-?}}), node ${{SKYPILOT_NODE_RANK:-0}}/${{SKYPILOT_NUM_NODES:-1}}"
# The watcher polls this cloud's spot-notice endpoint and SIGTERMs the torchrun workers, which checkpoint
# and exit; it then exits {EXIT_RESUMABLE} (recover_on_exit_codes) so SkyPilot recovers without spending a restart.
"""

RUN_SINGLE = _RUN_HEAD + """\
exec python -m thrifty.launchers.notice --signal-children -- \\
  python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node="${SKYPILOT_NUM_GPUS_PER_NODE:-1}" \\
  -m training
"""

RUN_MULTI = _RUN_HEAD + f"""\
MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
exec python -m thrifty.launchers.notice --signal-children -- \\
  python -m torch.distributed.run --nnodes="$SKYPILOT_NUM_NODES" --node-rank="$SKYPILOT_NODE_RANK" \\
  --nproc-per-node="${{SKYPILOT_NUM_GPUS_PER_NODE:-1}}" --master-addr="$MASTER_ADDR" --master-port={MASTER_PORT} \\
  -m training
"""


def task_config(cfg: RunConfig, source: str = "auto", ranking: Ranking | None = None) -> dict[str, Any]:
    """The SkyPilot task YAML (as a dict) for ``cfg``; what ``thrifty plan`` prints and ``submit`` launches.
    ``ranking`` (the budget gate's, from measured or estimated speeds) orders the candidates; without it the
    throughput table's ratios do."""
    c = cfg.compute
    ranking = ranking or ranked_candidates(cfg, source)
    cands: list[Candidate] = [x.candidate for x in ranking.ranked]
    node_cfg = cfg
    file_mounts: dict[str, Any] = {}
    if c.store_access == "mount_cached":
        file_mounts[STORE_MOUNT] = {"source": store_mount_source(cfg.store), "mode": "MOUNT_CACHED"}
        node_cfg = cfg.updated({"store": STORE_MOUNT}, "the store as mounted on the node")
    mixed = len({k.spot for k in cands}) > 1
    resources: dict[str, Any] = {}
    if not mixed:
        resources["use_spot"] = cands[0].spot
    if c.disk_size_gb is not None:
        resources["disk_size"] = c.disk_size_gb
    if c.max_hourly_cost is not None:
        resources["max_hourly_cost"] = c.max_hourly_cost
    if cfg.tags:  # the instances' labels (AWS tags, GCP and Azure labels): the cloud's own bill splits by them
        resources["labels"] = {**cfg.tags, "thrifty-run": cfg.run_name.lower()}
    # One job_recovery for the task: SkyPilot copies it into every any_of entry and refuses differing ones.
    resources["job_recovery"] = {
        "strategy": c.job_recovery_strategy,
        "max_restarts_on_errors": c.max_restarts,
        "recover_on_exit_codes": [EXIT_RESUMABLE],
    }
    # ordered, not any_of: SkyPilot takes the first that has capacity, so the cheapest run goes first even when
    # another candidate is cheaper per hour.
    ordered = []
    for k in cands:
        entry: dict[str, Any] = {"infra": k.infra, "accelerators": k.accelerator}
        if mixed:
            entry["use_spot"] = k.spot
        ordered.append(entry)
    resources["ordered"] = ordered
    config: dict[str, Any] = {
        "name": job_name(cfg),
        "workdir": c.workdir,
        "num_nodes": c.num_nodes,
        "resources": resources,
        "envs": node_env(node_cfg, [Price(k.cloud, k.quote.instance, k.spot, k.quote.usd_per_hour, k.accelerator,
                                          k.quote.source, k.quote.region, k.quote.fetched_unix) for k in cands]),
        "setup": SETUP,
        "run": RUN_MULTI if c.num_nodes > 1 else RUN_SINGLE,
    }
    if file_mounts:
        config["file_mounts"] = file_mounts
    return config


class _Literal(str):
    pass


def _literal(dumper: yaml.SafeDumper, data: _Literal) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(data), style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def task_yaml(config: dict[str, Any]) -> str:
    """YAML text of a task config: scripts as literal blocks, keys in the order built."""
    shown = dict(config)
    for key in ("setup", "run"):
        if key in shown:
            shown[key] = _Literal(shown[key])
    return yaml.dump(shown, Dumper=_Dumper, sort_keys=False, width=1000)


@sky_calls()
def build_task(config: dict[str, Any]):
    """A real ``sky.Task``, parsed by SkyPilot's own YAML loader (offline; validates the schema)."""
    import sky

    try:
        return sky.Task.from_yaml_config(copy.deepcopy(config))  # SkyPilot pops keys from what it is given
    except Exception as exc:  # SkyPilot raises ValueError / jsonschema errors with a readable message
        raise ConfigError(f"SkyPilot rejected the task built from this config: {exc}") from exc
