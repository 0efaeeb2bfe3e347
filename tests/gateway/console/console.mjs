// Drives the broker's /console in headless Chromium (test_console.py runs it):
// the page loads, the Commands/s chart gains points, peeking into QUEUE lists
// its messages, purging it from its table empties it, and DEAD_QUEUE's dead
// letters are moved back with its button. Exit 0 on success; the reason on
// stderr otherwise.
// Usage: node console.mjs BASE_URL QUEUE SCREENSHOT_PATH DEAD_QUEUE
import { chromium } from "playwright-core";

const [baseUrl, queue, screenshot, deadQueue] = process.argv.slice(2);
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

  // Peek: the queue's messages, in order, still there afterwards.
  await row.getByRole("button", { name: "Peek" }).click();
  await page.waitForFunction(
    (name) => document.getElementById("peek").dataset.queue === name
      && document.querySelectorAll("#peek tbody tr").length > 0,
    queue, { timeout: TIMEOUT });
  const peeked = await page.locator("#peek tbody td.payload").allTextContents();
  await page.screenshot({ path: screenshot, fullPage: true });

  // Dead letters moved back: the dead queue's row shows them, its button moves them.
  const deadRow = page.locator(`#queues tr[data-queue="${deadQueue}"]`);
  await deadRow.waitFor({ timeout: TIMEOUT });
  const deadBefore = Number(await deadRow.locator("td.dead").textContent());
  await deadRow.getByRole("button", { name: "Move back" }).click();
  await page.waitForFunction(
    (name) => document.querySelector(`#queues tr[data-queue="${name}"] td.dead`)
      ?.textContent === "0",
    deadQueue, { timeout: TIMEOUT });
  const deadDepth = Number(await deadRow.locator("td.depth").textContent());

  await row.getByRole("button", { name: "Purge" }).click();
  await page.waitForFunction(
    (name) => document.querySelector(`#queues tr[data-queue="${name}"] td.depth`)
      ?.textContent === "0",
    queue, { timeout: TIMEOUT });
  if (problems.length) throw new Error("page errors: " + problems.join("; "));
  const agents = await page.locator("#agents tbody tr").count();
  const brokers = await page.locator("#brokers tbody tr").count();
  console.log(JSON.stringify({ before, agents, brokers, screenshot, peeked, deadBefore,
                               deadDepth }));
} catch (error) {
  console.error(String(error && error.stack || error));
  process.exitCode = 1;
} finally {
  await browser.close();
}
