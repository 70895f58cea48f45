// Switchyard dashboard: one websocket, per-second documents from every router, plotly charts.
// Keeps at most WINDOW_S seconds of points; reconnects with backoff and backfills on (re)connect.
// Operators also get the control document (rollouts, scaling, queued actions) once a second.
(function () {
  "use strict";
  const WINDOW_S = 600;
  const body = document.body;
  const status = document.getElementById("live-status");
  const docs = new Map(); // "router|second" -> document
  let dirty = true; // draw the (empty) axes at once
  let retry = 500;
  let socket = null;
  let control = null; // the latest control document (staff only)

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
      else if (message.type === "control") { control = message.doc; renderControl(); }
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
    const merged = Object.assign({}, base, extra || {}); // base's axes stay intact for the merge below
    for (const axis of ["xaxis", "yaxis", "yaxis2"]) {
      if (extra && extra[axis]) merged[axis] = Object.assign({}, grid, base[axis] || {}, extra[axis]);
    }
    return merged;
  }
  function draw(id, traces, extra) {
    const el = document.getElementById(id);
    if (!el || !window.Plotly) return;
    let more = extra || {};
    if (traces.every((t) => !t.x || t.x.length === 0)) {
      // No points: show the window up to now, not plotly's default date axis (January 2000).
      const now = Date.now();
      const range = [new Date(now - WINDOW_S * 1000), new Date(now)];
      more = Object.assign({}, more, { xaxis: Object.assign({}, more.xaxis || {}, { range }) });
    }
    Plotly.react(el, traces, layout(more), { displayModeBar: false, responsive: true });
  }
  const line = (name, x, y, more) => Object.assign({ name, x, y, type: "scatter", mode: "lines" }, more || {});

  function perClass(groups, pick) {
    const field = pick.field || "ttft_ms";
    const names = new Set();
    groups.forEach(([, g]) => rowsOf(g).forEach((r) => r[field] && r.class !== undefined && names.add(r.class)));
    const traces = [];
    const slo = classes();
    const xs = groups.map(([s]) => when(s));
    for (const name of names) {
      const p50 = [], p95 = [];
      for (const [, g] of groups) {
        const rows = rowsOf(g).filter((r) => r.class === name && r[field]);
        const n = sum(rows, (r) => r.requests);
        p50.push(rows.length ? sum(rows, (r) => r[field].p50 * r.requests) / n : null);
        p95.push(rows.length ? Math.max(...rows.map((r) => r[field].p95)) : null);
      }
      const label = name || "(no class)";
      if (pick.p50) traces.push(line(label + " p50", xs, p50, { connectgaps: false }));
      traces.push(line(label + " p95", xs, p95, { connectgaps: false }));
      if (field === "ttft_ms" && slo[name] && xs.length) {
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
    if (page === "traffic") {
      draw("chart-itl", perClass(groups, { p50: true, field: "itl_ms" }), { yaxis: { title: "ms", rangemode: "tozero" } });
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
    if (page === "rollouts") renderCompare();
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
    // Shares come from the routers' fairness view, which counts only the tenants that had to
    // wait in the pool within the last minute; a tenant served without waiting is listed too.
    const throttled = {};
    const served = new Map(); // "pool|tenant" -> [pool, tenant], from the last minute's rows
    const minute = Date.now() / 1000 - 60;
    for (const doc of docs.values()) if (doc.ts >= minute) doc.rows.forEach((r) => {
      throttled[r.tenant] = (throttled[r.tenant] || 0) + r.throttled;
      if (r.pool && r.tenant && r.requests) served.set(r.pool + "|" + r.tenant, [r.pool, r.tenant]);
    });
    const shares = new Map();
    for (const doc of latestPerRouter()) for (const p of doc.pools) {
      const names = new Set([...Object.keys(p.entitled_share), ...Object.keys(p.served_share)]);
      for (const t of names) {
        shares.set(p.pool + "|" + t, [p.pool, t, pct(p.entitled_share[t]), pct(p.served_share[t])]);
      }
    }
    for (const [key, [pool, t]] of served) {
      if (!shares.has(key)) shares.set(key, [pool, t, "—", "not contending"]);
    }
    const rows = [...shares.values()].sort((a, b) => (a[0] + "|" + a[1]).localeCompare(b[0] + "|" + b[1]))
      .map((row) => [...row, throttled[row[1]] || 0]);
    fillTable("table-shares", rows, 5, docs.size ? "no tenant traffic in the last minute" : "waiting for the routers…");
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
      const adapters = [...new Set([...((seen && seen.adapters) || []), ...(e.adapters || [])])].sort();
      endpoints.set(e.id, seen ? Object.assign({}, e, { inflight: seen.inflight + e.inflight, adapters }) : e);
    }
    fillTable("table-endpoints", [...endpoints.values()].sort((a, b) => a.id - b.id).map((e) => [
      e.id, e.pool, e.model, e.version, e.state, e.healthy ? "yes" : "no",
      e.kv_usage === null ? "—" : pct(e.kv_usage), e.inflight + " / " + e.capacity,
      (e.adapters || []).length ? e.adapters.join(", ") : "—"]), 9,
    docs.size ? "no endpoints in the routers' snapshot" : "waiting for the routers…");
  }

  const pct = (v) => (v === undefined || v === null ? "—" : (100 * v).toFixed(1) + "%");
  function fillTable(id, rows, cols, empty) {
    const tbody = document.querySelector("#" + id + " tbody");
    if (!tbody) return;
    tbody.replaceChildren(...(rows.length ? rows : [[empty]]).map((cells) => {
      const tr = document.createElement("tr");
      cells.forEach((c) => { const td = document.createElement("td"); td.textContent = String(c); tr.append(td); });
      if (cells.length === 1) tr.firstChild.colSpan = cols;
      return tr;
    }));
  }

  // --- rollouts: the control document, and live stable vs candidate from the routers ------
  function cell(text) { const td = document.createElement("td"); td.textContent = String(text); return td; }
  function rowOf(cells, cls) {
    const tr = document.createElement("tr");
    if (cls) tr.className = cls;
    cells.forEach((c) => tr.append(c instanceof Node ? c : cell(c)));
    return tr;
  }
  const actionStates = (() => {
    const el = document.getElementById("action-states");
    return el ? JSON.parse(el.textContent) : {};
  })();

  function renderControl() {
    if (!control) return;
    const page = body.dataset.page;
    if (page === "rollouts") renderRollouts();
    if (page === "scaling") renderScaling(control.scaling);
  }

  function renderRollouts() {
    const latestTask = {};
    for (const t of control.tasks || []) if (!latestTask[t.rollout]) latestTask[t.rollout] = t; // newest first
    let unknown = false;
    for (const r of control.rollouts) {
      const card = document.getElementById("rollout-" + r.id);
      if (!card) { if (["pending", "warming", "running", "paused"].includes(r.state)) unknown = true; continue; }
      card.dataset.state = r.state;
      card.querySelector(".state").textContent = r.state_label;
      card.querySelector(".share").textContent = r.share + "%";
      card.querySelector(".steps").replaceChildren(...r.steps.map((s, i) => {
        const span = document.createElement("span");
        span.className = "step" + (i < r.current_step ? " done" : i === r.current_step ? " current" : "");
        span.textContent = s + "%";
        return span;
      }));
      card.querySelectorAll(".actions button").forEach((b) => {
        b.disabled = !(actionStates[b.value] || []).includes(r.state);
      });
      const task = latestTask[r.id];
      card.querySelector(".task").textContent = task
        ? "Last action: " + task.label + ": " + task.state + (task.said && task.state !== "done" ? " (" + task.said + ")" : "")
        : "";
      card.querySelector(".task").dataset.state = task ? task.state : "";
      card.querySelector(".event-count").textContent = r.event_count;
      card.querySelector(".events").replaceChildren(...r.events.map((e) => {
        const li = document.createElement("li");
        const time = document.createElement("time");
        time.textContent = e.at;
        li.append(time, " " + e.kind + " " + e.from + "→" + e.to + " step " + e.step + " by " + e.actor + (e.reason ? ": " + e.reason : ""));
        return li;
      }));
      card.querySelector(".evidence-at").textContent = r.evidence_at ? r.evidence_at + ": " + r.evidence_decision : "none yet";
      fillGates(card.querySelector(".evidence tbody"), r.evidence, "no evaluation recorded yet");
      card.querySelector(".preview-at").textContent = r.preview_decision
        ? "(" + r.preview_window_s + " s so far): " + r.preview_decision : "(not holding traffic)";
      fillGates(card.querySelector(".preview tbody"), r.preview, "shown while the rollout holds traffic");
      card.dataset.prices = JSON.stringify(r.prices || {});
    }
    document.getElementById("new-rollouts").hidden = !unknown;
  }

  function fillGates(tbody, groups, empty) {
    const rows = [];
    for (const g of groups) {
      g.rows.forEach((row, i) => {
        const gate = cell(i === 0 ? g.gate : "");
        if (i === 0 && g.decision) {
          const d = document.createElement("span");
          d.className = "decision " + g.decision;
          d.textContent = g.decision;
          gate.append(" ", d);
        }
        rows.push(rowOf([gate, row.metric, row.stable, row.candidate]));
      });
      if (g.notes) { const note = cell(g.notes); note.colSpan = 3; rows.push(rowOf([cell(""), note], "note")); }
    }
    if (!rows.length) { const c = cell(empty); c.colSpan = 4; rows.push(rowOf([c])); }
    if (tbody) tbody.replaceChildren(...rows);
  }

  function renderCompare() {
    const since = Date.now() / 1000 - 60;
    const recent = [...docs.values()].filter((d) => d.ts >= since);
    const latest = latestPerRouter();
    for (const card of document.querySelectorAll(".rollout")) {
      const model = card.dataset.model;
      const prices = JSON.parse(card.dataset.prices || "{}");
      const side = (label, priceOf) => {
        const rows = recent.flatMap((d) => d.rows).filter((r) => r.model === model && r.version === label);
        const n = sum(rows, (r) => r.requests);
        const wmean = (f) => {
          const have = rows.filter((r) => r[f]);
          const m = sum(have, (r) => r.requests);
          return m ? (sum(have, (r) => r[f].p95 * r.requests) / m).toFixed(1) : "—";
        };
        const tin = sum(rows, (r) => r.tokens_in), tout = sum(rows, (r) => r.tokens_out);
        const price = prices[priceOf];
        const cost = price && tin + tout ? ((tin * price[0] + tout * price[1]) / (tin + tout)).toFixed(4) : "—";
        return [n, n ? pct(sum(rows, (r) => r.errors) / n) : "—", wmean("ttft_ms"), wmean("itl_ms"), tin + " / " + tout, cost];
      };
      const stable = side(card.dataset.stable, "stable"), candidate = side(card.dataset.candidate, "candidate");
      const names = ["requests (samples)", "error rate", "TTFT p95 ms (per-second, mean)", "ITL p95 ms (per-second, mean)", "tokens in / out", "cost per 1k tokens"];
      const tbody = card.querySelector(".live-compare tbody");
      if (tbody && recent.length) tbody.replaceChildren(...names.map((name, i) => rowOf([name, stable[i], candidate[i]])));
      const routes = latest.filter((d) => d.routes && d.routes[model]).map((d) =>
        d.router + " (snapshot " + d.snapshot_version + "): " + Object.entries(d.routes[model]).map(([v, w]) => v + " " + w + "%").join(" · "));
      const el = card.querySelector(".routes");
      if (el) {
        el.textContent = routes.length ? "Routers' route: " + routes.join("; ") : "Routers' route: none for this model yet";
        el.dataset.weights = JSON.stringify(latest.filter((d) => d.routes && d.routes[model]).map((d) => d.routes[model]));
      }
    }
  }

  // --- scaling: desired vs actual per pool, recent decisions --------------------------------
  function renderScaling(pools) {
    for (const p of pools) {
      const card = document.getElementById("pool-" + p.pool);
      if (!card) continue;
      for (const k of ["serving", "warm", "draining"]) card.querySelector("." + k).textContent = p.replicas[k];
      const since = Date.now() / 1000 - WINDOW_S;
      const points = p.history.filter((h) => h[0] >= since);
      const xs = points.map((h) => when(h[0]));
      draw("chart-scaling-" + p.pool, [
        line("actual", xs, points.map((h) => h[1]), { line: { shape: "hv" } }),
        line("desired", xs, points.map((h) => h[2]), { line: { shape: "hv", dash: "dash" } }),
      ], { yaxis: { title: "replicas", rangemode: "tozero", dtick: 1 } });
      const rows = p.decisions.map((d) => rowOf([d.at, d.action, d.current + " → " + d.desired,
        d.reason + (d.error ? " (error: " + d.error + ")" : ""), d.signals]));
      card.querySelector(".decisions tbody").replaceChildren(...(rows.length ? rows : [rowOf(["no decisions yet"])]));
      card.dataset.decisions = String(p.decisions.length);
    }
  }
  if (body.dataset.page === "scaling") {
    const initial = document.getElementById("scaling-data");
    if (initial) renderScaling(JSON.parse(initial.textContent));
  }

  // For tests and the console: how many documents are held, and whose rows they carry.
  window.switchyardDashboard = {
    documents: () => docs.size,
    drop: () => socket && socket.close(), // a lost connection: reconnects and backfills
    controls: () => (control ? 1 : 0), // whether a control document arrived (staff)
    tenants: () => [...new Set([...docs.values()].flatMap((d) => d.rows.map((r) => r.tenant)))].sort(),
  };
  // light/dark follows the system; redraw with the new colours when it changes
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => { dirty = true; render(); renderControl(); });
  connect();
  setInterval(render, 1000);
})();
