// Drives /console of one broker of a two-broker bus in headless Chromium
// (test_console_bus.py runs it): the agents table shows the other broker's
// agents, with a Broker column. Prints the table's rows as JSON; exit 0 on
// success, the reason on stderr otherwise.
// Usage: node console_bus.mjs BASE_URL OTHER_BROKER
import { chromium } from "playwright-core";

const [baseUrl, other] = process.argv.slice(2);
const TIMEOUT = Number(process.env.CONSOLE_TIMEOUT_MS || 20000);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (error) => problems.push(String(error)));
  await page.goto(`${baseUrl}/console/`, { timeout: TIMEOUT });
  await page.waitForFunction(
    (broker) => [...document.querySelectorAll("#agents tbody td")]
      .some((td) => td.textContent === broker),
    other, { timeout: TIMEOUT });
  if (problems.length) throw new Error("page errors: " + problems.join("; "));
  const headers = await page.locator("#agents thead th").allTextContents();
  const rows = await page.locator("#agents tbody tr").evaluateAll(
    (trs) => trs.map((tr) => [...tr.cells].map((td) => td.textContent)));
  console.log(JSON.stringify({ headers, rows }));
} catch (error) {
  console.error(String(error && error.stack || error));
  process.exitCode = 1;
} finally {
  await browser.close();
}
