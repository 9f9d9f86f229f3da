// Keeps a live run's admin page up to date: polls the run's live/ endpoint (JSON)
// while the run has not ended, appends new timeline rows to the page that shows the
// tail of the log, refreshes the summary and the actions panel, and reloads the page
// once when the run ends (so the projections and blobs show the final state).
(function () {
  "use strict";
  var root = document.getElementById("aaa-run");
  if (!root || root.dataset.status === "completed") { return; }
  var after = parseInt(root.dataset.after, 10) || 0;
  var until = parseInt(root.dataset.until, 10) || 0;
  var delay = parseInt(root.dataset.pollMs, 10) || 1000;
  var failures = 0;

  // The text as shown, whitespace collapsed: the same for the rendered panel and a
  // fresh one not yet in the page (innerText of a detached element is its raw text).
  function shownText(el) { return el.textContent.replace(/\s+/g, " ").trim(); }

  function setLive(name, value) {
    var nodes = root.querySelectorAll('[data-live="' + name + '"]');
    for (var i = 0; i < nodes.length; i++) { nodes[i].textContent = value; }
  }

  function apply(data) {
    ["label", "last_seq", "tokens", "cost", "ended", "duration", "model_calls", "tool_calls"]
      .forEach(function (k) { if (data[k] !== undefined && data[k] !== null) { setLive(k, String(data[k])); } });
    var status = document.getElementById("aaa-status");
    if (status) { status.className = "aaa-badge aaa-" + (data.outcome || data.status); }
    if (data.rows_html && data.rows_html.trim()) {
      var body = document.getElementById("aaa-rows");
      var tmp = document.createElement("tbody");
      tmp.innerHTML = data.rows_html;
      while (tmp.firstElementChild) {
        tmp.firstElementChild.classList.add("aaa-new");
        body.appendChild(tmp.firstElementChild);
      }
    }
    after = data.after;
    if (data.last_seq > after && (until === 0 || data.last_seq > until)) {
      var newer = document.getElementById("aaa-newer");
      if (newer) { newer.hidden = false; }
    }
    var actions = document.getElementById("aaa-actions");
    if (actions && data.actions_html) {
      // Keep what the user is typing: replace the panel only when it changed.
      var tmp2 = document.createElement("div");
      tmp2.innerHTML = data.actions_html;
      var fresh = tmp2.firstElementChild;
      if (fresh && shownText(fresh) !== shownText(actions) &&
          !actions.contains(document.activeElement)) {
        actions.replaceWith(fresh);
      }
    }
    root.dataset.status = data.status;
  }

  function poll() {
    var url = root.dataset.liveUrl + "?after=" + after + "&until=" + until +
      "&per=" + encodeURIComponent(root.dataset.per || "");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (data) {
        failures = 0;
        apply(data);
        if (data.status === "completed") {
          // The final state: reload once so projections and blobs show it too.
          window.setTimeout(function () { window.location.reload(); }, 300);
          return;
        }
        window.setTimeout(poll, delay);
      })
      .catch(function () {
        failures += 1;
        window.setTimeout(poll, Math.min(delay * Math.pow(2, failures), 30000));
      });
  }
  window.setTimeout(poll, delay);
})();
