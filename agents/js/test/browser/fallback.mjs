// A proxy in front of the broker refuses every WebSocket upgrade (403), as some
// corporate proxies do: the page falls back to HTTP long-poll and still works.
// Usage: node fallback.mjs <broker base url>
import net from "node:net";
import { launch, check, T } from "../browser.mjs";

const target = new URL(process.argv[2]);
const proxy = net.createServer((client) => {
  client.once("data", (head) => {
    if (/^upgrade:\s*websocket/im.test(head.toString("latin1"))) {
      client.end("HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
      return;
    }
    const upstream = net.connect(Number(target.port), target.hostname, () => {
      upstream.write(head);
      client.pipe(upstream).pipe(client);
    });
    upstream.on("error", () => client.destroy());
    client.on("error", () => upstream.destroy());
  });
});
await new Promise((resolve) => proxy.listen(0, "127.0.0.1", resolve));
const base = `http://127.0.0.1:${proxy.address().port}`;

const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(`${base}/?upgrade=500`);
  await page.waitForSelector('#state[data-state="long-poll"]', { timeout: 20_000 * T });
  check((await page.textContent("#transport")) === "(long-poll)", "on long-poll");
  await page.fill("#echo-input", "through long-poll");
  await page.click("#echo-send");
  await page.waitForSelector("#replies li:has-text('echo.reply: through long-poll')", { timeout: 15_000 * T });
  await page.click("#clock");
  await page.waitForSelector("#replies li:has-text('(done)')", { timeout: 15_000 * T });
  await page.click("#signin-alice");
  await page.waitForSelector("#subjects li:has-text('alice: s=')", { timeout: 10_000 * T });
  await page.click("#subscribe");
  await page.waitForSelector("#subscribe:has-text('Subscribed')", { timeout: 10_000 * T });
  await page.click("#publish");
  await page.waitForSelector("#notifications li:has-text('goal!')", { timeout: 10_000 * T });
  // Still on long-poll: the upgrade keeps being refused, every 500 ms.
  check((await page.evaluate(() => window.asbp.transport)) === "long-poll", "still on long-poll");
  // And back to a WebSocket once the page reaches the broker without the proxy.
  await page.goto(`${process.argv[2]}/`);
  await page.waitForSelector('#state[data-state="open"]', { timeout: 15_000 * T });
  console.log("ok");
} finally {
  await browser.close();
  proxy.close();
}
