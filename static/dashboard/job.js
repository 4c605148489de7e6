/* The job page: progress bar, metrics chart and log tail, live from ws/jobs/<uuid>/. */
(function () {
  "use strict";

  const live = window.rsiLive;
  const config = JSON.parse(document.getElementById("page-config").textContent);
  const byId = (id) => document.getElementById(id);
  let state = null;
  let frame = null;

  const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString() : "—");

  function render() {
    frame = null;
    if (!state) return;
    const job = state.job;
    const percent = Math.round(100 * (job.progress || 0));
    byId("job-progress-fill").style.width = `${percent}%`;
    byId("job-progress-text").textContent = `${percent}%`;
    const status = byId("job-status");
    status.textContent = job.status;
    status.className = `status status-${job.status}`;
    byId("job-worker").textContent = job.worker || "—";
    byId("job-started").textContent = fmtTime(job.started_at);
    byId("job-heartbeat").textContent = fmtTime(job.heartbeat_at);
    byId("job-finished").textContent = fmtTime(job.finished_at);
    byId("job-seconds").textContent = Number(job.resource_seconds || 0).toFixed(1);
    byId("job-error").textContent = job.error || "";
    const last = byId("job-metrics-last");
    last.replaceChildren(...Object.entries(job.metrics_last || {}).flatMap(([key, value]) => {
      const dt = document.createElement("dt");
      dt.textContent = key;
      const dd = document.createElement("dd");
      dd.textContent = typeof value === "number" ? String(Number(value.toPrecision(5))) : String(value);
      return [dt, dd];
    }));
    const log = byId("job-log");
    log.textContent = state.log.join("\n");
    if (byId("follow-log").checked) log.scrollTop = log.scrollHeight;
    drawChart();
  }

  // One row per metric, each with its own y axis: a loss of 2.3 and a learning rate of 1e-4 on
  // one axis would flatten one of them. Smoothing and log scale from the toolbar (charts.js).
  let chartOptions = { smoothing: 0, log: false };
  let toolbarMade = false;

  function drawChart() {
    const element = byId("job-metrics-chart");
    if (!window.Plotly || !window.rsiCharts) return;
    const charts = window.rsiCharts;
    if (!toolbarMade) {
      charts.toolbar(byId("job-metrics-tools"), { smoothing: true, log: true }, (options) => {
        chartOptions = options;
        drawChart();
      });
      toolbarMade = true;
    }
    const points = state.metrics_points;
    if (!points.length) {
      element.textContent = "No metrics reported yet.";
      element.classList.add("muted");
      return;
    }
    element.classList.remove("muted");
    const keys = Array.from(new Set(points.flatMap((p) => Object.keys(p)))).filter((k) => k !== "step" && k !== "elapsed_s");
    // Loss-like curves first: they are what people open a training job for.
    keys.sort((a, b) => Number(b.includes("loss")) - Number(a.includes("loss")) || a.localeCompare(b));
    const steps = points.map((p, i) => (p.step !== undefined ? p.step : i));
    const where = config.experiment ? ` · ${config.experiment}` : "";
    const traces = keys.map((key, index) => {
      const rows = points.map((p, i) => [steps[i], p[key]]).filter(([, y]) => typeof y === "number");
      return {
        x: rows.map(([x]) => x),
        y: rows.map(([, y]) => y),
        name: key,
        mode: rows.length === 1 ? "markers" : "lines+markers",
        marker: { size: 5 },
        xaxis: "x",
        yaxis: index === 0 ? "y" : `y${index + 1}`,
        hovertemplate: `${key} %{y:.4g} at step %{x}${where}<extra></extra>`,
      };
    });
    const rowHeight = 170;
    const layout = {
      template: "none",
      height: 60 + rowHeight * keys.length,
      margin: { l: 64, r: 10, t: 10, b: 40 },
      grid: { rows: keys.length, columns: 1, pattern: "coupled", roworder: "top to bottom", ygap: 0.25 },
      xaxis: charts.stepAxis(steps, "step"),
      showlegend: false,
      hovermode: "closest",
      font: { family: "system-ui, sans-serif", size: 12 },
    };
    keys.forEach((key, index) => {
      layout[index === 0 ? "yaxis" : `yaxis${index + 1}`] = {
        title: { text: key, font: { size: 11 } }, gridcolor: "#e4e7eb", zeroline: false, automargin: true,
        exponentformat: "power",
      };
    });
    window.Plotly.react(
      element,
      charts.withSmoothing(traces, chartOptions.smoothing, true),
      charts.withLogScale(layout, chartOptions.log),
      { displaylogo: false, responsive: true },
    );
  }

  const schedule = () => { if (frame === null) frame = requestAnimationFrame(render); };

  function onState(text) {
    const badge = byId("live-state");
    badge.textContent = text;
    badge.className = `live live-${text.replace(/\s+/g, "-")}`;
    document.body.dataset.live = text;
  }

  // The hardware chart (hardware.js) is fetched again when a sample comes, when the job's status
  // changes (its last sample), and after a reconnect (samples may have come meanwhile).
  const hardware = () => { if (window.rsiHardware) window.rsiHardware.refresh(); };
  let snapshots = 0;

  window.rsiJobSocket = new live.LiveSocket(config.ws, {
    snapshot: (snapshot) => {
      state = live.jobStateFrom(snapshot);
      window.rsiJobState = state;
      schedule();
      if (snapshots++ > 0) hardware();
    },
    event: (event, payload) => {
      if (!state || !live.applyJobEvent(state, event, payload)) return;
      schedule();
      if (payload.hardware_sample || event === "job.updated") hardware();
    },
    state: onState,
  });
  document.addEventListener("DOMContentLoaded", () => { if (state) schedule(); });
})();
