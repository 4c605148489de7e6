// The comparison page's best-so-far chart: the figure is built on the server (apps/dashboard/comparison.py).
(function () {
  "use strict";
  function draw() {
    const element = document.getElementById("compare-curves");
    const source = document.getElementById("compare-figure");
    if (!element || !source || !window.Plotly) return;
    const figure = JSON.parse(source.textContent);
    window.Plotly.newPlot(element, figure.data, figure.layout, { displaylogo: false, responsive: true }).then(() => {
      document.body.dataset.charts = "loaded";
    });
  }
  document.addEventListener("DOMContentLoaded", draw);
})();
