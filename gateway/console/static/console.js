// The broker console: polls the management API (/api/v1) and /metrics every
// two seconds, keeps the last five minutes of samples in memory and draws them
// on canvases. No library and no CDN: everything it needs is in this file.
"use strict";

const PERIOD_MS = 2000;
const KEEP = 150; // samples: five minutes at one every two seconds
const series = { channels: [], commands: [], faults: [] };
let previous = null; // the last counter totals, for rates

function token() {
  return sessionStorage.getItem("asbp-token") || "";
}

async function api(method, path, json) {
  const headers = {};
  if (token()) headers.Authorization = "Bearer " + token();
  const init = { method, headers };
  if (json !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(json);
  }
  const response = await fetch("/api/v1" + path, init);
  const body = await response.json();
  if (!response.ok) throw new Error(`${response.status}: ${body.detail}`);
  return body;
}

// The sum of every sample of a counter family in the Prometheus text format.
function total(text, name) {
  let sum = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith(name + "{") || line.startsWith(name + " ")) {
      sum += Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return sum;
}

function push(name, value) {
  const points = series[name];
  points.push(value);
  if (points.length > KEEP) points.shift();
  draw(document.getElementById("chart-" + name), points);
}

function draw(canvas, points) {
  const context = canvas.getContext("2d");
  const { width, height } = canvas;
  context.clearRect(0, 0, width, height);
  const top = Math.max(1, ...points);
  context.fillStyle = "#5b6475";
  context.font = "11px sans-serif";
  context.fillText(top.toFixed(top < 10 ? 1 : 0), 4, 12);
  context.strokeStyle = "#2f6fde";
  context.lineWidth = 2;
  context.beginPath();
  points.forEach((value, index) => {
    const x = (index / (KEEP - 1)) * width;
    const y = height - 4 - (value / top) * (height - 20);
    if (index === 0) context.moveTo(x, y);
    else context.lineTo(x, y);
  });
  context.stroke();
  canvas.dataset.points = String(points.length);
  canvas.dataset.last = String(points[points.length - 1]);
}

function cell(row, text, number) {
  const td = row.insertCell();
  td.textContent = String(text);
  if (number) td.className = "number";
  return td;
}

function showSummary(broker) {
  document.getElementById("broker").textContent = broker.broker;
  const summary = document.getElementById("summary");
  summary.replaceChildren();
  for (const [label, value] of [
    ["version", broker.version], ["engine", broker.engine],
    ["uptime", Math.round(broker.uptime_seconds) + " s"], ["Channels", broker.channels],
    ["Tubes", broker.tubes], ["Subjects", broker.subjects], ["in flight", broker.in_flight],
  ]) {
    const div = document.createElement("div");
    div.textContent = `${label}: ${value}`;
    summary.append(div);
  }
}

// Every broker of the bus when the plane is on Redis, this one first.
function showBrokers(bus) {
  document.getElementById("scope").textContent =
    bus.scope === "bus" ? "(the whole bus)" : "(this broker)";
  const body = document.querySelector("#brokers tbody");
  body.replaceChildren();
  for (const broker of bus.brokers) {
    const row = body.insertRow();
    row.dataset.broker = broker.broker;
    cell(row, broker.broker);
    cell(row, broker.version);
    cell(row, broker.engine);
    cell(row, Math.round(broker.uptime_seconds) + " s", true);
    cell(row, broker.channels, true).className = "number channels";
    cell(row, broker.tubes, true).className = "number tubes";
    cell(row, broker.subjects, true);
    cell(row, broker.in_flight, true);
  }
}

function showAgents(agents) {
  const body = document.querySelector("#agents tbody");
  body.replaceChildren();
  for (const agent of agents.items) {
    for (const tube of agent.tubes) {
      const row = body.insertRow();
      cell(row, agent.agent);
      cell(row, agent.broker);
      cell(row, tube.id);
      cell(row, tube.serves.join(" "));
      cell(row, tube.in_flight, true);
    }
    if (agent.tubes.length === 0) {
      // Another broker of the bus: its Tube count only (from its census card).
      const row = body.insertRow();
      cell(row, agent.agent);
      cell(row, agent.broker);
      cell(row, `(${agent.tube_count} Tubes)`);
      cell(row, "");
      cell(row, "", true);
    }
  }
}

