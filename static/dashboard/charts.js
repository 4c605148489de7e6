/* Chart helpers shared by the run page and the job page (plotly.js, vendored):
 * smoothing, a log-scale toggle, one y axis per metric, and ticks that suit a few points.
 *
 * The figures themselves come from the server (run page: apps/dashboard/charts.py) or from the
 * job's metric points (job page); these helpers only change how they are drawn, in the browser,
 * so moving a slider never costs a request.
 */
(function () {
  "use strict";

  // TensorBoard's smoothing: an exponential moving average, debiased so the first points are
  // not pulled towards zero. weight 0 = raw, 0.99 = very smooth.
  function smooth(ys, weight) {
    if (!(weight > 0)) return ys.slice();
    let last = 0;
    let count = 0;
    return ys.map((y) => {
      if (typeof y !== "number" || !Number.isFinite(y)) return y;
      last = last * weight + (1 - weight) * y;
      count += 1;
      return last / (1 - Math.pow(weight, count));
    });
  }

  // Traces flagged ``meta: "smoothable"`` (or every line trace when ``all``) get a smoothed copy;
  // the raw one stays, faint, so outliers remain visible.
  function withSmoothing(traces, weight, all) {
    if (!(weight > 0)) return traces;
    const out = [];
    for (const trace of traces) {
      const eligible = all ? (trace.mode || "").includes("lines") : trace.meta === "smoothable";
      if (!eligible || !Array.isArray(trace.y) || trace.y.length < 2) { out.push(trace); continue; }
      const raw = { ...trace, opacity: 0.3, showlegend: false, hoverinfo: "skip" };
      delete raw.hovertemplate; // plotly reads a present key even when undefined
      const smoothed = { ...trace, y: smooth(trace.y, weight), mode: "lines", name: `${trace.name} (smoothed)`,
                         legendgroup: trace.legendgroup || trace.name };
      delete smoothed.marker;
      if (trace.marker && trace.marker.color) smoothed.line = { ...(trace.line || {}), color: trace.marker.color };
      out.push(raw, smoothed);
    }
    return out;
  }

  // Every y axis of the layout to log or linear. Scores of 0 disappear on a log axis; that is
  // what a log axis means, and the toggle is one click back.
  function withLogScale(layout, on) {
    const next = { ...layout };
    for (const key of Object.keys(layout)) {
      if (/^yaxis\d*$/.test(key) && layout[key].type !== "category") {
        next[key] = { ...layout[key], type: on ? "log" : "linear", autorange: true };
      }
    }
    if (on) {
      // plotly places shapes and annotations on a log axis by log10 of the value (its docs):
      // the θ0 and reference lines must move with the axis, or they end up far off the chart.
      const log = (v) => (v > 0 ? Math.log10(v) : null);
      next.shapes = (layout.shapes || []).filter((s) => s.yref !== "y" || (s.y0 > 0 && s.y1 > 0))
        .map((s) => (s.yref === "y" ? { ...s, y0: log(s.y0), y1: log(s.y1) } : s));
      next.annotations = (layout.annotations || []).filter((a) => a.yref !== "y" || a.y > 0)
        .map((a) => (a.yref === "y" ? { ...a, y: log(a.y) } : a));
    }
    return next;
  }

  // Integer steps: with few distinct values, tick exactly those (no 1.5, 1.75 ... between two
  // steps, no ticks at all around a single one).
  function stepAxis(values, title) {
    const distinct = Array.from(new Set(values.filter((v) => typeof v === "number"))).sort((a, b) => a - b);
    const axis = { title: { text: title }, gridcolor: "#e4e7eb", zeroline: false, tickformat: "d" };
    if (distinct.length && distinct.length <= 10) {
      axis.tickmode = "array";
      axis.tickvals = distinct;
      const low = distinct[0];
      const high = distinct[distinct.length - 1];
      const pad = Math.max(1, (high - low) * 0.05);
      axis.range = [low - pad, high + pad];
    }
    return axis;
  }

  // A small toolbar above a chart: smoothing slider and log toggle. ``onChange(options)`` is
  // called with {smoothing, log} whenever either changes.
  function toolbar(container, options, onChange) {
    const state = { smoothing: 0, log: false };
    const bar = document.createElement("div");
    bar.className = "chart-tools";
    if (options.smoothing) {
      const label = document.createElement("label");
      label.textContent = "smoothing ";
      const input = document.createElement("input");
      Object.assign(input, { type: "range", min: "0", max: "0.95", step: "0.05", value: "0" });
      input.className = "chart-smoothing";
      input.setAttribute("aria-label", "smoothing");
      const shown = document.createElement("span");
      shown.className = "muted";
      shown.textContent = "0";
      input.addEventListener("input", () => {
        state.smoothing = Number(input.value);
        shown.textContent = input.value;
        onChange({ ...state });
      });
      label.append(input, " ", shown);
      bar.append(label);
    }
    if (options.log) {
      const label = document.createElement("label");
      const input = document.createElement("input");
      input.type = "checkbox";
      input.className = "chart-log";
      input.addEventListener("change", () => { state.log = input.checked; onChange({ ...state }); });
      label.append(input, " log scale");
      bar.append(label);
    }
    container.prepend(bar);
    return state;
  }

  window.rsiCharts = { smooth, withSmoothing, withLogScale, stepAxis, toolbar };
})();
