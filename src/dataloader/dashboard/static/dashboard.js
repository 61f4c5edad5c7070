// dataloader's dashboard: a job's page follows the job (status, progress, cancel), the overview
// and a queue's page the queues (a queue's Pause/Resume too), live (Server-Sent Events); a
// hidden tab stops following and starts again when shown.
(function () {
  "use strict";
  var streams = [];

  function follow(url, event, handle) {
    var stream = { source: null };
    stream.start = function () {
      if (stream.source) return;
      stream.source = new EventSource(url);
      stream.source.addEventListener(event, function (e) { handle(e.data, stream); });
    };
    stream.stop = function () {
      if (stream.source) { stream.source.close(); stream.source = null; }
    };
    streams.push(stream);
    return stream;
  }

  var job = document.querySelector("[data-live]");
  if (job) {
    var status = document.getElementById("job-status");
    var bar = document.getElementById("job-progress");
    var counts = document.getElementById("job-progress-text");
    var json = document.getElementById("job-progress-json");
    var cancel = document.getElementById("job-cancel");
    var cancelRequested = document.getElementById("job-cancel-requested");
    var waiting = document.getElementById("waiting-section");
    follow(job.getAttribute("data-live"), "state", function (data, stream) {
      var state = JSON.parse(data);
      status.textContent = state.status;
      status.className = "status " + state.status;
      if (waiting && state.status !== "queued") waiting.hidden = true; // it runs, or ended
      if (state.total !== null && state.total !== undefined &&
          state.done !== null && state.done !== undefined) {
        bar.max = state.total;
        bar.value = state.done;
        bar.hidden = false;
        counts.textContent = state.done + "/" + state.total;
      }
      // the progress as the server formats it (masked, escaped): the same as the bar's
      json.textContent = state.progress_text;
      json.hidden = !state.has_progress;
      if (state.cancel_requested) {
        if (cancel) cancel.hidden = true;
        cancelRequested.hidden = false;
      }
      if (state.finished) {
        stream.stop();
        streams.splice(streams.indexOf(stream), 1);
        window.location.reload(); // the result, the error and the whole journal
      }
    });
  }

  // the overview's queues, a queue's facts: the server renders each fragment (escaped like
  // every page) once for all its viewers
  document.querySelectorAll("[data-live-system]").forEach(function (view) {
    follow(view.getAttribute("data-live-system"), "system", function (html) {
      view.innerHTML = html;
      followPause(view);
    });
  });

  // a queue paused or resumed elsewhere (the API, the CLI, another tab): its button follows
  function followPause(view) {
    var state = view.querySelector("[data-paused]");
    var toggle = document.getElementById("queue-toggle");
    if (!state || !toggle) return;
    var paused = state.getAttribute("data-paused") === "true";
    toggle.action = toggle.getAttribute(paused ? "data-resume" : "data-pause");
    toggle.querySelector("button").textContent = paused ? "Resume" : "Pause";
  }

  document.addEventListener("visibilitychange", function () {
    streams.forEach(function (s) { if (document.hidden) { s.stop(); } else { s.start(); } });
  });
  if (!document.hidden) streams.forEach(function (s) { s.start(); });
})();
