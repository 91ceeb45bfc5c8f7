// trigger-bridge console: live refresh from /ui/events, local times, countdowns, copy buttons.
// The pages work without it (forms post, links navigate); this only adds liveness and comfort.
(function () {
  "use strict";
  function localize(root) {
    root.querySelectorAll("time[datetime]").forEach(function (t) {
      var d = new Date(t.getAttribute("datetime"));
      if (isNaN(d)) return;
      t.textContent = d.toLocaleString();
      t.title = t.getAttribute("datetime").replace("T", " ").replace("Z", " UTC");
    });
  }
  function countdowns() {
    var now = Date.now();
    document.querySelectorAll("[data-deadline]").forEach(function (el) {
      var ms = new Date(el.getAttribute("data-deadline")) - now;
      if (isNaN(ms)) return;
      if (ms <= 0) { el.textContent = "due"; return; }
      var s = Math.floor(ms / 1000), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
      el.textContent = "in " + (h ? h + " h " : "") + (h || m ? m + " min " : "") + (s % 60) + " s";
    });
  }
  function live() {
    var badge = document.getElementById("live-state");
    if (!window.EventSource || !badge) return;
    var es = new EventSource("/ui/events");
    es.onopen = function () { badge.className = "live-on"; badge.title = "live: this page updates itself"; };
    es.onerror = function () { badge.className = "live-off"; badge.title = "live updates reconnecting"; };
    es.addEventListener("change", function () {
      if (window.htmx) htmx.trigger(document.body, "tb-change");
    });
  }
  document.addEventListener("click", function (e) {
    var b = e.target.closest("[data-copy]");
    if (!b || !navigator.clipboard) return;
    navigator.clipboard.writeText(b.getAttribute("data-copy")).then(function () { b.textContent = "copied"; setTimeout(function () { b.textContent = "copy"; }, 1200); });
  });
  document.addEventListener("change", function (e) {
    var all = e.target.closest("[data-select-all]");
    if (!all) return;
    document.querySelectorAll("input[name=ids]").forEach(function (c) { c.checked = all.checked; });
  });
  document.addEventListener("DOMContentLoaded", function () {
    // The page an action answered: show its own address, so a reload reads it instead of acting again.
    var back = document.body.getAttribute("data-replace-url");
    if (back && window.history && history.replaceState) history.replaceState(null, "", back);
    localize(document);
    countdowns();
    setInterval(countdowns, 1000);
    live();
    document.body.addEventListener("htmx:afterSwap", function () { localize(document); countdowns(); });
    // A live refresh must not throw away what the viewer is doing: while a row is selected, or a
    // control inside the live region has the focus, the region keeps its content (the next change
    // after that refreshes it).
    document.body.addEventListener("htmx:beforeRequest", function (e) {
      var el = e.detail.elt;
      if (el.id !== "live") return;
      var busy = el.querySelector("input[name=ids]:checked") ||
        (el.contains(document.activeElement) && document.activeElement.matches("input, select, textarea"));
      if (busy) e.preventDefault();
    });
    document.body.addEventListener("htmx:configRequest", function (e) {
      e.detail.headers["X-CSRF-Token"] = document.body.getAttribute("data-csrf") || "";
    });
  });
})();
