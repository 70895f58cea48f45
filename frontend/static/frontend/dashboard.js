// Switchyard dashboard: one websocket, per-second documents from every router, plotly charts.
// Keeps at most WINDOW_S seconds of points; reconnects with backoff and backfills on (re)connect.
(function () {
  "use strict";
  const WINDOW_S = 600;
  const body = document.body;
  const status = document.getElementById("live-status");
  const docs = new Map(); // "router|second" -> document
  let dirty = true; // draw the (empty) axes at once
  let retry = 500;
  let socket = null;

  function setStatus(state, text) { status.dataset.state = state; status.textContent = text; }

  function add(doc) {
    docs.set(doc.router + "|" + Math.floor(doc.ts), doc);
    dirty = true;
  }

  function prune() {
    const since = Date.now() / 1000 - WINDOW_S;
    for (const [key, doc] of docs) if (doc.ts < since) docs.delete(key);
  }

  function connect() {
    const scheme = location.protocol === "https:" ? "wss://" : "ws://";
    const tenant = body.dataset.wsTenant;
    const url = scheme + location.host + "/ws/live/" + (tenant ? "?tenant=" + encodeURIComponent(tenant) : "");
    const ws = new WebSocket(url);
    socket = ws;
    ws.onopen = () => { retry = 500; setStatus("live", "live"); };
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "backfill") { docs.clear(); message.docs.forEach(add); render(); }
      else if (message.type === "live") add(message.doc);
    };
    ws.onclose = (event) => {
      if (event.code === 4401 || event.code === 4403) { setStatus("down", "not allowed"); return; }
      setStatus("down", "reconnecting…");
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }

  // --- per-second series -------------------------------------------------------------------
  function seconds() {
    const bySecond = new Map();
    for (const doc of docs.values()) {
      const s = Math.floor(doc.ts);
      if (!bySecond.has(s)) bySecond.set(s, []);
      bySecond.get(s).push(doc);
    }
    return [...bySecond.entries()].sort((a, b) => a[0] - b[0]);
  }
  const when = (s) => new Date(s * 1000);
  const sum = (rows, f) => rows.reduce((acc, r) => acc + (f(r) || 0), 0);
  const rowsOf = (group) => group.flatMap((d) => d.rows);
  function classes() {
    const out = {};
    for (const doc of docs.values()) Object.assign(out, doc.classes || {});
    return out;
  }
  function latestPerRouter() {
    const latest = new Map();
    for (const doc of docs.values()) {
      const seen = latest.get(doc.router);
      if (!seen || seen.ts < doc.ts) latest.set(doc.router, doc);
    }
    return [...latest.values()];
  }

  // --- charts ------------------------------------------------------------------------------
  function layout(extra) {
    const fg = getComputedStyle(body).color;
    const grid = { gridcolor: "rgba(128,128,128,.2)", zerolinecolor: "rgba(128,128,128,.4)" };
    const base = {
      margin: { l: 48, r: 12, t: 8, b: 36 }, paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)", font: { color: fg, size: 12 },
      legend: { orientation: "h", y: -0.18 }, xaxis: Object.assign({ type: "date" }, grid),
      yaxis: Object.assign({ rangemode: "tozero" }, grid),
    };
    const merged = Object.assign(base, extra || {});
    for (const axis of ["xaxis", "yaxis", "yaxis2"]) {
      if (extra && extra[axis]) merged[axis] = Object.assign({}, grid, base[axis] || {}, extra[axis]);
    }
    return merged;
  }
  function draw(id, traces, extra) {
    const el = document.getElementById(id);
    if (el && window.Plotly) Plotly.react(el, traces, layout(extra), { displayModeBar: false, responsive: true });
  }
  const line = (name, x, y, more) => Object.assign({ name, x, y, type: "scatter", mode: "lines" }, more || {});

  function perClass(groups, pick) {
    const names = new Set();
    groups.forEach(([, g]) => rowsOf(g).forEach((r) => r.ttft_ms && r.class !== undefined && names.add(r.class)));
    const traces = [];
    const slo = classes();
    const xs = groups.map(([s]) => when(s));
    for (const name of names) {
      const p50 = [], p95 = [];
      for (const [, g] of groups) {
        const rows = rowsOf(g).filter((r) => r.class === name && r.ttft_ms);
        const n = sum(rows, (r) => r.requests);
        p50.push(rows.length ? sum(rows, (r) => r.ttft_ms.p50 * r.requests) / n : null);
        p95.push(rows.length ? Math.max(...rows.map((r) => r.ttft_ms.p95)) : null);
      }
      const label = name || "(no class)";
      if (pick.p50) traces.push(line(label + " p50", xs, p50, { connectgaps: false }));
      traces.push(line(label + " p95", xs, p95, { connectgaps: false }));
      if (slo[name] && xs.length) {
        traces.push(line(label + " SLO", [xs[0], xs[xs.length - 1]],
          [slo[name].ttft_slo_ms, slo[name].ttft_slo_ms], { line: { dash: "dash", width: 1 } }));
      }
    }
    return traces;
  }

  function render() {
    if (!dirty) return;
    dirty = false;
    prune();
    const groups = seconds();
    const xs = groups.map(([s]) => when(s));
    const page = body.dataset.page;
    if (page === "traffic" || page === "tenant") {
      draw("chart-ttft", perClass(groups, { p50: page === "traffic" }), { yaxis: { title: "ms", rangemode: "tozero" } });
    }
    draw("chart-rate", [
      line("requests/s", xs, groups.map(([, g]) => sum(rowsOf(g), (r) => r.requests))),
      line("errors/s", xs, groups.map(([, g]) => sum(rowsOf(g), (r) => r.errors))),
      line("429/s", xs, groups.map(([, g]) => sum(rowsOf(g), (r) => r.throttled))),
    ]);
    draw("chart-usage", [
      line("requests/s", xs, groups.map(([, g]) => sum(rowsOf(g), (r) => r.requests))),
      line("tokens/s", xs, groups.map(([, g]) => sum(rowsOf(g), (r) => r.tokens_in + r.tokens_out)), { yaxis: "y2" }),
    ], { yaxis2: { overlaying: "y", side: "right", rangemode: "tozero" }, margin: { l: 48, r: 56, t: 8, b: 36 } });
    if (page === "stages") {
      const stage = (name) => groups.map(([, g]) => {
        const rows = rowsOf(g).filter((r) => r.stages_ms && r.stages_ms[name] !== null);
        const n = sum(rows, (r) => r.requests);
        return n ? sum(rows, (r) => r.stages_ms[name] * r.requests) / n : null;
      });
      draw("chart-stages", ["gateway", "queue", "upstream_ttft", "stream"].map((name) =>
        ({ name, x: xs, y: stage(name), type: "bar" })), { barmode: "stack", yaxis: { title: "ms" } });
    }
    if (page === "tenants") renderTenants(groups, xs);
    if (page === "fleet") renderFleet(groups, xs);
  }

  function renderTenants(groups, xs) {
    const tenants = new Set();
    groups.forEach(([, g]) => rowsOf(g).forEach((r) => tenants.add(r.tenant)));
    draw("chart-tenants", [...tenants].map((t) => ({
      name: t || "(unauthenticated)", x: xs, type: "scatter", mode: "lines", stackgroup: "one",
      y: groups.map(([, g]) => sum(rowsOf(g).filter((r) => r.tenant === t), (r) => r.requests)),
    })));
    const pools = new Set();
    groups.forEach(([, g]) => g.forEach((d) => d.pools.forEach((p) => pools.add(p.pool))));
    draw("chart-jain", [...pools].map((pool) => line(pool, xs, groups.map(([, g]) => {
      const views = g.flatMap((d) => d.pools).filter((p) => p.pool === pool);
      return views.length ? Math.min(...views.map((p) => p.jain)) : null;
    }))), { yaxis: { range: [0, 1.05] } });
    const throttled = {};
    const minute = Date.now() / 1000 - 60;
    for (const doc of docs.values()) if (doc.ts >= minute) doc.rows.forEach((r) => {
      throttled[r.tenant] = (throttled[r.tenant] || 0) + r.throttled;
    });
    const rows = [];
    for (const doc of latestPerRouter()) for (const p of doc.pools) {
      const names = new Set([...Object.keys(p.entitled_share), ...Object.keys(p.served_share)]);
      for (const t of names) rows.push([p.pool, t, pct(p.entitled_share[t]), pct(p.served_share[t]), throttled[t] || 0]);
    }
    fillTable("table-shares", rows, 5);
  }

  function renderFleet(groups, xs) {
    const inflight = [], capacity = [];
    for (const [, g] of groups) {
      const eps = g.flatMap((d) => d.endpoints);
      inflight.push(sum(eps, (e) => e.inflight));
      capacity.push(g.length ? sum(g[0].endpoints, (e) => e.capacity) : 0);
    }
    draw("chart-inflight", [line("in flight", xs, inflight), line("capacity", xs, capacity, { line: { dash: "dash" } })]);
    const queues = new Map();
    groups.forEach(([, g], i) => g.forEach((d) => d.pools.forEach((p) => Object.entries(p.queued).forEach(([band, n]) => {
      const key = p.pool + " band " + band;
      if (!queues.has(key)) queues.set(key, new Array(groups.length).fill(0));
      queues.get(key)[i] += n;
    }))));
    const queued = [...queues].map(([name, y]) => line(name, xs, y));
    draw("chart-queue", queued.length ? queued : [line("queued", xs, xs.map(() => 0))]);
    const endpoints = new Map();
    for (const doc of latestPerRouter()) for (const e of doc.endpoints) {
      const seen = endpoints.get(e.id);
      endpoints.set(e.id, seen ? Object.assign({}, e, { inflight: seen.inflight + e.inflight }) : e);
    }
    fillTable("table-endpoints", [...endpoints.values()].sort((a, b) => a.id - b.id).map((e) => [
      e.id, e.pool, e.model, e.version, e.state, e.healthy ? "yes" : "no",
      e.kv_usage === null ? "—" : pct(e.kv_usage), e.inflight + " / " + e.capacity]), 8);
  }

  const pct = (v) => (v === undefined || v === null ? "—" : (100 * v).toFixed(1) + "%");
  function fillTable(id, rows, cols) {
    const tbody = document.querySelector("#" + id + " tbody");
    if (!tbody) return;
    tbody.replaceChildren(...(rows.length ? rows : [["no data yet"]]).map((cells) => {
      const tr = document.createElement("tr");
      cells.forEach((c) => { const td = document.createElement("td"); td.textContent = String(c); tr.append(td); });
      if (cells.length === 1) tr.firstChild.colSpan = cols;
      return tr;
    }));
  }

  // For tests and the console: how many documents are held, and whose rows they carry.
  window.switchyardDashboard = {
    documents: () => docs.size,
    drop: () => socket && socket.close(), // a lost connection: reconnects and backfills
    tenants: () => [...new Set([...docs.values()].flatMap((d) => d.rows.map((r) => r.tenant)))].sort(),
  };
  // light/dark follows the system; redraw with the new colours when it changes
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => { dirty = true; render(); });
  connect();
  setInterval(render, 1000);
})();
