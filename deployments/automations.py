"""Install deployments/automations.yaml on a Prefect server: idempotent (replaced by name), blocks resolved by name."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

AUTOMATIONS_FILE = Path(__file__).with_name("automations.yaml")
# names earlier versions installed; removed on every install. thrifty-budget-cutoff cancelled a run on
# thrifty.budget.exceeded and so raced the watch loop's own graceful stop (runs ended Cancelled, unreported)
RETIRED = ("thrifty-budget-cutoff",)

log = logging.getLogger("thrifty.deploy")


def load_specs(path: Path = AUTOMATIONS_FILE) -> list[dict[str, Any]]:
    data = yaml.safe_load(path.read_text()) or {}
    return list(data.get("automations") or [])


async def resolve_blocks(client: Any, spec: dict[str, Any], notify_block: str | None) -> dict[str, Any] | None:
    """Swap ``block: type/name`` for ``block_document_id``; None if a named block does not exist."""
    from prefect.exceptions import ObjectNotFound

    actions = []
    for action in spec.get("actions", []):
        action = dict(action)
        ref = action.pop("block", None)
        if ref is not None:
            slug, _, name = (notify_block or ref).partition("/")
            try:
                block = await client.read_block_document_by_name(name=name, block_type_slug=slug)
            except ObjectNotFound:
                log.warning("automation %r skipped: notification block %s/%s does not exist; create it in the "
                            "Prefect UI (Blocks) or with Python, then run `thrifty deploy` again",
                            spec["name"], slug, name)
                return None
            action["block_document_id"] = str(block.id)
        actions.append(action)
    return {**spec, "actions": actions}


async def install(client: Any, notify_block: str | None = None, path: Path = AUTOMATIONS_FILE) -> list[str]:
    """Create (or replace, by name) every automation in the file; returns the names installed."""
    from prefect.events.schemas.automations import AutomationCore

    installed = []
    for name in RETIRED:
        for old in await client.read_automations_by_name(name):
            await client.delete_automation(old.id)
    for spec in load_specs(path):
        resolved = await resolve_blocks(client, spec, notify_block)
        if resolved is None:
            continue
        automation = AutomationCore.model_validate(resolved)
        for old in await client.read_automations_by_name(automation.name):
            await client.delete_automation(old.id)
        await client.create_automation(automation)
        installed.append(automation.name)
    return installed
