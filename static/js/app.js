// Behaviour every dashboard page shares. The Content-Security-Policy allows script only from
// static files (no inline handlers, no eval), so what a template once said inline lives here.
(function () {
  "use strict";

  // htmx polls (hx-trigger="every 5s") skip their turn while the tab is hidden. htmx's own
  // trigger filters ("every 5s [document.visibilityState === 'visible']") are compiled with
  // Function(), which the policy forbids; a page can add its own conditions the same way
  // (plans.js does).
  document.addEventListener("htmx:beforeRequest", function (event) {
    var trigger = event.detail.elt.getAttribute("hx-trigger") || "";
    if (/^\s*every\s/.test(trigger) && document.visibilityState !== "visible") {
      event.preventDefault();
    }
  });

  // The top bar's menu on a phone (app.css folds it below 640 px once the bar has-menu):
  // without this script the menu simply stays open. Escape closes it and gives the focus
  // back to the button.
  var toggle = document.querySelector(".topbar .nav-toggle");
  if (toggle) {
    var bar = toggle.closest(".topbar");
    var setOpen = function (open) {
      toggle.setAttribute("aria-expanded", String(open));
      bar.classList.toggle("menu-open", open);
    };
    bar.classList.add("has-menu");
    toggle.addEventListener("click", function () {
      setOpen(toggle.getAttribute("aria-expanded") !== "true");
    });
    bar.addEventListener("keydown", function (event) {
      if (event.key === "Escape" && bar.classList.contains("menu-open")) {
        setOpen(false);
        toggle.focus();
      }
    });
  }

  // A field that selects all of its text when focused (a token's secret, to copy it).
  document.addEventListener("focusin", function (event) {
    if (event.target.matches && event.target.matches("input[data-select-on-focus]")) {
      event.target.select();
    }
  });
})();
