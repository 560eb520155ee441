// The plan page's gate block re-polls every 10 s (hx-trigger on #plan-gate). A swap would
// throw away what someone is typing (a justification, an attestation) or close the section
// they opened to read the numbers, so the poll skips its turn while they do either (checked
// here on htmx:beforeRequest: an htmx trigger filter would need eval, which the CSP forbids).
(function () {
  "use strict";

  window.planGateIdle = function () {
    var block = document.getElementById("plan-gate");
    if (!block) {
      return false;
    }
    if (block.querySelector("details[open]")) {
      return false;
    }
    var active = document.activeElement;
    if (active && block.contains(active) && active.matches("input, textarea, select")) {
      return false;
    }
    return !Array.prototype.some.call(block.querySelectorAll("textarea, input[type=text]"),
      function (input) { return input.value !== input.defaultValue; });
  };

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (event.detail.elt.id === "plan-gate" && !window.planGateIdle()) {
      event.preventDefault();
    }
  });
})();
