// dataloader's dashboard: a job's page follows the job live (Server-Sent Events), and stops
// following it while the tab is hidden.
(function () {
  "use strict";
  var live = document.querySelector("[data-live]");
  if (!live) return;
  var source = null;
  var status = document.getElementById("job-status");
  var bar = document.getElementById("job-progress");
  var counts = document.getElementById("job-progress-text");

  function show(state) {
    status.textContent = state.status;
    status.className = "status " + state.status;
    if (state.total !== null && state.total !== undefined && state.done !== null && state.done !== undefined) {
      bar.max = state.total;
      bar.value = state.done;
      bar.hidden = false;
      counts.textContent = state.done + "/" + state.total;
    }
    if (state.finished) {
      stop();
      window.location.reload(); // the result, the error and the whole journal
    }
  }

  function start() {
    if (source) return;
    source = new EventSource(live.getAttribute("data-live"));
    source.addEventListener("state", function (event) { show(JSON.parse(event.data)); });
  }

  function stop() {
    if (source) { source.close(); source = null; }
  }

  document.addEventListener("visibilitychange", function () {
    if (document.hidden) { stop(); } else { start(); }
  });
  if (!document.hidden) start();
})();
