// The tierroute dashboard: fetches /ui/api/<page> with the key from sessionStorage and draws it.
//
// Safe by construction: every string from the server (key, team and model names, task names,
// alarm text) reaches the page through textContent or an SVG <text>/<title> node's textContent,
// never innerHTML, and attributes are set only from fixed names with numbers or fixed class
// names. No inline script or style (the page's Content-Security-Policy forbids both), no eval.
"use strict";

(function () {
  const KEY = "tierroute.dashboard.key";
  const SVG = "http://www.w3.org/2000/svg";
  const PAGES = ["overview", "quality", "latency", "keys", "evals"];
  const $ = (id) => document.getElementById(id);

  // ---- DOM builders: text is always text -----------------------------------------------------
  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }
  function titled(node, text) {
    node.appendChild(svgEl("title", {}, text));
    return node;
  }

  // ---- formats: the cost report's (router/reports/costs.py _fmt) -------------------------------
  const fmt = {
    usd(v) {
      if (v === null || v === undefined) return "-";
      const s = Math.abs(v).toLocaleString("en-US", { minimumFractionDigits: 6, maximumFractionDigits: 6 });
      return (v < 0 ? "-$" : "$") + s;
    },
    pct(v) { return v === null || v === undefined ? "-" : (100 * v).toFixed(1) + "%"; },
    pct100(v) { return v === null || v === undefined ? "-" : v.toFixed(1) + "%"; },
    ms(v) { return v === null || v === undefined ? "-" : v.toLocaleString("en-US", { maximumFractionDigits: 0 }); },
    int(v) { return v === null || v === undefined ? "-" : v.toLocaleString("en-US"); },
    s1(v) { return v === null || v === undefined ? "-" : v.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 }); },
    num(v) { return v === null || v === undefined ? "-" : String(v); },
    text(v) { return v === null || v === undefined ? "-" : String(v); },
  };

  // A table: columns [{field, label, format}], rows of objects. Each cell carries its field name
  // and the exact JSON number (data-value), so a test reads the figure and the text both.
  function table(id, columns, rows) {
    const t = el("table", "data");
    t.id = id;
    const head = t.createTHead().insertRow();
    for (const c of columns) head.appendChild(el("th", null, c.label));
    const body = t.createTBody();
    for (const r of rows) {
      const tr = body.insertRow();
      for (const c of columns) {
        const v = typeof c.value === "function" ? c.value(r) : r[c.field];
        const td = el("td", null, fmt[c.format || "text"](v));
        td.dataset.field = c.field;
        if (typeof v === "number") td.dataset.value = String(v);
        tr.appendChild(td);
      }
    }
    return t;
  }

  function section(title, ...children) {
    const s = el("section");
    s.appendChild(el("h2", null, title));
    for (const c of children) if (c) s.appendChild(c);
    return s;
  }

  function note(text) { return el("p", "note", text); }

  // ---- charts: SVG built node by node -----------------------------------------------------------
  const W = 760, H = 260, PAD = { l: 64, r: 16, t: 12, b: 56 };

  // the chart, and below its axis one legend row per four names
  function frame(label, names) {
    const rows = Math.max(1, Math.ceil(names / 4));
    const s = svgEl("svg", { viewBox: `0 0 ${W} ${H + (rows - 1) * 14}`, class: "chart", role: "img" });
    s.appendChild(svgEl("title", {}, label));
    return s;
  }
  function axes(s, yMax, yFmt) {
    const plotH = H - PAD.t - PAD.b;
    for (let i = 0; i <= 4; i++) {
      const y = PAD.t + plotH - (plotH * i) / 4;
      s.appendChild(svgEl("line", { x1: PAD.l, x2: W - PAD.r, y1: y, y2: y, class: "grid" }));
      s.appendChild(svgEl("text", { x: PAD.l - 6, y: y + 4, class: "tick end" }, yFmt((yMax * i) / 4)));
    }
  }
  // a long name (a tenant's task or model) is cut on an axis or legend; its whole text is in the table
  function short(text, n) {
    const s = String(text);
    return s.length > n ? s.slice(0, n - 1) + "…" : s;
  }
  function legend(s, names, lineLast) {
    names.forEach((n, i) => {
      const x = PAD.l + (i % 4) * 170, y = H - 12 + Math.floor(i / 4) * 14;
      const line = lineLast && i === names.length - 1;
      s.appendChild(svgEl("rect", { x, y: line ? y - 5 : y - 9, width: 10, height: line ? 2 : 10, class: line ? "dot" : `s${i % 8}` }));
      s.appendChild(svgEl("text", { x: x + 14, y, class: "tick" }, short(n, 26)));
    });
  }

  // bars: categories on x, stacked series; `line` (optional) drawn over them
  function barChart(label, cats, series, yFmt, line) {
    const s = frame(label, series.length + (line ? 1 : 0));
    const all = cats.map((_, i) => series.reduce((a, se) => a + (se.values[i] || 0), 0));
    const yMax = Math.max(1e-12, ...all, ...(line ? line.values : [])) * 1.1;
    axes(s, yMax, yFmt);
    const plotW = W - PAD.l - PAD.r, plotH = H - PAD.t - PAD.b;
    const bw = plotW / Math.max(1, cats.length);
    const y = (v) => PAD.t + plotH - (plotH * v) / yMax;
    cats.forEach((c, i) => {
      let base = 0;
      series.forEach((se, k) => {
        const v = se.values[i] || 0;
        if (v > 0) {
          const r = svgEl("rect", { x: PAD.l + i * bw + bw * 0.15, width: bw * 0.7, y: y(base + v), height: y(base) - y(base + v), class: `s${k % 8}` });
          s.appendChild(titled(r, `${c} ${se.name}: ${yFmt(v)}`));
        }
        base += v;
      });
      if (cats.length <= 16 || i % Math.ceil(cats.length / 16) === 0) {
        s.appendChild(svgEl("text", { x: PAD.l + i * bw + bw / 2, y: H - PAD.b + 14, class: "tick mid" }, short(c, Math.max(6, Math.floor(bw / 6)))));
      }
    });
    const names = series.map((se) => se.name);
    if (line) {
      const pts = line.values.map((v, i) => `${PAD.l + i * bw + bw / 2},${y(v)}`).join(" ");
      s.appendChild(svgEl("polyline", { points: pts, class: "line" }));
      line.values.forEach((v, i) => s.appendChild(titled(svgEl("circle", { cx: PAD.l + i * bw + bw / 2, cy: y(v), r: 3, class: "dot" }), `${cats[i]} ${line.name}: ${yFmt(v)}`)));
    }
    legend(s, line ? [...names, line.name] : names, Boolean(line));
    return s;
  }

  // intervals: one row per item, a dot at the rate and a bar over its Wilson interval (0..1)
  function intervalChart(label, items) {
    const rowH = 22, h = PAD.t + items.length * rowH + 30;
    const s = svgEl("svg", { viewBox: `0 0 ${W} ${h}`, class: "chart", role: "img" });
    s.appendChild(svgEl("title", {}, label));
    const x0 = 260, x1 = W - PAD.r;
    const x = (v) => x0 + (x1 - x0) * v;
    for (let i = 0; i <= 4; i++) {
      s.appendChild(svgEl("line", { x1: x(i / 4), x2: x(i / 4), y1: PAD.t, y2: h - 24, class: "grid" }));
      s.appendChild(svgEl("text", { x: x(i / 4), y: h - 8, class: "tick mid" }, `${25 * i}%`));
    }
    items.forEach((it, i) => {
      const y = PAD.t + i * rowH + rowH / 2;
      s.appendChild(svgEl("text", { x: x0 - 8, y: y + 4, class: "tick end" }, short(it.name, 40)));
      if (it.low !== null && it.high !== null) s.appendChild(svgEl("line", { x1: x(it.low), x2: x(it.high), y1: y, y2: y, class: `band s${it.series % 8}` }));
      if (it.rate !== null) s.appendChild(titled(svgEl("circle", { cx: x(it.rate), cy: y, r: 4, class: `s${it.series % 8}` }), `${it.name}: ${fmt.pct(it.rate)} [${fmt.pct(it.low)}, ${fmt.pct(it.high)}]`));
    });
    return s;
  }

  // x-y curves: [{name, points:[{x, y, tip}], marks:[{x, y, tip}]}]
  function curveChart(label, curves, xLabel, yLabel) {
    const s = frame(label, curves.length);
    const xs = [], ys = [];
    for (const c of curves) for (const p of [...c.points, ...(c.marks || [])]) if (p.x !== null && p.y !== null) { xs.push(p.x); ys.push(p.y); }
    const xMax = Math.max(1e-9, ...xs) * 1.05, yMax = Math.min(1, Math.max(0.05, ...ys) * 1.1);
    axes(s, yMax, (v) => fmt.pct(v));
    const plotW = W - PAD.l - PAD.r, plotH = H - PAD.t - PAD.b;
    const X = (v) => PAD.l + (plotW * v) / xMax, Y = (v) => PAD.t + plotH - (plotH * v) / yMax;
    for (let i = 0; i <= 4; i++) s.appendChild(svgEl("text", { x: X((xMax * i) / 4), y: H - PAD.b + 14, class: "tick mid" }, "$" + ((xMax * i) / 4).toFixed(3)));
    s.appendChild(svgEl("text", { x: W - PAD.r, y: H - PAD.b + 28, class: "tick end" }, xLabel));
    s.appendChild(svgEl("text", { x: PAD.l, y: PAD.t + 10, class: "tick" }, yLabel));
    curves.forEach((c, k) => {
      const pts = c.points.filter((p) => p.x !== null && p.y !== null);
      if (pts.length > 1) s.appendChild(svgEl("polyline", { points: pts.map((p) => `${X(p.x)},${Y(p.y)}`).join(" "), class: `curve s${k % 8}${c.dashed ? " dashed" : ""}` }));
      for (const p of pts) s.appendChild(titled(svgEl("circle", { cx: X(p.x), cy: Y(p.y), r: pts.length > 1 ? 2 : 5, class: `s${k % 8}` }), p.tip));
      for (const m of c.marks || []) if (m.x !== null && m.y !== null) s.appendChild(titled(svgEl("circle", { cx: X(m.x), cy: Y(m.y), r: 7, class: `mark s${k % 8}` }), m.tip));
    });
    legend(s, curves.map((c) => c.name));
    return s;
  }

  // ---- pages -----------------------------------------------------------------------------------
  const COST_COLUMNS = [
    { field: "requests", label: "requests", format: "int" },
    { field: "cost_usd", label: "cost", format: "usd" },
    { field: "top_tier_usd", label: "top-tier cost", format: "usd" },
    { field: "savings_usd", label: "savings", format: "usd" },
    { field: "savings_pct", label: "saved", format: "pct100" },
    { field: "escalation_rate", label: "escalation", format: "pct" },
    { field: "p50_ms", label: "p50 ms", format: "ms" },
    { field: "p95_ms", label: "p95 ms", format: "ms" },
  ];

  function windowText(w) {
    return `${w.since_text || "the start"} to ${w.until_text || "now"}: ${fmt.int(w.requests)} requests`;
  }

  const render = {
    overview(d) {
      const t = d.total;
      const kpis = el("div", "kpis");
      for (const [id, label, value] of [
        ["kpi-cost", "spent", fmt.usd(t.cost_usd)],
        ["kpi-top", `had every request gone to ${d.top_tier}`, fmt.usd(t.top_tier_usd)],
        ["kpi-savings", "saved", `${fmt.usd(t.savings_usd)} (${fmt.pct100(t.savings_pct)})`],
        ["kpi-escalation", "escalated", fmt.pct(t.escalation_rate)],
      ]) {
        const k = el("div", "kpi");
        const v = el("strong", null, value);
        v.id = id;
        k.append(v, el("span", null, label));
        kpis.appendChild(k);
      }
      const tiers = [...new Set(d.days.flatMap((day) => Object.keys(day.tiers)))].sort();
      const chart = barChart(
        "Spend per tier per UTC day, against the top tier only",
        d.days.map((day) => day.day),
        tiers.map((tier) => ({ name: `spent at ${tier}`, values: d.days.map((day) => day.tiers[tier] || 0) })),
        (v) => "$" + v.toPrecision(3),
        { name: `${d.top_tier} only`, values: d.days.map((day) => day.top_tier_usd) },
      );
      const prices = el("ul", "prices");
      for (const p of d.prices) {
        const li = el("li");
        li.append(el("b", null, p.tier), document.createTextNode(": " + p.price));
        prices.appendChild(li);
      }
      const escalation = barChart(
        "Escalation rate per task",
        d.tasks.map((r) => r.group),
        [{ name: "escalated", values: d.tasks.map((r) => r.escalation_rate) }],
        (v) => fmt.pct(v),
      );
      return [
        section("Overview", note(windowText(d.window)), kpis),
        section("Spend per tier per day", chart, table("days", [
          { field: "day", label: "day" },
          { field: "requests", label: "requests", format: "int" },
          { field: "cost_usd", label: "cost", format: "usd" },
          { field: "top_tier_usd", label: "top-tier cost", format: "usd" },
          ...tiers.map((tier) => ({ field: `tier:${tier}`, label: tier, format: "usd", value: (r) => (r.tiers[tier] === undefined ? null : r.tiers[tier]) })),
        ], d.days)),
        section("By tier", table("tiers", [{ field: "group", label: "tier" }, ...COST_COLUMNS, { field: "answered", label: "answered", format: "int" }], [...d.tiers, t])),
        section("Price assumption", note("Savings compare each request's cost with what it would have cost sent straight to the top tier, priced from this sheet."), prices),
        section("Requests and escalation per task", escalation, table("tasks", [{ field: "group", label: "task" }, ...COST_COLUMNS], d.tasks)),
      ];
    },

    quality(d) {
      const items = [];
      d.rows.forEach((r, i) => {
        const name = `${r.tier}/${r.task} @${r.threshold}`;
        if (r.pairs) items.push({ name: `${name} agreement`, rate: r.agreement, low: r.wilson_low, high: r.wilson_high, series: 0 });
        if (r.labelled) items.push({ name: `${name} labels`, rate: r.label_accuracy, low: r.label_low, high: r.label_high, series: 1 });
      });
      const alarms = el("ul", "alarms");
      for (const a of d.alarms) alarms.appendChild(el("li", null, `${a.time} ${a.text}`));
      const thresholds = table("thresholds", [
        { field: "tier", label: "tier" },
        { field: "threshold", label: "threshold", format: "num", value: (r) => (r.last ? null : r.threshold) },
        { field: "tasks", label: "per task", value: (r) => Object.entries(r.tasks).map(([k, v]) => `${k}: ${v}`).join(", ") || null },
        { field: "shadow_rate", label: "shadow sampled", format: "pct" },
        { field: "baseline_accept", label: "acceptance baseline", value: (r) => Object.entries(r.baseline_accept).map(([k, v]) => `${k}: ${v}`).join(", ") || null },
        { field: "baseline_agree", label: "agreement baseline", value: (r) => Object.entries(r.baseline_agree).map(([k, v]) => `${k}: ${v}`).join(", ") || null },
      ], d.thresholds);
      return [
        section("Quality", note(`${windowText(d.window)}; ${fmt.int(d.pairs)} shadow pairs; ${fmt.int(d.labels)} feedback labels` + (d.unplaced ? `; ${d.unplaced} labelled requests passed no threshold` : ""))),
        section("Shadow agreement and label accuracy, 95% Wilson intervals", items.length ? intervalChart("Agreement and label accuracy per tier, task and threshold", items) : note("No shadow pairs or labels in this window.")),
        section("Per tier, task and threshold", table("quality", [
          { field: "tier", label: "tier" }, { field: "task", label: "task" }, { field: "threshold", label: "threshold", format: "num" },
          { field: "tried", label: "tried", format: "int" }, { field: "acceptance", label: "acceptance", format: "pct" },
          { field: "pairs", label: "pairs", format: "int" }, { field: "agreement", label: "agreement", format: "pct" },
          { field: "wilson_low", label: "low", format: "pct" }, { field: "wilson_high", label: "high", format: "pct" },
          { field: "labelled", label: "labelled", format: "int" }, { field: "label_accuracy", label: "label accuracy", format: "pct" },
          { field: "label_low", label: "low", format: "pct" }, { field: "label_high", label: "high", format: "pct" },
        ], d.rows)),
        section("Drift alarms", d.alarms.length ? alarms : note("None in this window.")),
        section("Thresholds in force", thresholds),
      ];
    },

    latency(d) {
      const chart = barChart(
        "Generation latency per tier attempt, p50 and p95 (ms)",
        d.tiers.map((r) => r.tier),
        [{ name: "p50", values: d.tiers.map((r) => r.p50_ms || 0) }, { name: "p95 - p50", values: d.tiers.map((r) => (r.p95_ms || 0) - (r.p50_ms || 0)) }],
        (v) => fmt.ms(v),
      );
      const live = d.backends.map((b) => ({ tier: b.tier, queue_depth: b.stats.queue_depth ?? null, active_sequences: b.stats.active_sequences ?? null, breaker_open: b.stats.breaker_open ?? null, breaker_half_open: b.stats.breaker_half_open ?? null, consecutive_failures: b.stats.consecutive_failures ?? null }));
      const deps = d.deployments.map((x) => ({ tier: x.tier, deployment: x.deployment, state: x.stats.breaker_open ? "open" : x.stats.breaker_half_open ? "half-open" : "closed", outstanding: x.stats.outstanding ?? null, failed: x.stats.failed_attempts_total ?? null, answered: x.stats.answered_total ?? null }));
      return [
        section("Latency", note(`${windowText(d.window)}. Time to first token is not recorded in the ledger, so it is not shown here.`)),
        section("Per tier", chart, table("latency", [
          { field: "tier", label: "tier" }, { field: "attempts", label: "attempts", format: "int" },
          { field: "p50_ms", label: "p50 ms", format: "ms" }, { field: "p95_ms", label: "p95 ms", format: "ms" },
          { field: "compute_s", label: "compute s", format: "s1" },
        ], d.tiers)),
        section("Whole requests (admission to answer)", table("request-latency", [
          { field: "requests", label: "requests", format: "int" }, { field: "p50_ms", label: "p50 ms", format: "ms" }, { field: "p95_ms", label: "p95 ms", format: "ms" },
        ], [d.requests])),
        section("Now: queues and breakers per tier", table("backends", [
          { field: "tier", label: "tier" }, { field: "queue_depth", label: "queue depth", format: "num" },
          { field: "active_sequences", label: "active", format: "num" }, { field: "breaker_open", label: "breaker open", format: "num" },
          { field: "breaker_half_open", label: "half open", format: "num" }, { field: "consecutive_failures", label: "failures in a row", format: "num" },
        ], live)),
        section("Now: breakers per deployment", deps.length ? table("deployments", [
          { field: "tier", label: "tier" }, { field: "deployment", label: "deployment" }, { field: "state", label: "breaker" },
          { field: "outstanding", label: "in flight", format: "num" }, { field: "failed", label: "failed attempts", format: "num" }, { field: "answered", label: "answered", format: "num" },
        ], deps) : note("No tier with deployments.")),
      ];
    },

    keys(d) {
      const chart = barChart("Top spenders in the window", d.top.map((r) => r.group), [{ name: "spent", values: d.top.map((r) => r.cost_usd) }], (v) => "$" + v.toPrecision(3));
      const refusals = Object.entries(d.refusals).map(([reason, n]) => ({ reason, n }));
      return [
        section("Keys and teams", note(windowText(d.window))),
        section("Top spenders", chart, table("spenders", [{ field: "group", label: "key" }, ...COST_COLUMNS], d.top)),
        section("Spend against budget (this UTC day and month)", d.budgets.length ? table("budgets", [
          { field: "kind", label: "" }, { field: "name", label: "name" }, { field: "team", label: "team" },
          { field: "usd_today", label: "today", format: "usd" }, { field: "usd_per_day", label: "daily budget", format: "usd" },
          { field: "day_used", label: "used", format: "pct", value: (r) => (r.usd_per_day ? r.usd_today / r.usd_per_day : null) },
          { field: "usd_this_month", label: "this month", format: "usd" }, { field: "usd_per_month", label: "monthly budget", format: "usd" },
          { field: "month_used", label: "used", format: "pct", value: (r) => (r.usd_per_month ? r.usd_this_month / r.usd_per_month : null) },
          { field: "usd_reserved_in_flight", label: "reserved now", format: "usd" },
        ], d.budgets) : note("No key or team has a USD budget.")),
        section("Refused before generation, since this process started", refusals.length ? table("refusals", [{ field: "reason", label: "reason" }, { field: "n", label: "requests", format: "int" }], refusals) : note("None since the process started.")),
      ];
    },

    evals(d) {
      if (!d.report) return [section("Evals", note("No eval report is set: [dashboard] eval_report names a directory written by tierroute eval report (the committed one is docs/eval)."))];
      const picker = el("select");
      picker.id = "suite";
      for (const s of d.suites) {
        const o = el("option", null, s);
        o.value = s;
        o.selected = s === d.suite;
        picker.appendChild(o);
      }
      picker.addEventListener("change", () => load("evals", { suite: picker.value }));
      // at first: the config's own verifiers, and the two whose calibrated points did best held-out
      const best = d.verifiers.filter((v) => v.calibrated.length && v.verifier !== "config")
        .sort((a, b) => Math.max(...b.calibrated.map((p) => p.accuracy || 0)) - Math.max(...a.calibrated.map((p) => p.accuracy || 0)));
      const chosen = new Set([...d.verifiers.filter((v) => v.verifier === "config"), ...best.slice(0, 2)].map((v) => v.verifier));
      const boxes = el("div", "verifiers");
      const holder = el("div");
      const draw = () => {
        const curves = d.verifiers.filter((v) => chosen.has(v.verifier)).map((v) => ({
          name: v.verifier,
          points: v.curve.map((p) => ({ x: p.cost_per_1k, y: p.accuracy, tip: `${v.verifier} threshold ${p.threshold}: ${fmt.pct(p.accuracy)} at $${p.cost_per_1k} per 1k` })),
          marks: v.calibrated.map((p) => ({ x: p.cost_per_1k, y: p.accuracy, tip: `${v.verifier} calibrated for ${p.target} (${p.threshold}), held-out: ${fmt.pct(p.accuracy)} at $${p.cost_per_1k} per 1k` })),
        }));
        curves.push({ name: "random escalation", dashed: true, points: d.random.map((p) => ({ x: p.cost_per_1k, y: p.accuracy, tip: `random ${p.threshold}` })) });
        for (const t of d.tiers) curves.push({ name: `${t.tier} alone`, points: [{ x: t.cost_per_1k, y: t.accuracy, tip: `${t.tier} alone: ${fmt.pct(t.accuracy)} at $${t.cost_per_1k} per 1k` }] });
        for (const o of d.oracle) curves.push({ name: "oracle", points: [{ x: o.cost_per_1k, y: o.accuracy, tip: `oracle: ${fmt.pct(o.accuracy)}` }] });
        holder.replaceChildren(curveChart(`Accuracy against cost per 1k requests: ${d.suite}`, curves, "cost per 1k requests", "accuracy"));
      };
      for (const v of d.verifiers) {
        const label = el("label");
        const box = el("input");
        box.type = "checkbox";
        box.checked = chosen.has(v.verifier);
        box.addEventListener("change", () => { if (box.checked) chosen.add(v.verifier); else chosen.delete(v.verifier); draw(); });
        label.append(box, document.createTextNode(" " + v.verifier));
        boxes.appendChild(label);
      }
      draw();
      const calibrated = d.verifiers.flatMap((v) => v.calibrated.map((p) => ({ verifier: v.verifier, ...p })));
      return [
        section("Evals", note(`Report ${d.report}: every verifier's threshold sweep over all items; the ringed point is its calibrated threshold, reported on held-out items.`), picker),
        section("Cost-quality curves", boxes, holder),
        section("Calibrated points", table("calibrated", [
          { field: "verifier", label: "verifier" }, { field: "target", label: "target" }, { field: "threshold", label: "thresholds" },
          { field: "accuracy", label: "accuracy (held-out)", format: "pct" }, { field: "cost_per_1k", label: "cost / 1k", format: "num" },
          { field: "escalation_rate", label: "escalation", format: "pct" },
        ], calibrated)),
      ];
    },
  };

  // ---- the key, the fetch, the page ------------------------------------------------------------
  function key() { return sessionStorage.getItem(KEY); }

  function showLogin(message) {
    $("login").hidden = false;
    $("forget").hidden = true;
    $("page").replaceChildren();
    $("status").textContent = message || "";
  }

  function current() {
    const page = location.hash.replace(/^#/, "");
    return PAGES.includes(page) ? page : "overview";
  }

  async function load(page, extra) {
    const k = key();
    if (!k) { showLogin(""); return; }
    $("login").hidden = true;
    $("forget").hidden = false;
    for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("current", a.dataset.page === page);
    const params = new URLSearchParams(extra || {});
    if (page !== "evals") params.set("since", $("window").value);
    $("status").textContent = "loading…";
    document.body.dataset.state = "loading";
    let response;
    try {
      response = await fetch(`api/${page}?${params}`, { headers: { Authorization: `Bearer ${k}` }, cache: "no-store", credentials: "omit", redirect: "error" });
    } catch (e) {
      $("status").textContent = "The service did not answer.";
      document.body.dataset.state = "error";
      return;
    }
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      const said = body && body.error && body.error.message ? body.error.message : `HTTP ${response.status}`;
      if (response.status === 401 || response.status === 403) {
        sessionStorage.removeItem(KEY);
        showLogin(`Refused (${response.status}): ${said}`);
      } else {
        $("status").textContent = said;
      }
      document.body.dataset.state = "refused";
      return;
    }
    $("page").replaceChildren(...render[page](body));
    $("status").textContent = "";
    document.body.dataset.page = page;
    document.body.dataset.state = "ready";
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      const input = $("key");
      sessionStorage.setItem(KEY, input.value.trim());
      input.value = "";
      load(current());
    });
    $("forget").addEventListener("click", () => { sessionStorage.removeItem(KEY); showLogin("Key forgotten."); });
    $("window").addEventListener("change", () => load(current()));
    window.addEventListener("hashchange", () => load(current()));
    load(current());
  });
})();
