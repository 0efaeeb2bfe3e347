"""The demo page in a real Chromium, against ``asbp demo`` (a broker and the example agent).

Each test runs a Node script in agents/js/test/browser that drives headless
Chromium (agents/js/test/browser.mjs) and exits 0 once everything it checks
held; the script prints what went wrong otherwise.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from gateway.ops import demo_page
from tests.support import T
from tests.support.demo import Demo
from tests.support.js import JS_ROOT, built_client, node, run_node


def passed(done: subprocess.CompletedProcess[str]) -> bool:
    return done.returncode == 0 and done.stdout.strip().endswith("ok")


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def test_the_shipped_bundle_is_a_fresh_build() -> None:
    built = (built_client() / "dist" / "asbp.min.js").read_bytes()
    shipped = Path(demo_page.__file__).with_name("asbp.min.js").read_bytes()
    assert shipped == built, "cp agents/js/dist/asbp.min.js gateway/ops/demo_page/"


def test_the_page_sends_and_receives(demo: Demo, tmp_path: Path) -> None:
    screenshot = tmp_path / "demo-page.png"
    script = "test/browser/demo-page.mjs"
    done = run_node([script, demo.base + "/", str(screenshot)], timeout=90 * T)
    assert passed(done), explain(done)
    assert screenshot.stat().st_size > 10_000


def test_the_page_reconnects_when_the_broker_restarts(demo: Demo) -> None:
    script = subprocess.Popen(
        [node(), "test/browser/reconnect.mjs", demo.base + "/?backoff=1000"],
        cwd=built_client(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert script.stdout is not None and script.stdin is not None
        line = script.stdout.readline().strip()
        if line != "restart":
            out, err = script.communicate(timeout=30 * T)
            raise AssertionError(f"{line}\n{out}\n{err}")
        demo.stop()
        demo.start()
        script.stdin.write("restarted\n")
        script.stdin.flush()
        out, err = script.communicate(timeout=90 * T)
        assert script.returncode == 0 and out.strip().endswith("ok"), f"{out}\n{err}"
    finally:
        if script.poll() is None:
            script.kill()
            script.wait()


def test_the_page_falls_back_to_long_poll_when_the_upgrade_is_refused(demo: Demo) -> None:
    done = run_node(["test/browser/fallback.mjs", demo.base], timeout=90 * T)
    assert passed(done), explain(done)


def test_a_page_on_another_origin_is_refused_unless_allowed(demo: Demo) -> None:
    done = run_node(["test/browser/origins.mjs", str(demo.port)], timeout=90 * T)
    assert passed(done), explain(done)


def test_the_scripts_exist() -> None:
    for name in ("demo-page", "reconnect", "fallback", "origins"):
        assert (JS_ROOT / "test" / "browser" / f"{name}.mjs").is_file()
