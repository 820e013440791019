/* dz-gym report: filters, lazily created video players and trajectory plots. Vanilla JS, no network. */
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var trajectories = null;  // parsed on first use from <script id="dz-traj">
  var episodes = [];  // the grid's rows, from <script id="dz-episodes">

  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) { return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c]; });
  }

  var FIRST_ROWS = 60;  // rows built before the first paint; the rest follow in the next tasks

  function rowHtml(i, oc) {
    var e = episodes[i], cells = "";
    for (var c = 0; c < e.c.length; c++) cells += (c === oc ? '<td class="outcome">' : "<td>") + esc(e.c[c]) + "</td>";
    return '<tr class="ep ' + e.o + '" data-idx="' + i + '" data-key="' + esc(e.k) + '" data-outcome="' + e.o + '" data-scene="' +
      esc(e.s) + '" data-run="' + esc(e.r) + '">' + cells + '<td><button class="open" type="button">open</button></td></tr>';
  }

  /* The grid's rows from inline JSON: the first screen at once, the rest in chunks of 200 after it painted
     (500 rows streamed as parsed HTML are laid out again and again while they arrive). */
  function buildGrid(done) {
    var node = document.getElementById("dz-episodes"), grid = document.getElementById("episodes");
    if (!node || !grid) { done(); return; }
    episodes = JSON.parse(node.textContent || "[]");
    var oc = +grid.dataset.outcomeCol, body = grid.tBodies[0], next = 0;
    function chunk(size) {
      var html = [], end = Math.min(episodes.length, next + size);
      for (; next < end; next++) html.push(rowHtml(next, oc));
      body.insertAdjacentHTML("beforeend", html.join(""));
      if (next < episodes.length) setTimeout(function () { chunk(200); }, 0); else done();
    }
    chunk(FIRST_ROWS);
  }

  function traj(key) {
    if (trajectories === null) {
      var node = document.getElementById("dz-traj");
      trajectories = node ? JSON.parse(node.textContent || "{}") : {};
    }
    return trajectories[key] || null;
  }

  function bytes(b64) {
    var raw = atob(b64), out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVGNS, name);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, s, cls, anchor) {
    var t = el("text", { x: x, y: y, "class": cls || "tick", "text-anchor": anchor || "start" }, parent);
    t.textContent = s;
    return t;
  }

  /* Joints (top) and gripper (bottom) over the episode's steps; server calls as ticks; success steps shaded. */
  function trajectoryPlot(t) {
    var W = 560, H = 300, L = 46, R = 10, top1 = 12, h1 = 150, top2 = 196, h2 = 56;
    var svg = el("svg", { "class": "plot traj", viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img" });
    el("title", {}, svg).textContent = "Trajectory: joints and gripper over time";
    var T = t.T, m = t.m, dof = t.dof, J = bytes(t.j), G = bytes(t.g);
    function sx(step) { return L + (T > 1 ? step / (T - 1) : 0) * (W - L - R); }
    function stepAt(k) { return m > 1 ? Math.round(k * (T - 1) / (m - 1)) : 0; }
    [[top1, h1], [top2, h2]].forEach(function (p) {
      t.ok.forEach(function (run) {
        el("rect", { "class": "okrun", x: sx(run[0]), y: p[0], width: Math.max(1, sx(Math.min(run[1], T - 1)) - sx(run[0])), height: p[1] }, svg);
      });
      el("line", { "class": "axis", x1: L, x2: W - R, y1: p[0] + p[1], y2: p[0] + p[1] }, svg);
      el("line", { "class": "axis", x1: L, x2: L, y1: p[0], y2: p[0] + p[1] }, svg);
    });
    var jr = t.jr, gr = t.gr;
    text(svg, L - 4, top1 + 8, jr[1].toFixed(2), "tick", "end");
    text(svg, L - 4, top1 + h1, jr[0].toFixed(2), "tick", "end");
    text(svg, L - 4, top2 + 8, gr[1].toFixed(2), "tick", "end");
    text(svg, L - 4, top2 + h2, gr[0].toFixed(2), "tick", "end");
    for (var d = 0; d < dof; d++) {
      var pts = [];
      for (var k = 0; k < m; k++) pts.push(sx(stepAt(k)).toFixed(1) + "," + (top1 + h1 - J[d * m + k] / 255 * h1).toFixed(1));
      el("polyline", { "class": "s" + (d % 8), points: pts.join(" ") }, svg);
    }
    var gp = [];
    for (var q = 0; q < m; q++) gp.push(sx(stepAt(q)).toFixed(1) + "," + (top2 + h2 - G[q] / 255 * h2).toFixed(1));
    el("polyline", { "class": "s7", points: gp.join(" ") }, svg);
    t.calls.forEach(function (s) { el("line", { "class": "call", x1: sx(s), x2: sx(s), y1: top2 + h2 + 4, y2: top2 + h2 + 12 }, svg); });
    text(svg, L, top1 + h1 + 14, "joint positions (rad), " + dof + " joints", "label");
    text(svg, L, top2 - 6, "gripper position", "label");
    text(svg, L, H - 4, "steps 0-" + (T - 1) + "; orange ticks: " + t.calls.length + " server calls; green: success", "note");
    return svg;
  }

  function videoOrNote(src, why, width) {
    if (!src) {
      var div = document.createElement("div");
      div.className = "novideo";
      div.textContent = why || "no video";
      return div;
    }
    var v = document.createElement("video");
    v.controls = true; v.muted = true; v.preload = "auto"; v.playsInline = true; v.loop = true;
    v.width = width || 720;
    v.src = src;
    return v;
  }

  function openRow(tr) {
    var next = tr.nextElementSibling;
    if (next && next.classList.contains("detail")) { next.remove(); tr.querySelector("button.open").textContent = "open"; return; }
    var d = document.createElement("tr"), td = document.createElement("td");
    d.className = "detail"; d.dataset.for = tr.dataset.key;
    td.colSpan = tr.children.length;
    var wrap = document.createElement("div");
    wrap.className = "detailwrap";
    var e = episodes[+tr.dataset.idx];
    wrap.appendChild(videoOrNote(e.v, e.nv, 720));
    var t = traj(tr.dataset.key);
    if (t) wrap.appendChild(trajectoryPlot(t));
    else { var n = document.createElement("div"); n.className = "novideo"; n.textContent = "no trajectory file for this episode"; wrap.appendChild(n); }
    var info = document.createElement("pre");
    info.className = "episodeinfo";
    info.textContent = JSON.stringify(e.i, null, 1);
    wrap.appendChild(info);
    td.appendChild(wrap); d.appendChild(td);
    tr.after(d);
    tr.querySelector("button.open").textContent = "close";
  }

  function applyFilters() {
    var o = valueOf("f-outcome"), s = valueOf("f-scene"), r = valueOf("f-run"), shown = 0, total = 0;
    document.querySelectorAll("#episodes tr.ep").forEach(function (tr) {
      var ok = (!o || tr.dataset.outcome === o) && (!s || tr.dataset.scene === s) && (!r || tr.dataset.run === r);
      tr.hidden = !ok; total++; if (ok) shown++;
      var next = tr.nextElementSibling;
      if (next && next.classList.contains("detail")) next.hidden = !ok;
    });
    var c = document.getElementById("shown-count");
    if (c) c.textContent = "showing " + shown + " of " + total + " episodes";
  }

  function valueOf(id) { var n = document.getElementById(id); return n ? n.value : ""; }

  function init() {
    window.dzReport = { ready: false, readyAt: null, paintedAt: null, startedAt: performance.now() };
    ["f-outcome", "f-scene", "f-run"].forEach(function (id) {
      var n = document.getElementById(id);
      if (n) n.addEventListener("change", applyFilters);
    });
    var grid = document.getElementById("episodes");
    if (grid) grid.addEventListener("click", function (ev) {
      var b = ev.target.closest("button.open");
      if (b) openRow(b.closest("tr"));
    });
    // A failure mode's episodes: their videos are made only when asked for, like a pair's.
    document.querySelectorAll("button.modeopen").forEach(function (b) {
      b.addEventListener("click", function () {
        var box = b.parentNode.querySelector(".pairvids");
        if (box.childElementCount) { box.textContent = ""; b.textContent = "show videos"; return; }
        JSON.parse(b.dataset.videos).forEach(function (x) {
          var f = document.createElement("figure"), cap = document.createElement("figcaption");
          cap.textContent = x[0];
          f.appendChild(cap); f.appendChild(videoOrNote(x[1], x[2], 320)); box.appendChild(f);
        });
        b.textContent = "hide videos";
      });
    });
    document.querySelectorAll("button.pairopen").forEach(function (b) {
      b.addEventListener("click", function () {
        var li = b.closest("li"), box = li.querySelector(".pairvids");
        if (box.childElementCount) { box.textContent = ""; b.textContent = "show videos"; return; }
        [[li.dataset.labelA || "A", li.dataset.a, li.dataset.novideoA], [li.dataset.labelB || "B", li.dataset.b, li.dataset.novideoB]].forEach(function (x) {
          var f = document.createElement("figure"), cap = document.createElement("figcaption");
          cap.textContent = x[0];
          f.appendChild(cap); f.appendChild(videoOrNote(x[1], x[2], 560)); box.appendChild(f);
        });
        b.textContent = "hide videos";
      });
    });
    // Usable: the frame after the first rows were built has painted (filters and buttons already work).
    requestAnimationFrame(function () { setTimeout(function () { window.dzReport.paintedAt = performance.now(); }, 0); });
    buildGrid(function () {
      applyFilters();  // also for a filter chosen while rows were still being added
      window.dzReport.ready = true;
      window.dzReport.readyAt = performance.now();
      document.documentElement.dataset.ready = "1";
    });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init); else init();
})();
