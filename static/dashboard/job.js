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

  function drawChart() {
    const element = byId("job-metrics-chart");
    if (!window.Plotly) return;
    const points = state.metrics_points;
    if (!points.length) {
      element.textContent = "No metrics reported yet.";
      element.classList.add("muted");
      return;
    }
    element.classList.remove("muted");
    const keys = Array.from(new Set(points.flatMap((p) => Object.keys(p)))).filter((k) => k !== "step");
    const traces = keys.map((key) => ({
      x: points.map((p, i) => (p.step !== undefined ? p.step : i)),
      y: points.map((p) => p[key]),
      name: key,
      mode: "lines",
      // Loss-like curves by default; the rest (learning rate, tokens/s) a legend click away.
      visible: key.includes("loss") || keys.length === 1 ? true : "legendonly",
    }));
    window.Plotly.react(element, traces, {
      template: "none",
      height: 280,
      margin: { l: 50, r: 10, t: 10, b: 40 },
      xaxis: { title: { text: "step" }, gridcolor: "#e4e7eb" },
      yaxis: { gridcolor: "#e4e7eb" },
      legend: { orientation: "h", y: -0.25 },
      font: { family: "system-ui, sans-serif", size: 12 },
    }, { displaylogo: false, responsive: true });
  }

  const schedule = () => { if (frame === null) frame = requestAnimationFrame(render); };

  function onState(text) {
    const badge = byId("live-state");
    badge.textContent = text;
    badge.className = `live live-${text.replace(/\s+/g, "-")}`;
    document.body.dataset.live = text;
  }

  window.rsiJobSocket = new live.LiveSocket(config.ws, {
    snapshot: (snapshot) => { state = live.jobStateFrom(snapshot); window.rsiJobState = state; schedule(); },
    event: (event, payload) => { if (state && live.applyJobEvent(state, event, payload)) schedule(); },
    state: onState,
  });
  document.addEventListener("DOMContentLoaded", () => { if (state) schedule(); });
})();
