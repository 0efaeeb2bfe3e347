// The demo page's script: the client from asbp.min.js (agents/js, bundled) and the
// page's buttons. Query parameters, for tests: transports=long-poll (or
// websocket,long-poll), backoff=<max ms>, upgrade=<ms>, url=<the broker's /asbp>.
import { Client } from "./asbp.min.js";

const params = new URLSearchParams(location.search);
const $ = (id) => document.getElementById(id);
const client = new Client(params.get("url") ?? "/asbp", {
  transports: params.get("transports")?.split(","),
  backoff: params.has("backoff") ? { initial: 200, max: Number(params.get("backoff")) } : undefined,
  upgradeInterval: params.has("upgrade") ? Number(params.get("upgrade")) : undefined,
  openTimeout: params.has("open") ? Number(params.get("open")) : undefined,
});
const subjects = new Map();
const decoder = new TextDecoder();

function add(list, text, fault = false) {
  const item = document.createElement("li");
  item.textContent = text;
  if (fault) item.className = "fault";
  $(list).append(item);
  return item;
}

const shown = (error) => (error && error.code ? `fault ${error.code}: ${error.message}` : String(error));

client.on("state", (state) => {
  $("state").textContent = state;
  $("state").dataset.state = state;
  $("transport").textContent = client.transport ? `(${client.transport})` : "";
});
client.on("channel", (event) => {
  $("channel").textContent = event.id;
  $("transport").textContent = `(${event.transport})`;
});
client.on("gap", (gap) => add("replies", `new Channel ${gap.current}: ${gap.reason}`));

$("echo-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    const reply = await client.request("echo", $("echo-input").value, { timeout: 10_000 });
    add("replies", `${reply.name}: ${reply.text()}`);
  } catch (error) {
    add("replies", shown(error), true);
  }
});

$("clock").addEventListener("click", async () => {
  const item = add("replies", "clock:");
  try {
    for await (const part of client.stream("clock", undefined, { timeout: 10_000 })) {
      const tick = document.createElement("span");
      tick.className = "part";
      tick.textContent = ` [${part.get("o")}] ${part.text()}`;
      item.append(tick);
    }
    item.append(" (done)");
  } catch (error) {
    item.append(` ${shown(error)}`);
  }
});

async function signIn(name) {
  try {
    const subject = await client.signIn("auth.login", name, { timeout: 10_000 });
    subjects.set(name, subject);
    add("subjects", `${name}: s=${subject.id} roles=${subject.roles.join(",")} p=${subject.address}`);
  } catch (error) {
    add("subjects", `${name}: ${shown(error)}`, true);
  }
}
$("signin-alice").addEventListener("click", () => signIn("alice"));
$("signin-bob").addEventListener("click", () => signIn("bob"));
$("whoami").addEventListener("click", async () => {
  for (const [name, subject] of subjects) {
    try {
      const reply = await subject.request("whoami", undefined, { timeout: 10_000 });
      add("subjects", `whoami as ${name}'s s: ${reply.text()}`);
    } catch (error) {
      add("subjects", `whoami as ${name}: ${shown(error)}`, true);
    }
  }
});

$("subscribe").addEventListener("click", async () => {
  try {
    await client.subscribe("/demo/news", {
      callback: (notification) => add("notifications", decoder.decode(notification.body)),
    });
    $("subscribe").disabled = true;
    $("subscribe").textContent = "Subscribed";
  } catch (error) {
    add("notifications", shown(error), true);
  }
});
$("publish-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  try {
    await client.publish("/demo/news", $("publish-input").value);
  } catch (error) {
    add("notifications", shown(error), true);
  }
});

// For tests and the curious: the client, from the browser's console.
window.asbp = client;
client.connect().catch((error) => add("replies", shown(error), true));
