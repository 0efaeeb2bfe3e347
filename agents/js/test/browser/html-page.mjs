// An HTML page served at the broker's origin (as if it were one of the broker's own
// files) in Chromium: it must show "open" and the echo of "hello from the page".
// Usage: node html-page.mjs <broker base url> <page.html>
import { readFileSync } from "node:fs";
import { launch, check, T } from "../browser.mjs";

const [base, file] = process.argv.slice(2);
// A document that Playwright fulfils has no network address of its own, so Chromium's
// Local Network Access checks count it as public and block its WebSocket to loopback
// (net::ERR_BLOCKED_BY_LOCAL_NETWORK_ACCESS_CHECKS); a page the broker served itself
// is loopback and is not blocked. Off for this test only.
const browser = await launch({ args: ["--disable-features=LocalNetworkAccessChecks"] });
try {
  const page = await browser.newPage();
  await page.route(`${base}/tutorial.html`, (route) =>
    route.fulfill({ status: 200, contentType: "text/html", body: readFileSync(file, "utf-8") }),
  );
  await page.goto(`${base}/tutorial.html`);
  await page.waitForSelector("#reply:has-text('hello from the page')", { timeout: 15_000 * T });
  const state = await page.textContent("#state");
  check(state === "open", `state open, not ${state}`);
  console.log("ok");
} finally {
  await browser.close();
}
