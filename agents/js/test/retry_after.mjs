// A long-poll Client turned away by its broker, run by tests/browser/test_node_retry_after.py:
// ASBP_URL is a broker that lets one address open one HTTP Channel a second. The first
// Client takes this second's; the second's first POST gets 429 with Retry-After: 1 (fault
// 2108), and it must wait at least that second before its next attempt, not dial straight
// back with its backoff of a few milliseconds. The last line is a JSON summary the test
// checks: the refused opens and the delays the second Client asked for.
import { Client } from "../dist/index.js";

const url = process.env.ASBP_URL;
if (!url) throw new Error("ASBP_URL is required");
let refused = 0;
const counting = async (input, init) => {
  const response = await fetch(input, init);
  if (init?.method === "POST" && (response.status === 429 || response.status === 503)) refused += 1;
  return response;
};
const options = { transports: ["long-poll"], fetch: counting, backoff: { initial: 10, max: 20 } };
const first = new Client(`${url}/asbp`, options);
await first.connect();
const second = new Client(`${url}/asbp`, options);
const delays = [];
const realSetTimeout = globalThis.setTimeout;
// The retry timer is the one the Client sets while reconnecting.
globalThis.setTimeout = (fn, ms, ...rest) => {
  if (second.state === "reconnecting") delays.push(ms);
  return realSetTimeout(fn, ms, ...rest);
};
const began = Date.now();
try {
  await second.connect();
} finally {
  globalThis.setTimeout = realSetTimeout;
}
const waited = Date.now() - began;
const ping = (await second.request("asbp.ping", "lp")).text();
console.log(JSON.stringify({ refused, delays, waited, ping }));
first.close();
second.close();
