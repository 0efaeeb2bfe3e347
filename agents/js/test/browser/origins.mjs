// A page on another origin may not use the broker unless cors_origins
// names it. asbp demo allows http://localhost:<port> (and its own origin); a page
// served from another port is refused, over a WebSocket and over HTTP.
// Usage: node origins.mjs <broker port>
import http from "node:http";
import { readFileSync } from "node:fs";
import { launch, check } from "../browser.mjs";

const port = process.argv[2];
const broker = `http://127.0.0.1:${port}/asbp`;
const bundle = readFileSync(new URL("../../dist/asbp.min.js", import.meta.url));
// The foreign site: a page of its own and its own copy of the client.
const site = http.createServer((request, response) => {
  if (request.url === "/asbp.min.js") {
    response.writeHead(200, { "content-type": "text/javascript" }).end(bundle);
  } else {
    response.writeHead(200, { "content-type": "text/html" }).end("<!doctype html><title>elsewhere</title>");
  }
});
await new Promise((resolve) => site.listen(0, "127.0.0.1", resolve));
const elsewhere = `http://127.0.0.1:${site.address().port}`;

// In the page: connect with one transport, report the first state past connecting.
async function attempt(page, transports) {
  return page.evaluate(
    async ([url, transports]) => {
      const { Client } = await import("/asbp.min.js");
      const client = new Client(url, { transports, backoff: { initial: 60_000, max: 60_000 } });
      const state = new Promise((resolve) => client.on("state", (s) => s !== "connecting" && resolve(s)));
      client.connect().catch(() => {});
      const reached = await state;
      let echoed = null;
      if (reached === "open" || reached === "long-poll") {
        echoed = (await client.request("echo", "cross-origin", { timeout: 10_000 })).text();
      }
      client.close();
      return { reached, echoed };
    },
    [broker, transports],
  );
}

const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(`${elsewhere}/`);
  for (const transports of [["websocket"], ["long-poll"]]) {
    const { reached } = await attempt(page, transports);
    check(reached === "reconnecting", `${transports} from ${elsewhere} refused, got ${reached}`);
  }
  // The raw answer, for the record: 403 with fault 3201 (the browser hides the body).
  const status = await page.evaluate(
    (url) => fetch(url, { method: "POST", body: "c=asbp.ping;", mode: "no-cors" }).then((r) => r.type),
    broker,
  );
  check(status === "opaque", "no-cors POST is opaque");

  // localhost is allowed by the demo: a page there may use the broker at 127.0.0.1.
  await page.goto(`http://localhost:${port}/`);
  for (const [transports, expected] of [[["websocket"], "open"], [["long-poll"], "long-poll"]]) {
    const { reached, echoed } = await attempt(page, transports);
    check(reached === expected, `${transports} from localhost allowed, got ${reached}`);
    check(echoed === "cross-origin", `echo over ${transports}: ${echoed}`);
  }
  console.log("ok");
} finally {
  await browser.close();
  site.close();
}