function showQueues(queues) {
  const body = document.querySelector("#queues tbody");
  body.replaceChildren();
  for (const queue of queues.items) {
    const row = body.insertRow();
    row.dataset.queue = queue.name;
    cell(row, queue.name);
    cell(row, queue.depth, true).className = "number depth";
    cell(row, queue.consumers, true);
    const age = queue.oldest_age_seconds;
    cell(row, age === null ? "-" : age.toFixed(1) + " s", true).className = "number oldest";
    cell(row, queue.dead_letters, true).className = "number dead";
    const actions = row.insertCell();
    actions.append(
      action("Peek", () => look(queue.name, "messages")),
      action("Purge", () => purge(queue.name)),
    );
    if (queue.dead_letters > 0) {
      actions.append(
        action("Dead letters", () => look(queue.name, "dead-letters")),
        action("Move back", () => requeue(queue.name)),
      );
    }
  }
}

function action(label, run) {
  const button = document.createElement("button");
  button.textContent = label;
  button.addEventListener("click", run);
  return button;
}

function queuePath(name) {
  return "/queues/" + encodeURIComponent(name);
}

// The next messages of a queue (or its dead letters), leasing none: shown until
// the next look, not refreshed with the tables.
async function look(name, what) {
  try {
    const page = await api("GET", queuePath(name) + "/" + what + "?limit=50");
    const panel = document.getElementById("peek");
    panel.hidden = false;
    panel.dataset.queue = name;
    panel.dataset.what = what;
    document.getElementById("peek-title").textContent =
      (what === "messages" ? "Next messages of " : "Dead letters of ") + name;
    const body = panel.querySelector("tbody");
    body.replaceChildren();
    for (const message of page.items) {
      const row = body.insertRow();
      cell(row, message.id);
      cell(row, message.priority, true);
      cell(row, message.deliveries, true);
      cell(row, message.payload_bytes, true);
      cell(row, message.payload).className = "payload";
    }
  } catch (error) {
    fail(error);
  }
}

async function requeue(name) {
  if (!confirm(`Move the dead letters of ${name} back into it?`)) return;
  try {
    await api("POST", queuePath(name) + "/dead-letters/requeue", {});
    await refresh();
  } catch (error) {
    fail(error);
  }
}

async function purge(name) {
  if (!confirm(`Remove the messages ready in ${name}?`)) return;
  try {
    await api("POST", queuePath(name) + "/purge");
    await refresh();
  } catch (error) {
    fail(error);
  }
}

function fail(error) {
  const box = document.getElementById("error");
  box.textContent = String(error.message || error);
  box.hidden = false;
}

async function refresh() {
  try {
    const [bus, agents, queues] = await Promise.all([
      api("GET", "/broker"), api("GET", "/agents"), api("GET", "/queues?limit=50"),
    ]);
    const broker = bus.brokers[0];
    showSummary(broker);
    showBrokers(bus);
    showAgents(agents);
    showQueues(queues);
    push("channels", broker.channels);
    const metrics = await fetch("/metrics");
    if (metrics.ok) {
      const text = await metrics.text();
      const now = { at: Date.now(), commands: total(text, "asbp_commands_total"),
                    faults: total(text, "asbp_faults_total") };
      if (previous !== null) {
        const seconds = Math.max(0.001, (now.at - previous.at) / 1000);
        push("commands", Math.max(0, now.commands - previous.commands) / seconds);
        push("faults", Math.max(0, now.faults - previous.faults) / seconds);
      }
      previous = now;
    }
    document.getElementById("error").hidden = true;
  } catch (error) {
    fail(error);
  }
}

// Back from the identity provider (gateway/console/oidc.py): the access token
// comes in the fragment, which no server sees; keep it for this tab only and
// take it out of the address bar and the history.
if (location.hash.startsWith("#access_token=")) {
  sessionStorage.setItem("asbp-token",
    decodeURIComponent(location.hash.slice("#access_token=".length)));
  history.replaceState(null, "", location.pathname + location.search);
}

// Offer the identity provider's sign-in when the broker has one configured.
fetch("auth.json").then((response) => (response.ok ? response.json() : { oidc: false }))
  .then((auth) => { document.getElementById("oidc-sign-in").hidden = !auth.oidc; })
  .catch(() => {});

document.getElementById("sign-in").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem("asbp-token", document.getElementById("token").value);
  refresh();
});
refresh();
setInterval(refresh, PERIOD_MS);
