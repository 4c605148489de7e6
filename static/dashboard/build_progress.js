// The minibench build's bar at the top of every page (templates/dashboard/_build_progress.html):
// polls the progress JSON and reloads the page once the build is installed, so the run shows.
(function () {
  "use strict";
  const box = document.getElementById("build-progress");
  if (!box) return;
  const field = (name) => box.querySelector(`[data-field="${name}"]`);
  const duration = (s) => (s < 90 ? `${s} s` : `${Math.round(s / 60)} min`);

  function show(progress) {
    const percent = Math.round(progress.fraction * 100);
    field("fill").style.width = `${percent}%`;
    field("percent").textContent = `${percent}%`;
    field("state").textContent = progress.state;
    field("stage").textContent = progress.stage;
    field("detail").textContent = progress.detail ? `: ${progress.detail}` : "";
    field("eta").textContent = progress.eta_seconds ? `, about ${duration(progress.eta_seconds)} left` : "";
    box.className = `buildprogress state-${progress.state}`;
  }

  async function poll() {
    try {
      const response = await fetch(box.dataset.url, { headers: { Accept: "application/json" } });
      if (response.ok) {
        const progress = await response.json();
        if (!progress.state || progress.state === "ready") {
          window.location.reload();
          return;
        }
        show(progress);
        if (progress.state === "failed" || progress.state === "interrupted") return;
      }
    } catch (error) {
      // The server restarting: try again on the next tick.
    }
    window.setTimeout(poll, 2000);
  }
  window.setTimeout(poll, 2000);
})();
