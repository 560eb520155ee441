// Draws every chart a page embeds as <div data-plotly-figure="ID"> plus a json_script #ID:
// on load, and again inside whatever an htmx swap replaced (a live block re-rendering its
// charts as results arrive). Old plots are purged before a swap so no resize listener is left
// on a detached element. Loaded with `defer` after plotly.min.js.
(function () {
  "use strict";

  function draw(element) {
    var source = document.getElementById(element.dataset.plotlyFigure);
    if (!source) {
      return;
    }
    var figure = JSON.parse(source.textContent);
    window.Plotly.newPlot(element, figure.data, figure.layout, {
      responsive: true,
      displaylogo: false,
      modeBarButtonsToRemove: ["select2d", "lasso2d"],
    });
  }

  function drawIn(root) {
    var charts = root.querySelectorAll("[data-plotly-figure]:not(.js-plotly-plot)");
    if (!window.Plotly) {
      // Say why the chart area is empty instead of failing silently.
      charts.forEach(function (element) {
        element.textContent = "The chart library did not load; the numbers are in the table below.";
      });
      return;
    }
    charts.forEach(draw);
  }

  document.addEventListener("DOMContentLoaded", function () {
    drawIn(document);
  });
  document.addEventListener("htmx:beforeSwap", function (event) {
    if (window.Plotly && event.detail.target) {
      event.detail.target.querySelectorAll(".js-plotly-plot").forEach(function (element) {
        window.Plotly.purge(element);
      });
    }
  });
  // One swap may settle several elements; draw once, after the last of them.
  var pending = false;
  document.addEventListener("htmx:afterSettle", function () {
    if (pending) {
      return;
    }
    pending = true;
    window.setTimeout(function () {
      pending = false;
      drawIn(document);
    }, 0);
  });
})();
