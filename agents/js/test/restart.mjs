// The Client through its broker's rolling restart, run by tests/browser/test_node_restart.py:
// ASBP_URL is a proxy in front of broker A; once this prints "ready", the test points the
// proxy at broker B and stops A (SIGTERM: close 1012, fault 2114, read=<n>). Requests leave
// at a steady pace throughout; the last line is a JSON summary the test checks: every
// request answered once with its own body, none failed, the Channel resumed.
import { Client } from "../dist/index.js";

const url = process.env.ASBP_URL;
if (!url) throw new Error("ASBP_URL is required");
// A backoff of a minute: a resume that waited for it would fail the test's deadline.
const client = new Client(`${url}/asbp`, { backoff: { initial: 60_000, max: 60_000 } });
let resumedAt = -1;
let newChannel = false;
client.on("channel", (channel) => {
  if (channel.resumed) resumedAt = sent;
  else if (sent > 0) newChannel = true;
});
let sent = 0;
const answers = new Map();
const failures = [];
const ask = (n) =>
  client.request("echo", String(n), { timeout: 30_000 }).then(
    (answer) => {
      if (answers.has(n)) failures.push(`${n}: answered twice`);
      answers.set(n, answer.text());
    },
    (error) => failures.push(`${n}: ${error}`),
  );

await client.connect();
await client.request("echo", "warm", { timeout: 30_000 });
console.log("ready");
const pending = [];
const deadline = Date.now() + 60_000;
// At most 100 awaiting an answer (the broker allows 256 per Channel: max_in_flight).
let inFlight = 0;
const paced = (n) => {
  inFlight += 1;
  return ask(n).finally(() => (inFlight -= 1));
};
while ((resumedAt < 0 || sent < resumedAt + 300) && Date.now() < deadline) {
  for (let k = 0; k < 5 && inFlight < 100; k++) pending.push(paced(sent++));
  await new Promise((resolve) => setTimeout(resolve, 1)); // the pace of sending, not a wait
}
await Promise.all(pending);
let wrong = 0;
for (const [n, body] of answers) if (body !== String(n)) wrong += 1;
console.log(JSON.stringify({ sent, answered: answers.size, wrong, failures: failures.slice(0, 10), failed: failures.length, resumedAt, newChannel }));
client.close();
