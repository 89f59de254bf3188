// trace-gym tree viewer: draws one prompt's rollout tree at a time from the inline JSON.
// Model text is hostile: everything from the data is written with textContent (never
// innerHTML), and attributes set from data are numbers or fixed strings.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("trace-data").textContent);
  const TREES = DATA.trees;
  const ORIGINS = ["root", "rollout", "replay"];
  const SVGNS = "http://www.w3.org/2000/svg";
  const SHOW_CHARS = 600;  // text longer than this is folded behind "show all"
  // node spacing: at least room for a node's labels beside it (LABEL_W px right of the dot,
  // the replay count left of it), spread to fill the panel, at most MAX_DX / MAX_DY apart
  const MIN_DX = 84, MAX_DX = 220, MIN_DY = 56, MAX_DY = 110, PAD = 40, PAD_X = 24, LABEL_W = 52, LABEL_X = 14;
  let current = -1;
  let matches = [], matchAt = 0;

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmt(x) { return x === undefined || x === null ? "-" : Number(x).toFixed(2); }
  function short(x) {  // a node label's number: 0.50 -> ".5", 1.00 -> "1", 0.00 -> "0"
    if (x === undefined || x === null) return "-";
    return Number(x).toFixed(2).replace(/\.?0+$/, "").replace(/^0\./, ".") || "0";
  }
  function colour(t) {
    if (t === undefined || t === null) return "#cfd8dc";
    return "hsl(" + Math.round(120 * t) + ",65%,47%)";
  }

  // ------------------------------------------------------------------ layout
  function children(nodes) {
    const kids = nodes.map(() => []);
    nodes.forEach((n, i) => { if (n.p !== null && n.p !== undefined) kids[n.p].push(i); });
    return kids;
  }
  function layout(nodes, kids) {
    // leaves take consecutive columns in depth-first order; a parent sits over its children
    const x = new Array(nodes.length).fill(0);
    let col = 0;
    const stack = [[0, false]];
    while (stack.length) {
      const [i, done] = stack.pop();
      if (done || kids[i].length === 0) {
        x[i] = kids[i].length ? (x[kids[i][0]] + x[kids[i][kids[i].length - 1]]) / 2 : col++;
        continue;
      }
      stack.push([i, true]);
      for (let k = kids[i].length - 1; k >= 0; k--) stack.push([kids[i][k], false]);
    }
    return { x: x, cols: col };
  }
  // ------------------------------------------------------------------ tree
  function drawTree(ti) {
    const tree = TREES[ti], nodes = tree.nodes, kids = children(nodes);
    const { x, cols } = layout(nodes, kids);
    const depth = Math.max.apply(null, nodes.map((n) => n.d));
    const root = document.getElementById("tree"), wrap = document.getElementById("tree-wrap");
    root.replaceChildren();
    // fill the panel: the leaves' columns share its width, the depths its height
    // (#tree-wrap is at most 62vh tall; 24 px stay for a horizontal scroll bar)
    const W = Math.max(wrap.clientWidth - 2, 300), H = Math.max(window.innerHeight * 0.62 - 24, 200);
    const span = Math.max(cols - 1, 1), DX = Math.min(MAX_DX, Math.max(MIN_DX, (W - 2 * PAD_X - LABEL_W) / span));
    const DY = depth ? Math.min(MAX_DY, Math.max(MIN_DY, (H - 2 * PAD - 20) / depth)) : MIN_DY;
    const left = PAD_X + Math.max(0, (W - 2 * PAD_X - LABEL_W - (cols - 1) * DX) / 2);  // a narrow tree sits centred
    root.setAttribute("width", Math.max(W, left + (cols - 1) * DX + PAD_X + LABEL_W));
    root.setAttribute("height", PAD * 2 + depth * DY + 20);
    const X = (i) => left + x[i] * DX, Y = (i) => PAD + nodes[i].d * DY;
    const branches = {};
    nodes.forEach((n, i) => {
      if (n.p === null || n.p === undefined) return;
      const cls = n.o === 2 ? "edge replay" : "edge";
      const my = (Y(n.p) + Y(i)) / 2;
      root.appendChild(svg("path", { class: cls, d: `M${X(n.p)},${Y(n.p)} C${X(n.p)},${my} ${X(i)},${my} ${X(i)},${Y(i)}` }));
      if (n.br) branches[n.p] = (branches[n.p] || 0) + 1;  // a replay branched at its parent
    });
    nodes.forEach((n, i) => root.appendChild(drawNode(tree, n, i, X(i), Y(i), branches[i] || 0, kids[i].length)));
  }
  function drawNode(tree, n, i, cx, cy, replays, nkids) {
    const g = svg("g", { class: "node", "data-id": i, transform: `translate(${cx},${cy})` });
    const anchor = i === 0 || nkids >= 2;
    if (anchor && n.ns > 0 && n.ns < n.nl) g.appendChild(svg("circle", { class: "mixed", r: 11 }));
    g.appendChild(svg("circle", { class: "dot", r: 7, fill: colour(n.t) }));
    if (n.f) {
      g.appendChild(svg("path", { class: "fail", d: "M-5,-5 L5,5 M-5,5 L5,-5" }));
      g.appendChild(svg("text", { class: "failkind", x: LABEL_X, y: 18 }, n.f[0]));
    }
    if (replays) {
      g.appendChild(svg("path", { class: "branch", d: "M-15,0 L-11,-4 L-7,0 L-11,4 Z" }));
      g.appendChild(svg("text", { x: 0, y: -14, fill: "#7b1fa2", "text-anchor": "middle" }, "R" + replays));
    }
    if (n.v !== undefined) {
      // predicted value next to the realised rate; bold red where they are 0.5 or more apart
      const off = n.t !== undefined && Math.abs(n.v - n.t) >= 0.5;
      g.appendChild(svg("text", { x: LABEL_X, y: -3, class: off ? "disagree" : "" }, "v" + short(n.v) + " r" + short(n.t)));
    }
    if (n.pairs) g.appendChild(svg("text", { class: "pairs", x: LABEL_X, y: 8 }, n.pairs + " pairs"));
    const tip = `node ${i} depth ${n.d} ${ORIGINS[n.o]}; rate ${fmt(n.t)} (${n.ns}/${n.nl})` +
      (n.v !== undefined ? `; predicted ${fmt(n.v)}` : "") + (n.f ? `; failed: ${n.f[0]}` : "");
    g.appendChild(svg("title", {}, tip));
    g.addEventListener("click", () => showNode(current, i));
    return g;
  }

  // ------------------------------------------------------------------ detail panel
  function foldedText(label, text, cut) {
    const box = el("div");
    if (label) box.appendChild(el("div", { class: "lbl" }, label));
    const pre = el("pre");
    const long = text.length > SHOW_CHARS;
    pre.textContent = long ? text.slice(0, SHOW_CHARS) + " …" : text;
    box.appendChild(pre);
    if (long) {
      const b = el("button", { class: "more" }, `show all (${text.length} chars)`);
      b.addEventListener("click", () => {
        const all = pre.textContent.length > SHOW_CHARS + 2;
        pre.textContent = all ? text.slice(0, SHOW_CHARS) + " …" : text;
        b.textContent = all ? `show all (${text.length} chars)` : "show less";
      });
      box.appendChild(b);
    }
    if (cut) box.appendChild(el("div", { class: "note" }, `${cut} more characters are in the tree file (the page keeps ${DATA.max_text} per text)`));
    return box;
  }
  function facts(n, i) {
    const t = el("table");
    const rows = [["node", i], ["depth", n.d], ["origin", ORIGINS[n.o]],
      ["realised rate", `${fmt(n.t)} (${n.ns} of ${n.nl} leaves)`], ["predicted value", fmt(n.v)]];
    if (n.tv !== undefined) rows.push(["exact value", fmt(n.tv)]);
    if (n.end) rows.push(["ended", n.end]);
    if (n.r !== undefined) rows.push(["reward", n.r]);
    if (n.f) rows.push(["failure", `${n.f[0]} at ${n.f[1] || "?"}: ${n.f[2]}`]);
    if (n.pv !== undefined) rows.push(["policy version", n.pv]);
    if (n.pairs) rows.push(["contrastive pairs here", n.pairs]);
    if (n.tok !== undefined) rows.push(["generated tokens", n.tok]);
    rows.forEach(([k, v]) => { const r = el("tr"); r.appendChild(el("th", {}, k)); r.appendChild(el("td", {}, v)); t.appendChild(r); });
    return t;
  }
  function showNode(ti, id) {
    const tree = TREES[ti], nodes = tree.nodes, n = nodes[id];
    document.querySelectorAll("#tree .node.selected").forEach((g) => g.classList.remove("selected"));
    const g = document.querySelector(`#tree .node[data-id="${id}"]`);
    if (g) g.classList.add("selected");
    const box = document.getElementById("detail");
    box.replaceChildren(el("h2", {}, `${tree.id}, node ${id}`), facts(n, id));
    const path = [];
    for (let j = id; j !== null && j !== undefined && j !== 0; j = nodes[j].p) path.unshift(j);
    const prompt = el("details", { class: "turn", id: "prompt-turn" });
    if (id === 0) prompt.open = true;
    prompt.appendChild(el("summary", {}, "prompt"));
    prompt.appendChild(foldedText("", tree.prompt, tree.prompt_cut));
    box.appendChild(prompt);
    path.forEach((j) => box.appendChild(turnBox(nodes[j], j, j === id)));
  }
  function turnBox(n, j, here) {
    const d = el("details", { class: "turn" + (n.o === 2 ? " replay" : "") + (here ? " here" : ""), "data-node": j });
    if (here) d.open = true;
    const extra = n.f ? `, failed (${n.f[0]})` : n.r !== undefined ? `, reward ${n.r}` : "";
    d.appendChild(el("summary", {}, `turn ${n.d} (node ${j}, ${ORIGINS[n.o]}${extra})`));
    const cut = n.cut || [0, 0];
    d.appendChild(foldedText("assistant", n.a || "", cut[0]));
    d.appendChild(foldedText("observation", n.ob || "", cut[1]));
    return d;
  }

  // ------------------------------------------------------------------ step panels
  function depthCounts(trees) {
    // the same count as trace_gym.bench.view.budget_by_depth: roots at 0, replays at their prefix
    const out = {};
    trees.forEach((t) => {
      out[0] = (out[0] || 0) + t.roots;
      t.nodes.forEach((n) => { if (n.br) { const d = t.nodes[n.p].d; out[d] = (out[d] || 0) + 1; } });
    });
    return out;
  }
  function histogram(counts, title) {
    const depths = Object.keys(counts).map(Number).sort((a, b) => a - b);
    const max = Math.max(1, ...depths.map((d) => counts[d]));
    const W = 28, H = 90, s = svg("svg", { width: Math.max(300, 40 + depths.length * W), height: H + 40, class: "hist" });
    s.appendChild(svg("text", { x: 4, y: 12 }, title));
    depths.forEach((d, k) => {
      const h = Math.max(1, (H - 20) * counts[d] / max), x = 30 + k * W;
      s.appendChild(svg("rect", { x: x, y: H + 8 - h, width: W - 6, height: h, fill: d === 0 ? "#546e7a" : "#7b1fa2",
        "data-depth": d, "data-count": counts[d] }));
      s.appendChild(svg("text", { x: x, y: H + 4 - h }, counts[d]));
      s.appendChild(svg("text", { x: x + 6, y: H + 22 }, d));
    });
    s.appendChild(svg("text", { x: 4, y: H + 36 }, "depth of the branch point (0: roots, >0: replays)"));
    return s;
  }
  function drawPool(step) {
    const s = DATA.steps[String(step)], box = document.getElementById("pool");
    const rows = s.selected.map(([ti, id, v, m]) => ({ ti: ti, id: id, v: v, got: m + " roots" }));
    (s.skipped || []).forEach(([id, v]) => rows.push({ ti: -1, id: id, v: v, got: "skipped" }));
    rows.sort((a, b) => (b.v === null ? -1 : b.v) - (a.v === null ? -1 : a.v));
    const t = el("table"), h = el("tr");
    ["task id", "predicted value", "got"].forEach((c) => h.appendChild(el("th", {}, c)));
    t.appendChild(h);
    rows.forEach((r) => {
      const tr = el("tr", { class: r.ti < 0 ? "skipped" : "sel" + (r.ti === current ? " current" : "") });
      [r.id, fmt(r.v), r.got].forEach((c) => tr.appendChild(el("td", {}, c)));
      if (r.ti >= 0) tr.addEventListener("click", () => go(r.ti));
      t.appendChild(tr);
    });
    const note = s.skipped === null
      ? "This tree file does not record the step's skipped candidates (written by a runner that did not store them in tree info); only the selected prompts are listed."
      : `${s.skipped.length} of ${rows.length} candidates skipped.`;
    const notes = [el("p", { class: "note" }, note)];
    if (s.uniform !== null && s.uniform !== undefined) {
      notes.push(el("p", { class: "note uniform" }, `Every candidate shows the same predicted value (${fmt(s.uniform)}): ` +
        "the predictor had nothing to tell them apart yet, so this step fell back to uniform: " +
        "which candidates got roots, and how many, reflects no ranking."));
    }
    box.replaceChildren(...notes, t);
  }
  function drawSummary(tree) {
    const m = tree.metrics, box = document.getElementById("summary");
    const kv = [["task", tree.id], ["step", tree.step], ["env", tree.env || "-"], ["roots", tree.roots],
      ["predicted", fmt(tree.value)], ["realised", fmt(tree.nodes[0].t)], ["nodes", tree.nodes.length],
      ["leaves", `${m.successes} ok / ${m.failures} not`], ["failed branches", m.failed_branches],
      ["mixed anchors", `${m.mixed_anchors} of ${m.anchors}`], ["pairs", m.contrastive_pairs]];
    box.replaceChildren(...kv.map(([k, v]) => { const s = el("span", { class: "kv" }); s.appendChild(el("b", {}, k + ": ")); s.appendChild(document.createTextNode(String(v))); return s; }));
  }
  function drawLegend() {
    const items = [["hsl(0,65%,47%)", "rate 0"], ["hsl(60,65%,47%)", "rate .5"], ["hsl(120,65%,47%)", "rate 1"],
      ["#cfd8dc", "no scored leaf"], ["#ffb300", "ring: mixed anchor"], ["#7b1fa2", "dashed: replay, R: replays branched here"], ["#000", "x: failed branch"], ["#c62828", "red v/r: prediction and outcome 0.5+ apart"]];
    document.getElementById("legend").replaceChildren(...items.map(([c, t]) => {
      const s = el("span"), i = el("i"); i.style.background = c; s.appendChild(i); s.appendChild(document.createTextNode(t)); return s;
    }));
  }

  // ------------------------------------------------------------------ navigation
  function go(ti) {
    if (!TREES.length) return;
    current = ((ti % TREES.length) + TREES.length) % TREES.length;
    const tree = TREES[current];
    document.getElementById("position").textContent = `prompt ${current + 1} of ${TREES.length}`;
    drawSummary(tree);
    const stepTrees = DATA.steps[String(tree.step)].selected.map((r) => TREES[r[0]]);
    document.getElementById("histogram").replaceChildren(histogram(depthCounts(stepTrees), `step ${tree.step}`), histogram(ALL_COUNTS, "all steps"));
    drawPool(tree.step);
    drawTree(current);  // last: the panels above may bring the page's scroll bar, narrowing the panel
    document.getElementById("detail").replaceChildren(el("p", { class: "hint" }, "Click a node to read its turns."));
    history.replaceState(null, "", "#" + current);
  }
  function search(q, advance) {
    const status = document.getElementById("search-status");
    q = q.trim().toLowerCase();
    if (!q) { matches = []; status.textContent = ""; return; }
    if (!advance) {
      const exact = [], part = [];
      TREES.forEach((t, i) => { const id = t.id.toLowerCase(); if (id === q) exact.push(i); else if (id.includes(q)) part.push(i); });
      matches = exact.concat(part); matchAt = 0;
    } else if (matches.length) matchAt = (matchAt + 1) % matches.length;
    if (!matches.length) { status.textContent = "no task id matches"; return; }
    go(matches[matchAt]);
    status.textContent = `match ${matchAt + 1} of ${matches.length} (Enter: next)`;
  }
  function onKey(e) {
    const box = document.getElementById("search");
    if (e.target === box) { if (e.key === "Escape") box.blur(); return; }
    if (e.key === "j" || e.key === "ArrowRight") go(current + 1);
    else if (e.key === "k" || e.key === "ArrowLeft") go(current - 1);
    else if (e.key === "/") { e.preventDefault(); box.focus(); }
    else return;
  }

  const ALL_COUNTS = depthCounts(TREES);
  drawLegend();
  document.getElementById("prev").addEventListener("click", () => go(current - 1));
  document.getElementById("next").addEventListener("click", () => go(current + 1));
  const box = document.getElementById("search");
  box.addEventListener("input", () => search(box.value, false));
  box.addEventListener("keydown", (e) => { if (e.key === "Enter") search(box.value, true); });
  document.addEventListener("keydown", onKey);
  window.addEventListener("resize", () => { if (current >= 0) drawTree(current); });
  const start = parseInt(location.hash.slice(1), 10);
  go(Number.isFinite(start) ? start : 0);
  window.traceViewerReadyMs = performance.now();
  document.body.setAttribute("data-ready", "1");
})();
