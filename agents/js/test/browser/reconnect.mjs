// The broker restarted under the page: the page reconnects (a new Channel) and goes on.
// Usage: node reconnect.mjs <page url>; prints "restart", waits for a line on stdin.
import { launch, check, say, nextLine, T } from "../browser.mjs";

const [pageUrl] = process.argv.slice(2);
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(pageUrl);
  await page.waitForSelector('#state[data-state="open"]', { timeout: 15_000 * T });
  const first = await page.textContent("#channel");
  await page.click("#echo-send");
  await page.waitForSelector("#replies li:has-text('echo.reply: hello')", { timeout: 10_000 * T });
  // Record every state the page goes through from here.
  await page.evaluate(() => {
    window.states = [];
    window.asbp.on("state", (s) => window.states.push(s));
  });
  say("restart");
  await nextLine();
  await page.waitForFunction(
    (old) => window.asbp.state === "open" && window.asbp.channelId !== old,
    first,
    { timeout: 60_000 * T },
  );
  const states = await page.evaluate(() => window.states);
  check(states.includes("reconnecting"), `went through reconnecting: ${states}`);
  await page.fill("#echo-input", "after the restart");
  await page.click("#echo-send");
  await page.waitForSelector("#replies li:has-text('echo.reply: after the restart')", { timeout: 15_000 * T });
  check((await page.locator("#replies li:has-text('new Channel')").count()) >= 1, "the gap is shown");
  console.log("ok");
} finally {
  await browser.close();
}
