"""A webhook's token never leaks (issue 21.6): the block `thrifty deploy --alerts-webhook` makes keeps the URL as a
secret, so the Prefect API shows it masked unless secrets are asked for; a notification that fails logs the
webhook's host, never its path or query, neither on the console nor in the run's logs on the server."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

BLOCK = "custom-webhook/thrifty-leak-test"


class Hook(BaseHTTPRequestHandler):
    """A chat webhook on loopback: answers ``status`` and records the paths it was posted to."""

    status = 204
    paths: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        Hook.paths.append(self.path)
        self.send_response(Hook.status)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def hook():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Hook.paths.clear()
    yield server
    server.shutdown()


def test_the_alerts_webhook_keeps_its_token_secret(prefect_harness, hook, caplog, capfd):
    from prefect import flow, get_run_logger
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler
    from prefect.settings import PREFECT_API_URL

    from deployments.deploy import create_webhook_block
    from tasks.alerts import notify

    token = f"T0KEN{uuid.uuid4().hex}"
    url = f"http://127.0.0.1:{hook.server_port}/services/T000/B000/{token}?auth={token}"
    assert create_webhook_block(url, BLOCK) == BLOCK

    # through the API without asking for secrets: the URL is a placeholder, the secret masked
    with get_client(sync_client=True) as client:
        doc = client.read_block_document_by_name("thrifty-leak-test", "custom-webhook", include_secrets=False)
        raw = httpx.get(f"{PREFECT_API_URL.value()}/block_types/slug/custom-webhook/block_documents/name/"
                        "thrifty-leak-test", params={"include_secrets": "false"}).text
    assert token not in json.dumps(doc.model_dump(mode="json")) and token not in raw
    assert doc.data["url"] == "{{webhook_url}}" and "127.0.0.1" not in raw

    # the block still posts to the whole URL
    Hook.status = 204
    assert notify([BLOCK], "Thrifty: test", "it works") == 1
    assert Hook.paths == [f"/services/T000/B000/{token}?auth={token}"]

    # a failing notification, from inside a flow run: its logs on the server and the console hold no token
    Hook.status = 404

    @flow(name="thrifty-leak-test")
    def alerting() -> int:
        return notify([BLOCK], "Thrifty: test", "it fails", get_run_logger())

    caplog.set_level(logging.DEBUG)
    state = alerting(return_state=True)
    assert state.result() == 0
    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = [log.message for log in client.read_logs(log_filter=LogFilter(
            flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id])))]
    failed = [m for m in logs if f"notification to {BLOCK} failed" in m]
    assert failed and f"http://127.0.0.1:{hook.server_port}/***" in failed[0] and "404" in failed[0], logs
    console = capfd.readouterr()
    for where, text in (("the run's logs", "\n".join(logs)), ("the log records", caplog.text),
                        ("stderr", console.err), ("stdout", console.out)):
        assert token not in text, f"the token is in {where}"
