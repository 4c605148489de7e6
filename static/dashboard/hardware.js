/* The job page's hardware chart: plotly JSON built by the server (apps/dashboard/charts.py
 * hardware_figure). Drawn from the page once the deferred plotly.js has loaded, then fetched
 * again (config.hardware: the chart and the peak summary) whenever the job's websocket brings a
 * new sample (job.js calls refresh), as the run page's charts are; never on a timer. */
(function () {
  "use strict";
  const REFRESH_MS = 1000; // samples come every 10 s by default: one fetch each, a burst coalesced
  const config = JSON.parse(document.getElementById("page-config").textContent);
  const byId = (id) => document.getElementById(id);
  let timer = null;
  let fetching = false;
  let again = false;
  let latest = JSON.parse(byId("hardware-figure").textContent); // the page's, until a fresher one

  function draw() {
    const el = byId("job-hardware-chart");
    if (!el || !window.Plotly) return;
    window.Plotly.react(el, latest.data, latest.layout, { displaylogo: false, responsive: true });
  }

  // Python's str() of the summary's floats (1234.0, not 1234), as the template prints them.
  const mib = (v) => (v === null || v === undefined ? "—" : Number.isInteger(v) ? v.toFixed(1) : String(v));

  // The same words as the template (templates/dashboard/job_detail.html), from the fresh summary.
  function summarise(summary) {
    byId("hw-peak-ram").textContent = mib(summary.peak_ram_mib);
    byId("hw-gpus").textContent = (summary.gpus || [])
      .map((g) => ` · GPU ${g.index} peak ${mib(g.memory_mib)} / ${mib(g.memory_total_mib)} MiB`).join("");
    const oom = byId("hw-oom");
    oom.replaceChildren();
    if (summary.oom) {
      const strong = document.createElement("strong");
      strong.className = "error";
      strong.textContent = "out of memory";
      oom.append(" · ", strong);
    }
  }

  async function load() {
    timer = null;
    if (fetching) { again = true; return; }
    fetching = true;
    try {
      const response = await fetch(config.hardware, { headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const body = await response.json();
      latest = body.figure;
      draw();
      summarise(body.summary);
    } finally {
      fetching = false;
      if (again) { again = false; refresh(); }
    }
  }

  function refresh() {
    if (timer === null) timer = window.setTimeout(load, REFRESH_MS);
  }

  window.rsiHardware = { refresh };
  window.addEventListener("load", draw);
})();
