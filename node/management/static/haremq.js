// HareMQ's live view: polls the management API every second and redraws; no build step.
"use strict";

const POLL_MS = 1000;
const HISTORY_MS = 10 * 60 * 1000;
const $ = (id) => document.getElementById(id);
const history = [];          // {t, publish, deliver, ack} from /api/overview
let auth = sessionStorage.getItem("haremq-auth");
let timer = null;

function text(value) {
  return value === null || value === undefined ? "" : String(value);
}

function cell(row, value, cls) {
  const td = document.createElement("td");
  td.textContent = text(value);
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

async function api(path) {
  const response = await fetch("api/" + path, {headers: {"Authorization": "Basic " + auth}});
  if (response.status === 401) {
    const body = await response.json().catch(() => ({}));
    throw Object.assign(new Error(body.reason || "not authorised"), {status: 401});
  }
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

function showLogin(message) {
  $("login").hidden = false;
  $("view").hidden = true;
  $("logout").hidden = true;
  $("status").textContent = "not signed in";
  $("login-error").textContent = message || "";
}

function showView() {
  $("login").hidden = true;
  $("view").hidden = false;
  $("logout").hidden = false;
}

function drawNodes(nodes) {
  const body = $("nodes").tBodies[0];
  body.replaceChildren();
  for (const node of nodes) {
    const state = !node.running ? "down" : (node.paused ? "paused" : "up");
    const row = body.insertRow();
    row.dataset.node = node.name;
    row.dataset.state = state;
    if (state === "down") row.className = "down";
    cell(row, node.name);
    cell(row, state, "state-" + state);
    cell(row, (node.alarms || []).join(", ") || "none", (node.alarms || []).length ? "bad" : "");
    cell(row, node.mem_used ? Math.round(node.mem_used / 1048576) + " MiB" : "", "num");
    cell(row, node.raft_leader ? "leader" : (node.raft ? node.raft.role : ""));
  }
}

function drawQueues(queues) {
  const body = $("queues").tBodies[0];
  body.replaceChildren();
  for (const q of queues) {
    const row = body.insertRow();
    row.dataset.queue = q.name;
    row.dataset.vhost = q.vhost;
    row.dataset.master = q.node || "";
    row.dataset.state = q.state;
    if (q.state !== "running") row.className = "down";
    const stats = q.message_stats || {};
    const sync = Object.entries(q.sync_progress || {}).map(([n, p]) => n + " " + p).join(", ");
    cell(row, q.vhost);
    cell(row, q.name);
    cell(row, q.node + (q.state !== "running" ? " (" + q.state + ")" : ""), q.state === "running" ? "" : "bad");
    cell(row, (q.slave_nodes || []).join(", "));
    cell(row, (q.synchronised_slave_nodes || []).join(", "));
    cell(row, q.epoch, "num");
    cell(row, sync);
    cell(row, q.messages_ready, "num");
    cell(row, q.messages_unacknowledged, "num");
    cell(row, q.consumers, "num");
    cell(row, ((stats.publish_details || {}).rate || 0).toFixed(1), "num");
    cell(row, ((stats.deliver_get_details || {}).rate || 0).toFixed(1), "num");
  }
}

function drawTimeline(events) {
  const list = $("timeline");
  list.replaceChildren();
  for (const e of events.slice().reverse()) {
    const li = document.createElement("li");
    li.className = e.kind;
    li.dataset.kind = e.kind;
    li.textContent = new Date(e.time * 1000).toLocaleTimeString() + "  " + e.text;
    list.appendChild(li);
  }
  if (!events.length) {
    const li = document.createElement("li");
    li.className = "muted";
    li.textContent = "nothing has happened yet: kill a node and watch";
    list.appendChild(li);
  }
}

function drawRates(overview) {
  const s = overview.message_stats || {};
  const now = Date.now();
  history.push({t: now, publish: (s.publish_details || {}).rate || 0,
                deliver: (s.deliver_get_details || {}).rate || 0, ack: (s.ack_details || {}).rate || 0});
  while (history.length && history[0].t < now - HISTORY_MS) history.shift();
  $("rates-now").textContent = "now: " + history[history.length - 1].publish.toFixed(1) + " in, " +
    history[history.length - 1].deliver.toFixed(1) + " out";
  const canvas = $("rates");
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const max = Math.max(1, ...history.map((h) => Math.max(h.publish, h.deliver, h.ack)));
  ctx.fillStyle = "#777";
  ctx.fillText(max.toFixed(0) + "/s", 4, 12);
  for (const [key, colour] of [["publish", "#1565c0"], ["deliver", "#2e7d32"], ["ack", "#8e24aa"]]) {
    ctx.strokeStyle = colour;
    ctx.beginPath();
    history.forEach((h, i) => {
      const x = canvas.width - (now - h.t) / HISTORY_MS * canvas.width;
      const y = canvas.height - 4 - h[key] / max * (canvas.height - 20);
      if (i === 0) ctx.moveTo(x, y); else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}

async function refresh() {
  try {
    const [overview, nodes, queues, events] = await Promise.all(
      [api("overview"), api("nodes").catch(() => null), api("queues"), api("haremq/events")]);
    showView();
    $("cluster").textContent = overview.cluster_name ? "node " + overview.node : "";
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    $("status").dataset.updated = String(Date.now());
    drawNodes(nodes || [{name: overview.node, running: true, alarms: []}]);
    drawQueues(queues);
    drawTimeline(events);
    drawRates(overview);
  } catch (error) {
    if (error.status === 401) {
      stop();
      sessionStorage.removeItem("haremq-auth");
      auth = null;
      showLogin(error.message);
      return;
    }
    $("status").textContent = "cannot reach the node: " + error.message;
    $("status").dataset.error = error.message;
  }
}

function start() {
  stop();
  refresh();
  timer = setInterval(refresh, POLL_MS);
}

function stop() {
  if (timer !== null) clearInterval(timer);
  timer = null;
}

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  auth = btoa(unescape(encodeURIComponent($("user").value + ":" + $("password").value)));
  sessionStorage.setItem("haremq-auth", auth);
  start();
});

$("logout").addEventListener("click", () => {
  stop();
  sessionStorage.removeItem("haremq-auth");
  auth = null;
  showLogin();
});

if (auth) start(); else showLogin();
