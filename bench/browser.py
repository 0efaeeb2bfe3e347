"""The TypeScript client in a real browser against a bare WebSocket, and its size.

    python bench/browser.py [--quick] [--rounds N] [--no-sizes]

Starts ``asbp demo`` (a broker and the example agent) on a free port, opens its
page in headless Chromium (Debian's ``/usr/bin/chromium`` driven by
playwright-core; agents/js must have ``npm ci`` done) and, in that one page,
measures echo round trips per second two ways, alternating within each round:

=============  ================================================================
client         ``Client.request(name, body)`` from agents/js (codec, ``u``
               correlation, timeout bookkeeping), binary frames
bare           a ``WebSocket`` with hand-written frames: ``c=<name>,u=<n>;<body>``
               sent as text, the answer's ``u`` found with a regular expression
=============  ================================================================

for three loads: ``asbp.ping`` one at a time (the broker answers it itself, so
the client's own cost shows most), ``asbp.ping`` with 16 in flight, and the
example agent's ``echo`` with 16 in flight. The ratio is client / bare per
round; the table gives medians over the rounds. The goal: at least 0.8.

Then the bundle's size (minified by esbuild, gzipped at level 9) beside
socket.io-client's and centrifuge-js's, installed from npm into a temporary
folder for the measurement only (never shipped), bundled and gzipped alike.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "agents" / "js"
sys.path.insert(0, str(ROOT))  # tests.support

from tests.support.ports import listen_port  # noqa: E402  # after the path above

READY = "The ASBP demo is running"
#: (label, Command-Name, requests in flight)
LOADS = (
    ("asbp.ping, 1 in flight", "asbp.ping", 1),
    ("asbp.ping, 16 in flight", "asbp.ping", 16),
    ("echo (agent), 16 in flight", "echo", 16),
)
#: The peers' clients whose bundle sizes are shown beside ours: (package, entry code).
PEERS = (
    ("socket.io-client", 'export { io } from "socket.io-client";'),
    ("centrifuge", 'export { Centrifuge } from "centrifuge";'),
)


def start_demo(port: int, data_dir: Path) -> subprocess.Popen[str]:
    """``asbp demo`` on ``port``; returns once its banner says both are ready."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    demo = subprocess.Popen(
        [
            *(sys.executable, "-m", "gateway.ops.cli", "demo"),
            *("--port", str(port), "--data-dir", str(data_dir)),
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ready = threading.Event()

    def read() -> None:
        assert demo.stdout is not None
        for line in demo.stdout:
            if READY in line:
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(60) or demo.poll() is not None:
        raise SystemExit("asbp demo did not start")
    return demo


def gzipped(data: bytes) -> int:
    return len(gzip.compress(data, compresslevel=9))


def bundle_sizes(esbuild: Path) -> list[tuple[str, int, int]]:
    """(name, minified bytes, gzipped bytes): ours, then each peer's, bundled alike."""
    ours = (JS / "dist" / "asbp.min.js").read_bytes()
    sizes = [("@asbp/client (agents/js)", len(ours), gzipped(ours))]
    npm = shutil.which("npm")
    if npm is None:
        return sizes
    with tempfile.TemporaryDirectory(prefix="asbp-bench-peers-") as tmp:
        folder = Path(tmp)
        subprocess.run(
            [
                *(npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", tmp),
                *(name for name, _ in PEERS),
            ],
            check=True,
            capture_output=True,
        )
        for name, entry in PEERS:
            source = folder / f"{name}.entry.mjs"
            source.write_text(entry)
            out = folder / f"{name}.min.js"
            subprocess.run(
                [
                    *(esbuild, source, "--bundle", "--minify", "--format=esm"),
                    *(f"--outfile={out}", "--log-level=warning"),
                ],
                check=True,
                cwd=folder,
            )
            data = out.read_bytes()
            version = json.loads((folder / "node_modules" / name / "package.json").read_text())
            sizes.append((f"{name} {version['version']}", len(data), gzipped(data)))
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short batches: rough numbers")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per load")
    parser.add_argument("--no-sizes", action="store_true", help="skip the bundle sizes")
    args = parser.parse_args()
    npm = shutil.which("npm")
    node = shutil.which("node")
    if npm is None or node is None or not (JS / "node_modules").is_dir():
        raise SystemExit("needs node, npm and `npm ci --prefix agents/js`")
    subprocess.run([npm, "run", "--silent", "build"], cwd=JS, check=True)
    count = 300 if args.quick else 3000
    rounds = 2 if args.quick else args.rounds
    port = listen_port()
    rows = []
    with tempfile.TemporaryDirectory(prefix="asbp-bench-browser-") as tmp:
        demo = start_demo(port, Path(tmp) / "demo")
        try:
            for label, name, window in LOADS:
                # The agent answers more slowly than the broker: fewer round trips.
                batch = count if name == "asbp.ping" else count // 3
                done = subprocess.run(
                    [
                        *(node, "bench/echo.mjs", f"http://127.0.0.1:{port}", str(batch)),
                        *(str(rounds), str(window), name),
                    ],
                    cwd=JS,
                    check=True,
                    capture_output=True,
                    text=True,
                )
                result = json.loads(done.stdout.strip().splitlines()[-1])
                ratios = [c / b for c, b in zip(result["client"], result["bare"], strict=True)]
                rows.append(
                    (
                        label,
                        statistics.median(result["client"]),
                        statistics.median(result["bare"]),
                        statistics.median(ratios),
                    )
                )
        finally:
            demo.send_signal(signal.SIGTERM)
            demo.wait(30)
            if demo.stdout is not None:
                demo.stdout.close()
    print(f"echo round trips per second in Chromium, medians of {rounds} alternating rounds")
    print(f"{'load':<28} {'client':>10} {'bare':>10} {'ratio':>7}")
    for label, client, bare, ratio in rows:
        print(f"{label:<28} {client:>10.0f} {bare:>10.0f} {ratio:>7.2f}")
    worst = min(ratio for *_, ratio in rows)
    print(f"lowest ratio: {worst:.2f} (goal: at least 0.80)")
    if not args.no_sizes:
        print()
        print(f"{'bundle (esbuild --minify)':<36} {'bytes':>8} {'gzip -9':>8}")
        for name, minified, packed in bundle_sizes(JS / "node_modules" / ".bin" / "esbuild"):
            print(f"{name:<36} {minified:>8} {packed:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
