"""The SkyPilot task for a RunConfig (candidates, scripts, task YAML, ``sky.Task``) and ``thrifty plan``; all offline.

The task: ``setup`` installs the project (synced as the workdir) on each node; ``run`` starts the
training program under the spot-notice watcher (``thrifty.launchers.notice``), through torchrun
across nodes with SkyPilot's node variables; ``envs`` carry the RunConfig (``node_env``).
Resources are ``any_of`` candidates, one per (cloud[/region], accelerator[, spot|on-demand]) that
the price source knows, sharing one ``job_recovery`` (identical on every candidate, as SkyPilot
requires) whose ``recover_on_exit_codes`` holds the watcher's "stopped on a notice" code.

The store key is the run name (``THRIFTY_RUN_ID``), not ``SKYPILOT_TASK_ID``: a run stopped at its
budget and resumed later under a new managed job continues from its checkpoints. The task id
(stable across recoveries of one job) is logged by the node and kept in every ledger row.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass
from typing import Any

import yaml

from thrifty.config import ConfigError, RunConfig
from thrifty.launchers.base import node_env
from thrifty.meter import Price
from thrifty.pricing import PricingError, Quote, parse_accelerator, quote_accelerator
from thrifty.protocol import EXIT_RESUMABLE

STORE_MOUNT = "/thrifty-store"  # where a MOUNT_CACHED store appears on the node
VENV = "~/.thrifty/venv"
MASTER_PORT = 29500


# ---------------------------------------------------------------- candidates and the task


@dataclass(frozen=True)
class Candidate:
    """One ``any_of`` entry with the price the plan expects for it."""

    cloud: str
    region: str | None
    accelerator: str
    spot: bool
    quote: Quote
    nodes: int
    within_cap: bool  # price at or below compute.max_hourly_cost (SkyPilot would skip it otherwise)

    @property
    def infra(self) -> str:
        return f"{self.cloud}/{self.region}" if self.region else self.cloud

    @property
    def usd_per_hour(self) -> float:
        """The whole job: every node."""
        return self.quote.usd_per_hour * self.nodes


def candidates(cfg: RunConfig, source: str = "auto") -> tuple[list[Candidate], list[str]]:
    """Priced candidates, cheapest first, and notes on the combinations left out (not offered or unpriced)."""
    c = cfg.compute
    markets = [True, False] if c.use_spot and c.on_demand_fallback else [c.use_spot]
    out, notes = [], []
    for cloud in c.clouds:
        regions = [r.split("/", 1)[1] for r in c.regions if r.startswith(cloud + "/")] or [None]
        for acc in c.accelerators:
            name, count = parse_accelerator(acc)
            acc = f"{name}:{count}"
            missing = []
            for spot in markets:
                try:
                    q = quote_accelerator(cloud, acc, spot, source)  # type: ignore[arg-type]
                except PricingError:
                    missing.append("spot" if spot else "on-demand")
                    continue
                for region in regions:
                    within = c.max_hourly_cost is None or q.usd_per_hour <= c.max_hourly_cost
                    out.append(Candidate(cloud, region, acc, spot, q, c.num_nodes, within))
            if missing:
                notes.append(f"{cloud} {acc} ({', '.join(missing)}): no price known, probably not offered there; left out")
    out.sort(key=lambda k: (not k.within_cap, k.usd_per_hour))
    return out, notes


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


def task_config(cfg: RunConfig, source: str = "auto") -> dict[str, Any]:
    """The SkyPilot task YAML (as a dict) for ``cfg``; what ``thrifty plan`` prints and ``submit`` launches."""
    c = cfg.compute
    cands, _ = candidates(cfg, source)
    if not cands:
        raise ConfigError(f"'compute.accelerators': none of {c.accelerators} has a known price on {c.clouds}; "
                          "run `thrifty prices` to see what is offered where")
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
    # One job_recovery for the task: SkyPilot copies it into every any_of entry and refuses differing ones.
    resources["job_recovery"] = {
        "strategy": c.job_recovery_strategy,
        "max_restarts_on_errors": c.max_restarts,
        "recover_on_exit_codes": [EXIT_RESUMABLE],
    }
    any_of = []
    for k in sorted(cands, key=lambda k: (not k.spot, c.clouds.index(k.cloud), k.region or "",
                                          [parse_accelerator(a)[0] for a in c.accelerators].index(k.accelerator.split(":")[0]))):
        entry: dict[str, Any] = {"infra": k.infra, "accelerators": k.accelerator}
        if mixed:
            entry["use_spot"] = k.spot
        any_of.append(entry)
    resources["any_of"] = any_of
    config: dict[str, Any] = {
        "name": job_name(cfg),
        "workdir": c.workdir,
        "num_nodes": c.num_nodes,
        "resources": resources,
        "envs": node_env(node_cfg, [Price(k.cloud, k.quote.instance, k.spot, k.quote.usd_per_hour, k.accelerator,
                                          k.quote.source) for k in cands]),
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


def build_task(config: dict[str, Any]):
    """A real ``sky.Task``, parsed by SkyPilot's own YAML loader (offline; validates the schema)."""
    import sky

    try:
        return sky.Task.from_yaml_config(copy.deepcopy(config))  # SkyPilot pops keys from what it is given
    except Exception as exc:  # SkyPilot raises ValueError / jsonschema errors with a readable message
        raise ConfigError(f"SkyPilot rejected the task built from this config: {exc}") from exc


# ---------------------------------------------------------------- plan (offline)


def plan_text(cfg: RunConfig, source: str = "auto", show: int = 8) -> str:
    """``thrifty plan``: the task YAML, then the cheapest candidates with their estimated cost."""
    config = task_config(cfg, source=source)
    build_task(config)  # the YAML printed is one SkyPilot accepts
    cands, notes = candidates(cfg, source)
    lines = [task_yaml(config).rstrip(), "", f"# Estimated cost, cheapest first ({cfg.compute.num_nodes} node(s); "
             f"budget.max_usd ${cfg.budget.max_usd:g}):"]
    header = f"#   {'infra':<18} {'accelerator':<10} {'market':<9} {'instance':<26} {'$/h node':>9} {'$/h job':>9} {'budget lasts':>12}"
    lines.append(header)
    for k in cands[:show]:
        hours = cfg.budget.max_usd / k.usd_per_hour
        flag = "" if k.within_cap else "  (over max_hourly_cost: SkyPilot skips it)"
        lines.append(f"#   {k.infra:<18} {k.accelerator:<10} {'spot' if k.spot else 'on-demand':<9} {k.quote.instance:<26} "
                     f"{k.quote.usd_per_hour:>9.3f} {k.usd_per_hour:>9.3f} {hours:>10.1f} h{flag}")
    if len(cands) > show:
        lines.append(f"#   ... {len(cands) - show} more")
    lines.append("# Price sources:")
    for src in sorted({k.quote.source for k in cands}):
        lines.append(f"#   {src}")
    for note in notes:
        lines.append(f"# Note: {note}")
    lines.append("# SkyPilot picks the cheapest feasible candidate at launch from its own catalog; these are estimates.")
    if cfg.compute.launcher != "skypilot":
        lines.append(f"# Note: compute.launcher is {cfg.compute.launcher}; set compute.launcher=skypilot to launch this task.")
    return "\n".join(lines) + "\n"

