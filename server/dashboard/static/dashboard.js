// numparity dashboard: sortable tables and the uPlot charts. The pages are complete
// without it; this only adds sorting and draws the charts from the JSON in the page.
(function () {
  "use strict";

  // ---- sortable tables ------------------------------------------------------------------
  function cellValue(row, index) {
    var cell = row.children[index];
    if (!cell) return "";
    var raw = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
    raw = raw.trim();
    var number = Number(raw);
    return raw !== "" && raw !== "None" && !isNaN(number) ? number : raw.toLowerCase();
  }

  // A table with several bodies (the heatmap: a node's row and its devices' rows in one)
  // sorts the bodies by their first row, so a group stays together.
  function sortBy(table, header) {
    var index = Array.prototype.indexOf.call(header.parentNode.children, header);
    var body = table.tBodies[0];
    if (!body) return;
    var grouped = table.tBodies.length > 1;
    var ascending = header.getAttribute("aria-sort") !== "ascending";
    var rows = grouped ? Array.prototype.slice.call(table.tBodies)
      : Array.prototype.filter.call(body.rows, function (r) { return !r.classList.contains("none"); });
    var first = function (item) { return grouped ? item.rows[0] : item; };
    rows.sort(function (a, b) {
      var x = cellValue(first(a), index), y = cellValue(first(b), index);
      var order = typeof x === typeof y ? (x < y ? -1 : x > y ? 1 : 0)
                                        : (typeof x === "number" ? -1 : 1);
      return ascending ? order : -order;
    });
    Array.prototype.forEach.call(header.parentNode.children, function (th) { th.removeAttribute("aria-sort"); });
    header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    rows.forEach(function (row) { (grouped ? table : body).appendChild(row); });
  }

  document.querySelectorAll("table.sortable").forEach(function (table) {
    if (!table.tHead) return;
    table.tHead.querySelectorAll("th").forEach(function (th) {
      th.title = th.title || "Sort";
      th.addEventListener("click", function (event) {
        if (event.target.closest("a")) return;  // a header link navigates instead
        sortBy(table, th);
      });
    });
  });

  // ---- charts ---------------------------------------------------------------------------
  if (typeof uPlot === "undefined") return;

  function data(id) {
    var element = document.getElementById(id);
    return element ? JSON.parse(element.textContent) : null;
  }

  function width(element) { return Math.max(320, Math.min(element.clientWidth || 900, 1400)); }

  // Per-layer error of b against a, log scale; identical layers on the floor line and the
  // first divergent layer marked by a dashed vertical line.
  function layerChart(element, chart) {
    var positive = chart.errors.filter(function (v) { return v !== null && v > 0; });
    var low = positive.length ? Math.min.apply(null, positive) : 1e-7;
    var floor = Math.pow(10, Math.floor(Math.log10(low)) - 1);
    var x = chart.names.map(function (_, i) { return i; });
    var errors = chart.errors.map(function (v) { return v !== null && v > 0 ? v : null; });
    var identical = chart.errors.map(function (v) { return v === null || v === 0 ? floor : null; });
    var marked = chart.first_index;
    var pinned = marked !== null && marked !== undefined ? marked : chart.names.length - 1;
    var at = function (i) { return i === null || i === undefined ? pinned : i; };
    var options = {
      width: width(element), height: 300,
      scales: { x: { time: false }, y: { distr: 3, range: function (u, min, max) {
        return [floor / 2, Math.max(max || floor * 10, floor * 10) * 2]; } } },
      axes: [
        { label: "layer (execution order)", space: 40, rotate: -30, size: 70, incrs: [1, 2, 5, 10, 20, 50],
          values: function (u, splits) { return splits.map(function (i) {
            return Number.isInteger(i) && chart.names[i] !== undefined ? chart.names[i] : ""; }); } },
        { label: "relative L2 error", size: 70,
          values: function (u, splits) { return splits.map(function (v) { return v == null ? "" : v.toExponential(0); }); } }
      ],
      // The legend shows the point under the pointer, else the first divergent layer
      // (the last layer when none diverged): never an empty row.
      series: [
        { label: "layer", value: function (u, v, s, i) { i = at(i);
          return chart.names[i] + (i === marked ? " (first divergent)" : ""); } },
        { label: "error", stroke: "#d94801", width: 2, points: { size: 7 }, spanGaps: false,
          value: function (u, v, s, i) { var e = errors[at(i)];
            return e == null ? "0 (bit-identical)" : e.toExponential(2); } },
        { label: "bit-identical", stroke: "#1a9850", width: 0, paths: function () { return null; },
          points: { show: true, size: 8, fill: "#1a9850" },
          value: function (u, v, s, i) { return identical[at(i)] == null ? "no" : "yes"; } }
      ],
      hooks: { draw: [function (u) {
        if (marked === null || marked === undefined) return;
        var ctx = u.ctx, left = u.valToPos(marked, "x", true);
        ctx.save();
        ctx.strokeStyle = "#a50026"; ctx.lineWidth = 2; ctx.setLineDash([6, 4]);
        ctx.beginPath(); ctx.moveTo(left, u.bbox.top); ctx.lineTo(left, u.bbox.top + u.bbox.height); ctx.stroke();
        ctx.setLineDash([]); ctx.fillStyle = "#a50026"; ctx.font = "12px sans-serif";
        ctx.fillText("first divergent: " + chart.first_divergent, left + 6, u.bbox.top + 14);
        ctx.restore();
      }] }
    };
    element.uplot = new uPlot(options, [x, errors, identical], element);
  }

  // A node's runs on one time axis: runs, environment changes, answer changes.
  function timelineChart(element, chart) {
    if (!chart.t.length) { element.textContent = "No runs."; return; }
    var rows = ["runs", "environment", "answers"];
    var t = chart.t;
    var newest = t.length - 1;
    // The legend shows the run under the pointer, else the newest run.
    var at = function (i) { return i === null || i === undefined ? newest : i; };
    var label = function (i, field) { var l = chart.labels[i]; return l ? l[field] : ""; };
    var changed = function (values, field) {
      return function (u, v, s, i) { i = at(i); return values[i] === null ? "unchanged" : label(i, field); };
    };
    var options = {
      width: width(element), height: 180,
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      scales: { x: { time: true, range: function () {
        // The runs' own span and a little more (uPlot would stretch a lone point's range
        // to years; a fixed hour of padding made two runs minutes apart a speck): a
        // lone run gets ten minutes.
        var lo = t[0], hi = t[t.length - 1], span = hi - lo;
        var pad = span > 0 ? Math.max(span * 0.05, 30) : 300;
        return [lo - pad, hi + pad]; } },
                y: { range: [-0.5, 2.5] } },
      axes: [{ label: "time (UTC)" }, { size: 100, splits: function () { return [0, 1, 2]; },
                   values: function (u, splits) { return splits.map(function (v) { return rows[v] || ""; }); } }],
      series: [
        { label: "started", value: function (u, v, s, i) {
          return new Date(t[at(i)] * 1e3).toISOString().slice(0, 19).replace("T", " ") + " UTC"; } },
        { label: "run", stroke: "#0b5cad", paths: function () { return null; }, points: { show: true, size: 9, fill: "#0b5cad" },
          value: function (u, v, s, i) { i = at(i);
            return label(i, "run_id").slice(0, 12) + (label(i, "drill") ? " (drill)" : "") + (i === newest ? " (newest)" : ""); } },
        { label: "environment", stroke: "#762a83", paths: function () { return null; }, points: { show: true, size: 11, fill: "#762a83" },
          value: changed(chart.environment, "environment") },
        { label: "answers", stroke: "#d94801", paths: function () { return null; }, points: { show: true, size: 11, fill: "#d94801" },
          value: changed(chart.outputs, "outputs") }
      ]
    };
    element.uplot = new uPlot(options, [t, chart.run, chart.environment, chart.outputs], element);
  }

  document.querySelectorAll("[data-chart]").forEach(function (element) {
    var kind = element.getAttribute("data-chart");
    if (kind === "layers") {
      var chart = data(element.getAttribute("data-source"));
      if (chart && chart.names.length) layerChart(element, chart);
    } else if (kind === "timeline") {
      var points = data("timeline-data");
      if (points) timelineChart(element, points);
    }
  });
})();
