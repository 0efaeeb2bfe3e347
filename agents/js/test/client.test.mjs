// The Client's state machine against a real broker: pytest (tests/browser/test_node.py)
// starts one and passes its address in ASBP_URL. Built-ins only (asbp.ping, messaging),
// so no agent is needed. Node 20 needs --experimental-websocket for a global WebSocket.
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { Client, ConnectionLost, FaultError, MAX_QUEUED, TimeoutError, ProtocolError } from "../dist/index.js";

const URL_ = process.env.ASBP_URL;
assert.ok(URL_, "ASBP_URL (the broker's http://host:port) is required: pytest tests/browser sets it");
const broker = new URL(URL_);

function states(client) {
  const seen = [];
  client.on("state", (s) => seen.push(s));
  return seen;
}

/** A proxy that refuses WebSocket upgrades and forwards plain HTTP (a hostile corporate proxy). */
async function refusingProxy() {
  const server = net.createServer((client) => {
    client.once("data", (head) => {
      if (/^upgrade:\s*websocket/im.test(head.toString("latin1"))) {
        client.end("HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
      }
      const upstream = net.connect(Number(broker.port), broker.hostname, () => {
        upstream.write(head);
        client.pipe(upstream).pipe(client);
      });
      upstream.on("error", () => client.destroy());
      client.on("error", () => upstream.destroy());
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return server;
}

test("connecting, then open on a WebSocket; close fails what is in flight", async () => {
  const client = new Client(`${URL_}/asbp`);
  const seen = states(client);
  await client.connect();
  assert.deepEqual(seen, ["connecting", "open"]);
  assert.equal(client.transport, "websocket");
  assert.match(client.channelId, /^[0-9a-f]{32}$/);
  const pong = await client.request("asbp.ping", "hi");
  assert.equal(pong.name, "asbp.pong");
  assert.equal(pong.text(), "hi");
  const pending = client.poll("/nothing/here", { wait: 5 });
  client.close();
  await assert.rejects(pending, ConnectionLost);
  assert.equal(client.state, "closed");
});

test("faults are typed errors with their code", async () => {
  const client = new Client(`${URL_}/asbp`);
  await client.connect();
  await assert.rejects(client.request("nobody.serves.this"), (e) => e instanceof FaultError && e.code === 2101);
  await assert.rejects(client.subscribe("(", {}), (e) => e instanceof FaultError && e.code === 2001);
  assert.throws(() => client.send("it's"), (e) => e instanceof ProtocolError && e.code === 1203);
  client.close();
});

test("a timeout and an AbortSignal end a request, and its u is used again", async () => {
  const client = new Client(`${URL_}/asbp`);
  await client.connect();
  // A poll with wait holds its answer back: nothing else does without an agent.
  await assert.rejects(client.poll("/q/empty", { wait: 5, timeout: 50 }), TimeoutError);
  const controller = new AbortController();
  const aborted = client.poll("/q/empty2", { wait: 5, signal: controller.signal });
  controller.abort(new Error("changed my mind"));
  await assert.rejects(aborted, /changed my mind/);
  assert.equal((await client.request("asbp.ping")).name, "asbp.pong");
  client.close();
});

test("falls back to long-poll when the upgrade is refused, and works there", async () => {
  const proxy = await refusingProxy();
  const client = new Client(`http://127.0.0.1:${proxy.address().port}/asbp`);
  const seen = states(client);
  try {
    await client.connect();
    assert.deepEqual(seen, ["connecting", "long-poll"]);
    assert.equal(client.transport, "long-poll");
    assert.equal((await client.request("asbp.ping", "lp")).text(), "lp");
    const subscription = await client.subscribe("/lp/.*");
    await client.publish("/lp/one", "first");
    for await (const notification of subscription) {
      assert.equal(notification.text(), "first");
      break;
    }
  } finally {
    client.close();
    proxy.close();
  }
});

test("goes back to a WebSocket from long-poll when one opens", async () => {
  // The first WebSocket attempt is refused by a proxy; the later ones reach the broker.
  let refused = 0;
  const server = net.createServer((client) => {
    client.once("data", (head) => {
      if (/^upgrade:\s*websocket/im.test(head.toString("latin1")) && refused++ === 0) {
        client.end("HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        return;
      }
      const upstream = net.connect(Number(broker.port), broker.hostname, () => {
        upstream.write(head);
        client.pipe(upstream).pipe(client);
      });
      upstream.on("error", () => client.destroy());
      client.on("error", () => upstream.destroy());
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = new Client(`http://127.0.0.1:${server.address().port}/asbp`, { upgradeInterval: 100 });
  const seen = states(client);
  const channels = [];
  client.on("channel", (c) => channels.push(c));
  try {
    await client.connect();
    const upgraded = new Promise((resolve) => client.on("state", (s) => s === "open" && resolve()));
    await upgraded;
    assert.deepEqual(seen, ["connecting", "long-poll", "open"]);
    assert.deepEqual(channels.map((c) => [c.transport, c.resumed]), [["long-poll", false], ["websocket", false]]);
    assert.equal((await client.request("asbp.ping", "ws")).text(), "ws");
  } finally {
    client.close();
    server.close();
  }
});

test("reconnects with full-jitter exponential backoff while nothing answers", async () => {
  // A port with nothing behind it: every attempt fails at once.
  const probe = net.createServer();
  await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const port = probe.address().port;
  await new Promise((resolve) => probe.close(resolve));
  const draws = [];
  const delays = [];
  const realSetTimeout = globalThis.setTimeout;
  const client = new Client(`http://127.0.0.1:${port}/asbp`, {
    backoff: { initial: 10, max: 40 },
    random: () => {
      draws.push(1);
      return 0.5;
    },
  });
  const seen = states(client);
  // Watch the delays the client asks for (the retry timer is the only one it sets
  // with a delay below the open timeout while reconnecting).
  globalThis.setTimeout = (fn, ms, ...rest) => {
    if (client.state === "reconnecting" && ms < 1000) delays.push(ms);
    return realSetTimeout(fn, ms, ...rest);
  };
  try {
    client.connect().catch(() => {});
    await new Promise((resolve) => {
      const stop = client.on("state", () => draws.length >= 5 && (stop(), resolve()));
    });
  } finally {
    globalThis.setTimeout = realSetTimeout;
    client.close();
  }
  assert.deepEqual(delays.slice(0, 5), [5, 10, 20, 20, 20]);
  assert.equal(seen[0], "connecting");
  assert.ok(seen.includes("reconnecting"));
});

test("Command-Identifiers wrap after 65535", async () => {
  const client = new Client(`${URL_}/asbp`);
  await client.connect();
  client.nextId = 65535;
  const [last, first] = await Promise.all([client.request("asbp.ping", "a"), client.request("asbp.ping", "b")]);
  assert.equal(last.get("u"), "65535");
  assert.equal(first.get("u"), "0");
  client.close();
});

test("Commands wait for a Channel in a bounded queue, and leave it when abandoned", async () => {
  const client = new Client(`${URL_}/asbp`); // not connected yet
  await assert.rejects(client.request("asbp.ping", "late", { timeout: 20 }), TimeoutError);
  assert.equal(client.outbox.length, 0, "the timed-out request left the queue");
  for (let n = 0; n < MAX_QUEUED; n++) client.send("asbp.ping");
  assert.throws(() => client.send("asbp.ping"), (e) => e.code === 2105);
  await assert.rejects(client.request("asbp.ping"), (e) => e.code === 2105);
  client.outbox.length = 0;
  await client.connect();
  assert.equal((await client.request("asbp.ping", "now")).text(), "now");
  client.close();
});

/**
 * A proxy to the broker that can stop passing the broker's frames on (they are sent,
 * and logged, but never arrive: `swallow(true)`) and then cut every connection
 * (`cut()`), as a network would. `swallowed()` counts the whole WebSocket frames held
 * back (the broker's are unmasked; their payload may be compressed, so frames are
 * counted, not read).
 */
async function swallowingProxy() {
  let swallowing = false;
  let held = Buffer.alloc(0);
  const swallowed = () => {
    let at = 0;
    let count = 0;
    while (at + 2 <= held.length) {
      let length = held[at + 1] & 0x7f;
      let header = 2;
      if (length === 126) {
        if (at + 4 > held.length) break;
        length = held.readUInt16BE(at + 2);
        header = 4;
      }
      if (at + header + length > held.length) break;
      at += header + length;
      count += 1;
    }
    return count;
  };
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(broker.port), broker.hostname);
    sockets.add(client);
    sockets.add(upstream);
    client.on("data", (data) => upstream.write(data));
    upstream.on("data", (data) => {
      if (swallowing) held = Buffer.concat([held, data]);
      else client.write(data);
    });
    upstream.on("error", () => client.destroy());
    client.on("error", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
    client.on("close", () => upstream.destroy());
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}/asbp`,
    swallow(on) {
      swallowing = on;
      held = Buffer.alloc(0);
    },
    /** Resolves once `count` frames were held back (the broker sent them). */
    async swallowed(count) {
      while (swallowed() < count) await new Promise((resolve) => setImmediate(resolve));
    },
    cut() {
      swallowing = false;
      for (const socket of sockets) socket.destroy();
      sockets.clear();
    },
    close() {
      server.close();
    },
  };
}

test("resumes its WebSocket Channel after the connection drops, and gets what it missed once", async () => {
  const proxy = await swallowingProxy();
  const client = new Client(proxy.url, { backoff: { initial: 10, max: 50 } });
  const channels = [];
  const commands = [];
  client.on("channel", (c) => channels.push(c));
  client.on("command", (c) => commands.push(c));
  try {
    await client.connect();
    const first = client.channelId;
    assert.equal((await client.request("asbp.ping", "before")).text(), "before");
    proxy.swallow(true);
    for (const n of [1, 2, 3]) client.send("asbp.ping", `missed-${n}`, { u: 60000 + n });
    // Wait until the broker has answered all three (its frames reach the proxy).
    await proxy.swallowed(3);
    const resumed = new Promise((resolve) => client.on("channel", (c) => c.resumed && resolve(c)));
    proxy.cut();
    await resumed;
    assert.equal(client.channelId, first);
    assert.equal((await client.request("asbp.ping", "after")).text(), "after");
    // The three answers nobody awaited any more, once each, in order, before "after".
    assert.deepEqual(commands.map((c) => c.text()), ["missed-1", "missed-2", "missed-3"]);
    assert.deepEqual(channels.map((c) => c.resumed), [false, true]);
  } finally {
    client.close();
    proxy.close();
  }
});

test("a queue delivery is not counted: after a resume its queue delivers it again", async () => {
  const proxy = await swallowingProxy();
  const client = new Client(proxy.url, { backoff: { initial: 10, max: 50 } });
  const publisher = new Client(`${URL_}/asbp`);
  const queue = `jobs-${Math.random().toString(36).slice(2)}`;
  const jobs = [];
  let jobNext;
  try {
    await Promise.all([client.connect(), publisher.connect()]);
    await client.subscribe(queue, {
      type: "QUEUE",
      callback: (notification) => {
        jobs.push(notification);
        jobNext?.();
      },
    });
    const delivered = new Promise((resolve) => (jobNext = resolve));
    await publisher.publish(queue, "job", { type: "QUEUE" });
    await delivered; // and never acknowledged
    proxy.swallow(true);
    // The answer is logged (the delivery before it was not): the count must agree.
    const inFlight = client.request("asbp.ping", "in flight", { timeout: 10_000 });
    await proxy.swallowed(1);
    const again = new Promise((resolve) => (jobNext = resolve));
    const resumed = new Promise((resolve) => client.on("channel", (c) => c.resumed && resolve(c)));
    proxy.cut();
    await resumed;
    assert.equal((await inFlight).text(), "in flight");
    await again;
    assert.deepEqual(jobs.map((j) => j.text()), ["job", "job"]);
    assert.notEqual(jobs[1].get("receipt"), jobs[0].get("receipt"));
    assert.equal((await client.ack(queue, jobs[1].get("receipt"))).get("count"), "1");
  } finally {
    client.close();
    publisher.close();
    proxy.close();
  }
});

test("a resumed Channel keeps its subscriptions and its requests in flight", async () => {
  const proxy = await swallowingProxy();
  const client = new Client(proxy.url, { backoff: { initial: 10, max: 50 } });
  const publisher = new Client(`${URL_}/asbp`);
  const sent = [];
  const request = client.request.bind(client);
  client.request = (name, ...rest) => {
    sent.push(name);
    return request(name, ...rest);
  };
  const heard = [];
  let heardNext;
  try {
    await Promise.all([client.connect(), publisher.connect()]);
    const first = client.channelId;
    await client.subscribe("/kept/.*", {
      callback: (notification) => {
        heard.push(notification.text());
        heardNext?.();
      },
    });
    proxy.swallow(true);
    // Answered and published while its frames cannot reach it: the answer and the
    // notification are logged for the Channel, then the connection is cut.
    const inFlight = client.request("asbp.ping", "in flight", { timeout: 10_000 });
    await publisher.publish("/kept/a", "while away");
    await proxy.swallowed(2);
    const resumed = new Promise((resolve) => client.on("channel", (c) => c.resumed && resolve(c)));
    sent.length = 0;
    proxy.cut();
    await resumed;
    assert.equal(client.channelId, first);
    // The request was not failed: its answer came with the replay.
    assert.equal((await inFlight).text(), "in flight");
    if (heard.length < 1) await new Promise((resolve) => (heardNext = resolve));
    assert.deepEqual(heard, ["while away"]);
    // The broker kept the subscription (kept=...,subscriptions): not sent again.
    assert.deepEqual(sent, []);
    const next = new Promise((resolve) => (heardNext = resolve));
    await publisher.publish("/kept/b", "after");
    await next;
    assert.deepEqual(heard, ["while away", "after"]);
  } finally {
    client.close();
    publisher.close();
    proxy.close();
  }
});
