/* The workbench pages: a run's experiments in parallel coordinates (figure built on the server,
 * apps/dashboard/workbench.py) and training curves overlaid across experiments or runs, with the
 * metric, the step or time axis and smoothing chosen here. plotly.js is the vendored copy. */
(function () {
  "use strict";
  const PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
  const byId = (id) => document.getElementById(id);
  const CONFIG = { displaylogo: false, responsive: true };

  function drawParcoords() {
    const element = byId("parcoords");
    const source = byId("parcoords-figure");
    if (!element || !source || !window.Plotly) return;
    const figure = JSON.parse(source.textContent);
    if (!figure) return;
    window.Plotly.newPlot(element, figure.data, figure.layout, CONFIG).then(() => {
      document.body.dataset.parcoords = "loaded";
    });
  }

  function setupCurves() {
    const element = byId("curves-chart");
    const source = byId("curve-data");
    if (!element || !source || !window.Plotly || !window.rsiCharts) return;
    const series = JSON.parse(source.textContent) || [];
    const metricSelect = byId("curve-metric");
    const axisSelect = byId("curve-axis");
    const note = byId("curve-note");
    const keys = Array.from(new Set(series.flatMap((s) => s.points.flatMap((p) => Object.keys(p)))))
      .filter((k) => k !== "step" && k !== "elapsed_s");
    keys.sort((a, b) => Number(b.includes("loss")) - Number(a.includes("loss")) || a.localeCompare(b));
    keys.forEach((key) => metricSelect.append(new Option(key, key)));
    let options = { smoothing: 0, log: false };
    window.rsiCharts.toolbar(byId("curve-tools"), { smoothing: true, log: true }, (changed) => {
      options = changed;
      draw();
    });

    function draw() {
      const metric = metricSelect.value;
      const axis = axisSelect.value;
      const picked = new Set(Array.from(document.querySelectorAll(".curve-pick:checked")).map((b) => Number(b.value)));
      let untimed = 0;
      const traces = [];
      series.forEach((one, index) => {
        if (!picked.has(index)) return;
        const rows = one.points.filter((p) => typeof p[metric] === "number");
        const timed = rows.filter((p) => typeof p[axis] === "number");
        if (axis !== "step" && timed.length < rows.length) untimed += 1;
        const usable = axis === "step" ? rows.map((p, i) => ({ ...p, step: p.step !== undefined ? p.step : i })) : timed;
        if (!usable.length) return;
        const colour = PALETTE[index % PALETTE.length];
        traces.push({
          x: usable.map((p) => p[axis]), y: usable.map((p) => p[metric]), name: one.label,
          mode: usable.length === 1 ? "markers" : "lines+markers", marker: { size: 4, color: colour },
          line: { color: colour }, hovertemplate: `${one.label}<br>${metric} %{y:.4g} at ${axis} %{x}<extra></extra>`,
        });
      });
      note.textContent = untimed
        ? `${untimed} series logged no time (trained before times were recorded): shown on the step axis only.`
        : "";
      const layout = {
        template: "none", height: 420, margin: { l: 64, r: 16, t: 16, b: 48 },
        xaxis: { title: { text: axis === "step" ? "step" : "seconds since the training started" }, gridcolor: "#e4e7eb" },
        yaxis: { title: { text: metric || "" }, gridcolor: "#e4e7eb", exponentformat: "power" },
        legend: { orientation: "h", y: -0.18 }, hovermode: "closest",
      };
      if (!traces.length) {
        element.textContent = keys.length ? "Nothing to draw for this choice." : "No training metrics recorded.";
        element.classList.add("muted");
        document.body.dataset.curves = "empty";
        return;
      }
      element.classList.remove("muted");
      window.Plotly.react(
        element,
        window.rsiCharts.withSmoothing(traces, options.smoothing, true),
        window.rsiCharts.withLogScale(layout, options.log),
        CONFIG,
      ).then(() => {
        document.body.dataset.curves = `${traces.length}`;
      });
    }

    metricSelect.addEventListener("change", draw);
    axisSelect.addEventListener("change", draw);
    document.querySelectorAll(".curve-pick").forEach((box) => box.addEventListener("change", draw));
    draw();
  }

  document.addEventListener("DOMContentLoaded", () => {
    drawParcoords();
    setupCurves();
  });
})();
