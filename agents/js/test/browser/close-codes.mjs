// What a browser sees when a broker refuses a WebSocket message over its limit:
// the close code and reason its CloseEvent carries, which must be the same on every
// server (issue 16). Chromium offers permessage-deflate; the extensions the server
// accepted are reported too.
// Usage: node close-codes.mjs <message size> <base URL>...
// Prints one JSON line per URL ({code, reason, extensions}), then "ok".
import { launch, say } from "../browser.mjs";

const size = Number(process.argv[2]);
const bases = process.argv.slice(3);

const browser = await launch();
try {
  const page = await browser.newPage();
  for (const base of bases) {
    await page.goto(`${base}/healthz`); // the broker's own origin, which it allows
    const seen = await page.evaluate(
      async ([url, size]) => {
        const socket = new WebSocket(url);
        socket.binaryType = "arraybuffer";
        await new Promise((resolve, reject) => {
          socket.onmessage = resolve; // the greeting: the Channel is open
          socket.onerror = () => reject(new Error("no greeting"));
        });
        const extensions = socket.extensions;
        const closed = new Promise((resolve) => {
          socket.onclose = (event) => resolve({ code: event.code, reason: event.reason });
        });
        socket.send(new Uint8Array(size));
        return { ...(await closed), extensions };
      },
      [`${base.replace(/^http/, "ws")}/asbp`, size],
    );
    say(JSON.stringify(seen));
  }
} finally {
  await browser.close();
}
say("ok");
