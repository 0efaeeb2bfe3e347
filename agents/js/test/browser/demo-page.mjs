// The demo page in Chromium: echo, a streamed clock, two Subjects in one tab, a
// topic, and the connection state. Usage: node demo-page.mjs <page url> <screenshot>
import { launch, check, T } from "../browser.mjs";

const [pageUrl, screenshot] = process.argv.slice(2);
const browser = await launch();
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (error) => errors.push(String(error)));
  await page.goto(pageUrl);
  await page.waitForSelector('#state[data-state="open"]', { timeout: 15_000 * T });
  check((await page.textContent("#transport")) === "(websocket)", "on a WebSocket");

  await page.fill("#echo-input", "hello from chromium");
  await page.click("#echo-send");
  await page.waitForSelector("#replies li:has-text('echo.reply: hello from chromium')", { timeout: 10_000 * T });

  await page.click("#clock");
  await page.waitForSelector("#replies li:has-text('(done)')", { timeout: 15_000 * T });
  check((await page.locator("#replies li .part").count()) === 3, "three clock parts");

  await page.click("#signin-alice");
  await page.waitForSelector("#subjects li:has-text('alice: s=')", { timeout: 10_000 * T });
  await page.click("#signin-bob");
  await page.waitForSelector("#subjects li:has-text('bob: s=')", { timeout: 10_000 * T });
  await page.click("#whoami");
  await page.waitForSelector("#subjects li:has-text(\"whoami as alice's s: alice\")", { timeout: 10_000 * T });
  await page.waitForSelector("#subjects li:has-text(\"whoami as bob's s: bob\")", { timeout: 10_000 * T });
  const ids = await page.locator("#subjects li").allTextContents();
  const subjects = ids.filter((t) => t.includes(": s=")).map((t) => /s=([0-9a-f]{32})/.exec(t)[1]);
  check(subjects.length === 2 && subjects[0] !== subjects[1], "two distinct Subjects");

  await page.click("#subscribe");
  await page.waitForSelector("#subscribe:has-text('Subscribed')", { timeout: 10_000 * T });
  await page.fill("#publish-input", "goal!");
  await page.click("#publish");
  await page.waitForSelector("#notifications li:has-text('goal!')", { timeout: 10_000 * T });

  await page.screenshot({ path: screenshot, fullPage: true });
  check(errors.length === 0, `no page errors: ${errors.join("; ")}`);
  console.log("ok");
} finally {
  await browser.close();
}
