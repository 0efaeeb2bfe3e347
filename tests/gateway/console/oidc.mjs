// Signs in to the broker's /console through its OpenID Connect provider in
// headless Chromium (test_oidc.py runs it): "Sign in" leads to the provider and
// back, the page keeps the access token for the tab, clears it from the address
// bar, and the API answers it (the broker's identity appears). Prints what it
// saw as JSON; exit 0 on success, the reason on stderr otherwise.
// Usage: node oidc.mjs BASE_URL SCREENSHOT_PATH
import { chromium } from "playwright-core";

const [baseUrl, screenshot] = process.argv.slice(2);
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
  const signIn = page.getByRole("link", { name: "Sign in with your identity provider" });
  await signIn.waitFor({ state: "visible", timeout: TIMEOUT });
  await signIn.click();
  await page.waitForFunction(
    () => document.getElementById("broker").textContent !== "…", null, { timeout: TIMEOUT });
  await page.screenshot({ path: screenshot, fullPage: true });
  const seen = await page.evaluate(() => ({
    broker: document.getElementById("broker").textContent,
    hash: location.hash,
    token: sessionStorage.getItem("asbp-token"),
    error: document.getElementById("error").hidden ? null : document.getElementById("error").textContent,
  }));
  if (seen.error) throw new Error("the console shows an error: " + seen.error);
  if (problems.length) throw new Error("page errors: " + problems.join("; "));
  console.log(JSON.stringify(seen));
} catch (error) {
  console.error(String(error && error.stack || error));
  process.exitCode = 1;
} finally {
  await browser.close();
}
