// Echo round trips per second from one page in headless Chromium: through the
// Client against a bare WebSocket with hand-written frames, alternating in the
// same browser, against the same broker. Run by bench/browser.py, which starts
// the broker and the example agent and prints the table.
// Usage: node bench/echo.mjs <base url> <round trips per batch> <rounds> <window> <name>
// Prints one JSON line: {"client": [rates...], "bare": [rates...]}.
import { launch } from "../test/browser.mjs";

const [base, count, rounds, window_, name] = process.argv.slice(2);
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(`${base}/`);
  const result = await page.evaluate(
    async ([count, rounds, windowSize, name]) => {
      const { Client } = await import("/asbp.min.js");
      const body = "x".repeat(64);
      const url = `${location.origin.replace("http", "ws")}/asbp`;

      // `windowSize` requests in flight, `count` in all; returns round trips per second.
      async function run(send) {
        let next = 0;
        const started = performance.now();
        const lane = async () => {
          while (next < count) {
            next++;
            await send();
          }
        };
        await Promise.all(Array.from({ length: windowSize }, lane));
        return count / ((performance.now() - started) / 1000);
      }

      async function viaClient() {
        const client = new Client("/asbp");
        await client.connect();
        for (let n = 0; n < 50; n++) await client.request(name, body); // warm-up
        const rate = await run(() => client.request(name, body));
        client.close();
        return rate;
      }

      async function viaBare() {
        const ws = new WebSocket(url);
        ws.binaryType = "arraybuffer";
        const waiting = new Map();
        let u = 0;
        await new Promise((resolve) => (ws.onmessage = resolve)); // the greeting
        ws.onmessage = (event) => {
          const text = typeof event.data === "string" ? event.data : new TextDecoder().decode(event.data);
          const id = /[,;]?u=(\d+)[,;]/.exec(text)?.[1];
          const done = waiting.get(id);
          waiting.delete(id);
          done?.();
        };
        const send = () =>
          new Promise((resolve) => {
            u = u === 65535 ? 0 : u + 1;
            waiting.set(String(u), resolve);
            ws.send(`c=${name},u=${u};${body}`);
          });
        for (let n = 0; n < 50; n++) await send();
        const rate = await run(send);
        ws.close();
        return rate;
      }

      const out = { client: [], bare: [] };
      for (let r = 0; r < rounds; r++) {
        // Alternate which goes first, so that warming and load hit both alike.
        if (r % 2) {
          out.bare.push(await viaBare());
          out.client.push(await viaClient());
        } else {
          out.client.push(await viaClient());
          out.bare.push(await viaBare());
        }
      }
      return out;
    },
    [Number(count), Number(rounds), Number(window_), name],
  );
  console.log(JSON.stringify(result));
} finally {
  await browser.close();
}
