// Draws every chart a page embeds as <div data-plotly-figure="ID"> plus a json_script #ID.
// Loaded with `defer` after plotly.min.js, so both have run before DOMContentLoaded.
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

  document.addEventListener("DOMContentLoaded", function () {
    if (!window.Plotly) {
      // Say why the chart area is empty instead of failing silently.
      document.querySelectorAll("[data-plotly-figure]").forEach(function (element) {
        element.textContent = "The chart library did not load; the numbers are in the table below.";
      });
      return;
    }
    document.querySelectorAll("[data-plotly-figure]").forEach(draw);
  });
})();
