// retryAfterMs: the wait a broker's 503 or 429 asks for (src/transports.ts). Pure: no broker.
import { test } from "node:test";
import assert from "node:assert/strict";
import { MAX_RETRY_AFTER, retryAfterMs } from "../dist/index.js";

const answer = (status, value) =>
  new Response(null, { status, headers: value === undefined ? {} : { "retry-after": value } });
const NOW = Date.parse("2026-11-26T09:00:00Z");

test("Retry-After in whole seconds or as an HTTP date, capped at a minute", () => {
  assert.equal(retryAfterMs(answer(503, "1")), 1000);
  assert.equal(retryAfterMs(answer(429, " 2 ")), 2000);
  assert.equal(retryAfterMs(answer(503, "3600")), MAX_RETRY_AFTER);
  assert.equal(retryAfterMs(answer(503, new Date(NOW + 12_000).toUTCString()), NOW), 12_000);
  assert.equal(retryAfterMs(answer(503, new Date(NOW - 12_000).toUTCString()), NOW), 0);
});

test("no wait from another status, no header, or a value of neither form", () => {
  assert.equal(retryAfterMs(answer(500, "1")), undefined);
  assert.equal(retryAfterMs(answer(404, "1")), undefined);
  assert.equal(retryAfterMs(answer(503)), undefined);
  for (const value of ["", "-1", "1.5", "soon", "Wed, 21 Oct 2015 07:28:00"]) {
    assert.equal(retryAfterMs(answer(503, value)), undefined, value);
  }
});
