/* The job page's hardware chart: plotly JSON built by the server (apps/dashboard/charts.py
 * hardware_figure), drawn once the deferred plotly.js has loaded. */
(function () {
  "use strict";
  function draw() {
    const el = document.getElementById("job-hardware-chart");
    const data = document.getElementById("hardware-figure");
    if (!el || !data || !window.Plotly) return;
    const figure = JSON.parse(data.textContent);
    window.Plotly.newPlot(el, figure.data, figure.layout, { displaylogo: false, responsive: true });
  }
  window.addEventListener("load", draw);
})();
