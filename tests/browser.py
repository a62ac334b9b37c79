"""Chromium, driven by Playwright, on the Prefect UI: the browser the UI tests (and any test that checks what a page
shows) open. Debian's chromium, offline; every request off loopback is blocked and recorded."""

from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

CHROMIUM = os.environ.get("THRIFTY_CHROMIUM", "/usr/bin/chromium")
INSTALL = "apt-get update && apt-get install -y chromium"
LOOPBACK = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?/")
TIMEOUT_MS = 90_000  # what a page may take to show a thing: a machine loaded 4x over (CPU hogs beside the suite) is slow


def require_chromium() -> str:
    """The system browser: a missing one fails loudly with the command that installs it (never skipped)."""
    path = CHROMIUM if os.path.isabs(CHROMIUM) else shutil.which(CHROMIUM)
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"no chromium at {CHROMIUM}: install Debian's with `{INSTALL}` (.ci/run does), or point "
                    "THRIFTY_CHROMIUM at one. Playwright's own browser download cannot work offline.")
    return path


@contextmanager
def browser_page(base_url: str) -> Iterator[Any]:
    """A page on ``base_url`` (relative ``goto`` paths), 1400x1000, loopback only (``page.blocked`` lists the rest)."""
    from playwright.sync_api import sync_playwright

    executable = require_chromium()
    blocked: list[str] = []

    def loopback_only(route: Any) -> None:
        url = route.request.url
        if LOOPBACK.match(url) or url.startswith(("data:", "blob:", "about:")):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1400, "height": 1000}, base_url=base_url)
        context.route("**/*", loopback_only)
        context.set_default_timeout(TIMEOUT_MS)
        pg = context.new_page()
        pg.blocked = blocked
        try:
            yield pg
        finally:
            context.close()
            browser.close()


def too_wide(page: Any) -> list[str]:
    """The tables on the page that do not fit their pane (one must scroll sideways), each as 'W px in P px: its
    widest cell'; empty when everything fits."""
    return page.evaluate("""() => [...document.querySelectorAll('table')]
        .filter(t => t.parentElement.scrollWidth > t.parentElement.clientWidth + 1)
        .map(t => {
            const cells = [...t.querySelectorAll('td, th')].sort((a, b) => b.scrollWidth - a.scrollWidth);
            return `${t.parentElement.scrollWidth} px in ${t.parentElement.clientWidth} px: `
                + (cells[0] ? cells[0].innerText.slice(0, 160) : '');
        })""")
