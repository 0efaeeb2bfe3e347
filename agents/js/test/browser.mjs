// Headless Chromium for tests, reusable by any test that needs a page (the demo
// page's tests in tests/browser, the ops console's). Debian's chromium
// (/usr/bin/chromium, or $CHROMIUM) driven by playwright-core: playwright cannot
// download a browser here. Each launch gets a fresh profile, removed on close.
//
//   import { launch } from "../browser.mjs";
//   const browser = await launch();
//   const page = await browser.newPage();
//   ...
//   await browser.close();
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";

/**
 * The timeout unit, as tests/support/timing.py has it: ASBP_TEST_TIMEOUT_UNIT seconds
 * (default 1) stretch every deadline at once on a slow machine. Deadlines below are
 * written as `15 * T` seconds' worth of milliseconds: `15_000 * T`.
 */
export const T = Number(process.env.ASBP_TEST_TIMEOUT_UNIT || 1);

export const ARGS = [
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--no-first-run",
  "--disable-quic",
  "--disable-sync",
];

/** A browser context with a fresh profile; `close()` also removes the profile. */
export async function launch({ args = [] } = {}) {
  const profile = mkdtempSync(join(tmpdir(), "asbp-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [...ARGS, ...args],
  });
  const close = context.close.bind(context);
  context.close = async () => {
    try {
      await close();
    } finally {
      rmSync(profile, { recursive: true, force: true });
    }
  };
  return context;
}

/** Fail the script with `message` unless `condition` holds. */
export function check(condition, message) {
  if (!condition) throw new Error(`check failed: ${message}`);
}

/** Print one line for the Python side (it reads the script's stdout line by line). */
export function say(line) {
  process.stdout.write(`${line}\n`);
}

/** The next line the Python side writes to the script's stdin. */
export function nextLine() {
  return new Promise((resolve) => {
    let buffer = "";
    const onData = (chunk) => {
      buffer += chunk;
      const end = buffer.indexOf("\n");
      if (end !== -1) {
        process.stdin.off("data", onData);
        process.stdin.pause();
        resolve(buffer.slice(0, end));
      }
    };
    process.stdin.setEncoding("utf-8");
    process.stdin.on("data", onData);
    process.stdin.resume();
  });
}
