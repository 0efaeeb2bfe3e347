// The bundle in Chromium resumes its Channel across a queue delivery it never
// acknowledged (docs/protocol.md, "Resuming a Channel"): it opens with count=2, the
// broker says it back and leaves the delivery out of the log, and the client does not
// count it. Usage: node resume-queue.mjs <base URL, through the test's proxy>.
// Prints "channel <i>" once the job was delivered; the test then cuts the connection,
// routes "away" to the Channel, lets the client back in and writes a line. Prints
// "ok" once "away" arrived once (the count agreed with the log) and the job came
// again from its queue with a new receipt.
import { launch, check, say, nextLine, T } from "../browser.mjs";

const [base] = process.argv.slice(2);
const browser = await launch();
try {
  const page = await browser.newPage();
  await page.goto(`${base}/`); // the demo page: the broker's own origin
  const channelId = await page.evaluate(async () => {
    const { Client } = await import("/asbp.min.js");
    const url = `ws://${location.host}/asbp`;
    // WebSocket only: a failed reconnection must not fall back to a new long-poll Channel.
    const options = { transports: ["websocket"], backoff: { initial: 10, max: 50 } };
    const state = (window.state = { jobs: [], commands: [], resumed: false });
    const client = (window.client = new Client(url, options));
    client.on("command", (command) => state.commands.push(command.text()));
    client.on("channel", (channel) => {
      state.id = channel.id;
      if (channel.resumed) state.resumed = true;
    });
    const publisher = new Client(url, options);
    await Promise.all([client.connect(), publisher.connect()]);
    let delivered;
    const first = new Promise((resolve) => (delivered = resolve));
    await client.subscribe("jobs", {
      type: "QUEUE",
      callback: (job) => {
        state.jobs.push({ text: job.text(), receipt: job.get("receipt") });
        delivered();
      },
    });
    await publisher.publish("jobs", "job", { type: "QUEUE" });
    await first; // and never acknowledged
    publisher.close();
    return state.id;
  });
  say(`channel ${channelId}`);
  await nextLine();
  try {
    await page.waitForFunction(
      () => state.resumed && state.commands.includes("away") && state.jobs.length === 2,
      null,
      { timeout: 30_000 * T },
    );
  } catch (error) {
    say(`not yet: ${await page.evaluate(() => JSON.stringify({ ...state, clientState: client.state }))}`);
    throw error;
  }
  const seen = await page.evaluate(async () => {
    const acked = await client.ack("jobs", state.jobs[1].receipt);
    return { jobs: state.jobs, commands: state.commands, count: acked.get("count"), id: client.channelId };
  });
  check(seen.id === channelId, `the same Channel: ${seen.id}`);
  check(JSON.stringify(seen.commands) === '["away"]', `"away" once, nothing replayed twice: ${seen.commands}`);
  check(seen.jobs.every((job) => job.text === "job"), "the job twice");
  check(seen.jobs[0].receipt !== seen.jobs[1].receipt, "again from its queue, with a new receipt");
  check(seen.count === "1", `the new receipt acknowledges it: count=${seen.count}`);
  say("ok");
} finally {
  await browser.close();
}
