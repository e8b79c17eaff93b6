/* The records page's epoch time against workers chart (Anwar et al. Figs. 11–15, FC² Figs. 8–11), drawn from the
 * page's json_script data (recommender.views.epoch_time_series); the visually hidden table beside it holds the same
 * numbers. A failed run has no epoch time: a gap in its line and a ✕ in the line's colour along the top edge, never 0.
 */
(() => {
  "use strict";

  const canvas = document.getElementById("epoch-times");
  const data = document.getElementById("epoch-time-series");
  if (!canvas || !data || typeof Chart === "undefined") return;
  const chart = JSON.parse(data.textContent);
  const PALETTE = ["#2450d3", "#1f8a4c", "#c0392b", "#b7791f", "#7b3fc4", "#0f8b8d", "#d4477f", "#5b6475"];
  const seconds = (value) => value.toLocaleString(undefined, { maximumFractionDigits: 1 }) + " s";
  const workers = (n) => `${n} worker${n === 1 ? "" : "s"}`;

  const datasets = chart.series.map((series, i) => {
    const colour = PALETTE[i % PALETTE.length];
    const failed = series.failed_workers.length ? ` (✕ failed at ${series.failed_workers.join(", ")} workers)` : "";
    return {
      label: series.label + failed,
      data: series.points.map((p) => ({ x: p.workers, y: p.epoch_time_s, runs: p.runs, failed: p.failed })),
      failedWorkers: series.failed_workers,
      borderColor: colour,
      backgroundColor: colour,
      spanGaps: false, // null epoch time = failed run: a gap, never a line through it
      pointRadius: 4,
    };
  });

  // A ✕ per failed run at its worker count along the chart's top edge, one row per series so they never overlap.
  const failedMarks = {
    id: "failedMarks",
    afterDatasetsDraw(c) {
      const { ctx, chartArea, scales } = c;
      ctx.save();
      ctx.font = "bold 13px system-ui, sans-serif";
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      c.data.datasets.forEach((dataset, i) => {
        if (!c.isDatasetVisible(i)) return;
        ctx.fillStyle = dataset.borderColor;
        const y = chartArea.top + 2 + 14 * i;
        for (const w of dataset.failedWorkers) ctx.fillText("✕", scales.x.getPixelForValue(w), y);
      });
      ctx.restore();
    },
  };

  new Chart(canvas, {
    type: "line",
    data: { datasets },
    plugins: [failedMarks],
    options: {
      layout: { padding: { right: 8 } }, // room for a ✕ at the last worker count
      scales: {
        x: { type: "linear", title: { display: true, text: "workers" }, ticks: { stepSize: 1, precision: 0 } },
        y: { beginAtZero: true, title: { display: true, text: "epoch time (s)" } },
      },
      plugins: {
        tooltip: {
          callbacks: {
            label: (item) => {
              const p = item.raw;
              const runs = p.runs > 1 ? ` (mean of ${p.runs} runs)` : "";
              const note = p.failed ? ` (${p.failed} of ${p.runs} runs failed)` : runs;
              return `${chart.series[item.datasetIndex].label}: ${seconds(p.y)} at ${workers(p.x)}${note}`;
            },
            footer: (items) => {
              const failed = items.flatMap((item) => item.dataset.failedWorkers);
              return failed.length ? `failed runs (gaps, ✕): ${[...new Set(failed)].join(", ")} workers` : "";
            },
          },
        },
      },
    },
  });
})();
