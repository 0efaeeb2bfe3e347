"""``asbp status``, ``channels``, ``agents``, ``queues``, ``purge`` and ``acl check``:
the real CLI in a subprocess against a real broker process."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

import asbp
from asbp import Command
from tests.support import T
from tests.support.admin import asbp_cli, clean_environ
from tests.support.ports import free_port

POLICY = """
[[security.policies.default.entries]]
action = "DENY"
types = ["COMMAND"]
destination = 'admin\\..*'
privileges = ["WRITE"]
condition = { always = true }
"""
TOKEN = "a-long-enough-admin-token"


@contextlib.contextmanager
def broker_process(tmp_path: Path, config: str = "") -> Iterator[dict[str, Any]]:
    """``python -m gateway`` (``asbp broker``) with ``config`` as its file, on a free
    port; yields its ``listening`` log record, and kills and reaps it at the end."""
    (tmp_path / "broker.toml").write_text(config)
    args = ["--config", str(tmp_path / "broker.toml"), "--port", "0"]
    args += ["--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", *args],
        cwd=tmp_path,
        env=clean_environ(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:
        assert process.stderr is not None
        with process.stderr:
            for line in process.stderr:
                lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        while True:
            line = lines.get(timeout=10 * T)
            assert line is not None, "the broker exited before listening"
            record = orjson.loads(line)
            if record["event"] == "listening":
                break
        yield record
    finally:
        process.kill()
        process.wait(10 * T)
        reader.join(10 * T)


def publish(url: str, queue: str, body: bytes) -> None:
    command = Command({"c": "asbp.publish", "destination": queue, "type": "QUEUE"}, body)
    response = httpx.post(
        f"{url}/asbp",
        content=asbp.encode(command),
        headers={"Content-Type": "application/asbp"},
        timeout=5 * T,
    )
    assert response.status_code == 200, response.text


def test_status_channels_agents_as_tables_and_json(tmp_path: Path) -> None:
    with broker_process(tmp_path) as listening:
        url = listening["url"]
        status = asbp_cli("status", "--url", url, cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        header, rule, row, scope = status.stdout.splitlines()
        assert header.split()[:3] == ["broker", "version", "engine"]
        assert set(rule) <= {"-", " "}
        assert row.split()[0] == listening["broker_id"]
        assert scope == "(scope: broker)"

        as_json = asbp_cli("status", "--url", url, "--json", cwd=tmp_path)
        [info] = json.loads(as_json.stdout)["brokers"]
        assert info["broker"] == listening["broker_id"]

        channels = asbp_cli("channels", "--url", url, "--json", cwd=tmp_path)
        assert json.loads(channels.stdout)["total"] == 0
        assert asbp_cli("agents", "--url", url, cwd=tmp_path).returncode == 0


def test_queues_and_purge(tmp_path: Path) -> None:
    with broker_process(tmp_path) as listening:
        url = listening["url"]
        for n in range(3):
            publish(url, "jobs", b"%d" % n)
        publish(url, "mail", b"x")

        table = asbp_cli("queues", "--url", url, cwd=tmp_path)
        assert table.returncode == 0, table.stderr
        rows = [line.split() for line in table.stdout.splitlines()[2:4]]
        # name, depth, consumers, oldest (hh:mm:ss), dead letters
        assert [row[:3] + row[4:] for row in rows] == [
            ["jobs", "3", "0", "0"],
            ["mail", "1", "0", "0"],
        ]
        assert all(row[3].count(":") == 2 for row in rows)

        peeked = asbp_cli("queues", "peek", "jobs", "--limit", "2", "--url", url, cwd=tmp_path)
        assert peeked.returncode == 0, peeked.stderr
        assert [line.split()[1:] for line in peeked.stdout.splitlines()[2:4]] == [
            ["4", "0", "1", "0"],  # priority, deliveries, bytes, payload
            ["4", "0", "1", "1"],
        ]
        dead = asbp_cli("queues", "dead", "jobs", "--url", url, "--json", cwd=tmp_path)
        assert json.loads(dead.stdout) == {"queue": "jobs", "items": []}
        requeued = asbp_cli("queues", "requeue", "jobs", "--count", "5", "--url", url,
                            cwd=tmp_path)  # fmt: skip
        assert requeued.stdout.strip() == "jobs: 0 dead letters moved back"

        purged = asbp_cli("purge", "jobs", "--url", url, cwd=tmp_path)
        assert purged.stdout.strip() == "jobs: 3 messages removed"
        after = json.loads(asbp_cli("queues", "--url", url, "--json", cwd=tmp_path).stdout)
        assert {q["name"]: q["depth"] for q in after["items"]} == {"jobs": 0, "mail": 1}

        missing = asbp_cli("purge", "nothing", "--url", url, cwd=tmp_path)
        assert (missing.returncode, missing.stderr.strip()) == (
            1,
            "asbp purge: 404: no queue has this name",
        )


def test_acl_check_exits_0_when_allowed_and_3_when_denied(tmp_path: Path) -> None:
    with broker_process(tmp_path, POLICY) as listening:
        url = listening["url"]
        denied = asbp_cli("acl", "check", "billing", "write", "admin.reset", "--url", url,
                          cwd=tmp_path)  # fmt: skip
        assert denied.returncode == 3, denied.stderr
        assert denied.stdout.strip() == "denied by policy 'default', entry 0"
        allowed = asbp_cli("acl", "check", "billing", "WRITE", "quote", "--url", url, "--json",
                           cwd=tmp_path)  # fmt: skip
        assert allowed.returncode == 0
        assert json.loads(allowed.stdout)["allowed"] is True
        policy = asbp_cli("acl", "policy", "billing", "--url", url, cwd=tmp_path)
        assert policy.stdout.strip() == (
            f"billing: policy 'default' (from {tmp_path / 'broker.toml'})"
        )
        reload = asbp_cli("acl", "reload", "--url", url, cwd=tmp_path)
        assert reload.returncode == 0, reload.stderr
        assert reload.stdout.strip() == f"reloaded {tmp_path / 'broker.toml'}: policies default"


def test_a_token_file_is_sent_and_a_refusal_is_one_line(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN)
    with broker_process(tmp_path, f'[management]\ntoken_file = "{token_file}"\n') as listening:
        url = listening["url"]
        refused = asbp_cli("status", "--url", url, cwd=tmp_path)
        assert refused.returncode == 1
        assert refused.stderr.strip() == "asbp status: 401: a bearer token is required"
        allowed = asbp_cli("status", "--url", url, "--token-file", str(token_file), cwd=tmp_path)
        assert allowed.returncode == 0, allowed.stderr


def test_an_unreachable_broker_is_one_line_and_exit_1(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = asbp_cli("status", "--url", f"http://127.0.0.1:{port}", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith(f"asbp status: cannot reach http://127.0.0.1:{port}")
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_bare_asbp_is_still_the_demo(tmp_path: Path) -> None:
    # Only the parser: the management commands must not have taken the bare form over.
    result = asbp_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "status" in result.stdout and "demo" in result.stdout
