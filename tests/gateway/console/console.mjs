// Drives the broker's /console in headless Chromium (test_console.py runs it):
// the page loads, the Commands/s chart gains points, and purging the queue named
// on the command line from its table empties it. Exit 0 on success; the reason
// on stderr otherwise. Usage: node console.mjs BASE_URL QUEUE SCREENSHOT_PATH
import { chromium } from "playwright-core";

const [baseUrl, queue, screenshot] = process.argv.slice(2);
const TIMEOUT = Number(process.env.CONSOLE_TIMEOUT_MS || 20000);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (error) => problems.push(String(error)));
  page.on("dialog", (dialog) => dialog.accept());
  await page.goto(`${baseUrl}/console/`, { timeout: TIMEOUT });

  // The broker's identity appears once the API answered.
  await page.waitForFunction(
    () => document.getElementById("broker").textContent !== "…", null, { timeout: TIMEOUT });
  // A chart updates: the Commands/s series gains a second point (rates need two scrapes).
  await page.waitForFunction(
    () => Number(document.getElementById("chart-commands").dataset.points) >= 2,
    null, { timeout: TIMEOUT });
  const row = page.locator(`#queues tr[data-queue="${queue}"]`);
  await row.waitFor({ timeout: TIMEOUT });
  const before = Number(await row.locator("td.depth").textContent());
  if (!(before > 0)) throw new Error(`queue ${queue} shows depth ${before} before the purge`);
  await page.screenshot({ path: screenshot, fullPage: true });

  await row.getByRole("button", { name: "Purge" }).click();
  await page.waitForFunction(
    (name) => document.querySelector(`#queues tr[data-queue="${name}"] td.depth`)
      ?.textContent === "0",
    queue, { timeout: TIMEOUT });
  if (problems.length) throw new Error("page errors: " + problems.join("; "));
  const agents = await page.locator("#agents tbody tr").count();
  console.log(JSON.stringify({ before, agents, screenshot }));
} catch (error) {
  console.error(String(error && error.stack || error));
  process.exitCode = 1;
} finally {
  await browser.close();
}
