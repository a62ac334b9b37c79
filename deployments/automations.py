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


DEFAULT_ALERTS_BLOCK = "custom-webhook/thrifty-alerts"  # the block automations.yaml's failure alert names


def missing_block_step(automation: str, ref: str) -> str:
    """The next step a user takes when an automation's notification block does not exist."""
    return (f"automation {automation!r} is NOT installed: notification block {ref} does not exist. Create it with "
            f"`thrifty deploy --alerts-webhook https://...` (a custom webhook), or in the Prefect UI (Blocks) and "
            f"run `thrifty deploy` again (`--alerts-block TYPE/NAME` picks another block)")


async def resolve_blocks(client: Any, spec: dict[str, Any], notify_block: str | None,
                         skipped: list[str] | None = None) -> dict[str, Any] | None:
    """Swap ``block: type/name`` for ``block_document_id``; None if a named block does not exist (the next step
    is appended to ``skipped``)."""
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
                step = missing_block_step(spec["name"], f"{slug}/{name}")
                log.debug(step)
                if skipped is not None:
                    skipped.append(step)
                return None
            action["block_document_id"] = str(block.id)
        actions.append(action)
    return {**spec, "actions": actions}


async def install(client: Any, notify_block: str | None = None, path: Path = AUTOMATIONS_FILE,
                  skipped: list[str] | None = None) -> list[str]:
    """Create (or replace, by name) every automation in the file; returns the names installed. An automation whose
    notification block is missing is not installed; what to do about it is appended to ``skipped``."""
    from prefect.events.schemas.automations import AutomationCore

    installed = []
    for name in RETIRED:
        for old in await client.read_automations_by_name(name):
            await client.delete_automation(old.id)
    for spec in load_specs(path):
        resolved = await resolve_blocks(client, spec, notify_block, skipped)
        if resolved is None:
            continue
        automation = AutomationCore.model_validate(resolved)
        for old in await client.read_automations_by_name(automation.name):
            await client.delete_automation(old.id)
        await client.create_automation(automation)
        installed.append(automation.name)
    return installed
