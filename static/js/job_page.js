/* The job page's live charts (Chart.js, vendored) and the small things that keep the htmx-polled part pleasant.
 *
 * The charts ask /jobs/<id>/series.json once for the whole history (already downsampled by the server), then every
 * few seconds for what is newer than the cursor the last answer gave (`until`), and append it; they stop when the
 * job has ended. One dataset per node, coloured as the node's swatch in the nodes table.
 */
(() => {
  "use strict";

  // --- htmx swaps the live part every 2 s: keep open log tails open and scrolled to their end ---
  let openLogs = new Set();
  document.addEventListener("htmx:beforeSwap", () => {
    openLogs = new Set([...document.querySelectorAll("details.log-tail[open]")].map((d) => d.id));
  });
  document.addEventListener("htmx:afterSettle", () => {
    for (const id of openLogs) {
      const details = document.getElementById(id);
      if (details) {
        details.open = true;
        const pre = details.querySelector("pre");
        if (pre) pre.scrollTop = pre.scrollHeight;
      }
    }
  });
  document.addEventListener("toggle", (event) => {
    const pre = event.target.matches?.("details.log-tail[open]") && event.target.querySelector("pre");
    if (pre) pre.scrollTop = pre.scrollHeight;
  }, true);

  // --- charts ---
  const section = document.getElementById("charts");
  if (!section || !window.Chart) return;

  const PALETTE = ["#2450d3", "#1f8a4c", "#c0392b", "#b7791f", "#7b3fc4", "#0f8b8d", "#d4477f", "#5b6475"];
  const MAX_POINTS = 500; // per dataset, as the server's downsampling
  const MIN_TIME_SPAN_MS = 60_000; // a time axis spans at least a minute, so no two of its ticks read the same
  const POLL_MS = 3000;
  const HIDDEN_POLL_MS = 15000; // a background tab needs no fresh charts
  const url = section.dataset.seriesUrl;
  const status = document.getElementById("charts-status");
  const empty = document.getElementById("charts-empty");
  const grid = section.querySelector(".plot-grid");
  let until = null;
  let active = section.dataset.active === "true";

  // 24-hour, as the timeline beside the charts writes its times (a 12-hour locale would read "09:50:12 PM").
  const clock = (ms) => new Date(ms).toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23"});
  const color = (index) => PALETTE[index % PALETTE.length];

  function widenTimeSpan(scale) {
    // Chart.js widens a zero span by 5 % of the value itself: days, for times in ms. Span a minute around the data.
    const {min, max} = scale.getMinMax(true);
    if (!Number.isFinite(min) || !Number.isFinite(max) || max - min >= MIN_TIME_SPAN_MS) return;
    const middle = (max + min) / 2;
    scale.min = middle - MIN_TIME_SPAN_MS / 2;
    scale.max = middle + MIN_TIME_SPAN_MS / 2;
  }

  function makeChart(canvas) {
    const metric = canvas.dataset.metric;
    const unit = canvas.dataset.unit ? ` ${canvas.dataset.unit}` : "";
    const byStep = metric === "loss";
    return new Chart(canvas, {
      type: "line",
      data: {datasets: []},
      options: {
        animation: false,
        parsing: false,
        normalized: true,
        responsive: true,
        maintainAspectRatio: false,
        interaction: {mode: "nearest", axis: "x", intersect: false},
        elements: {
          // A line needs two points: a lone sample is drawn as a dot.
          point: {radius: (ctx) => (ctx.dataset.data.length === 1 ? 3 : 0), hitRadius: 6, hoverRadius: 3},
          line: {borderWidth: 2, tension: 0.15},
        },
        scales: {
          x: {
            type: "linear",
            bounds: "data",
            title: {display: byStep, text: "step"},
            afterDataLimits: byStep ? undefined : widenTimeSpan,
            ticks: {
              maxTicksLimit: 5,
              maxRotation: 0,
              autoSkip: true,
              autoSkipPadding: 16,
              precision: 0,
              callback: byStep ? (v) => v : (v) => clock(v),
            },
          },
          y: {beginAtZero: !byStep, ticks: {maxTicksLimit: 5, callback: (v) => `${+v.toFixed(3)}${unit}`}},
        },
        plugins: {
          legend: {position: "bottom", labels: {boxWidth: 12, boxHeight: 2}},
          tooltip: {
            callbacks: {
              title: (items) => (byStep ? `step ${items[0].parsed.x}` : clock(items[0].parsed.x)),
              label: (item) => `${item.dataset.label}: ${+item.parsed.y.toFixed(3)}${unit}`,
            },
          },
        },
      },
    });
  }

  const charts = [...section.querySelectorAll("canvas[data-metric]")].map((canvas) => ({
    metric: canvas.dataset.metric,
    chart: makeChart(canvas),
    box: canvas.closest(".plot"),
    note: canvas.closest("figure").querySelector(".plot-note"),
  }));

  function datasetFor(chart, label, index) {
    let dataset = chart.data.datasets.find((d) => d.label === label);
    if (!dataset) {
      dataset = {label, data: [], borderColor: color(index), backgroundColor: color(index), spanGaps: false};
      chart.data.datasets.push(dataset);
    }
    return dataset;
  }

  function append(dataset, points) {
    dataset.data.push(...points);
    while (dataset.data.length > MAX_POINTS) {
      // Halve the resolution of what is there, keeping the newest point.
      const last = dataset.data.length - 1;
      dataset.data = dataset.data.filter((_, i) => i % 2 === 1 || i === last);
    }
  }

  function apply(data) {
    until = data.until || until;
    for (const {metric, chart, box, note} of charts) {
      if (metric === "loss") {
        const dataset = datasetFor(chart, "loss (chief)", 0);
        const lastStep = dataset.data.length ? dataset.data[dataset.data.length - 1].x : -Infinity;
        append(dataset, data.loss.filter((p) => p.step > lastStep).map((p) => ({x: p.step, y: p.loss})));
      } else {
        data.nodes.forEach((node, index) => {
          const points = node.points.map((p) => ({x: Date.parse(p.at), y: p[metric]}));
          append(datasetFor(chart, node.name, index), points);
        });
      }
      const hasData = chart.data.datasets.some((d) => d.data.some((p) => p.y !== null));
      note.hidden = hasData;
      box.hidden = !hasData; // an empty frame of axes says less than the note
      chart.update("none");
    }
    const anything = data.nodes.some((n) => n.points.length) || data.loss.length || charts.some(
      ({chart}) => chart.data.datasets.some((d) => d.data.length),
    );
    if (anything) {
      grid.hidden = false;
      empty.hidden = true;
    }
  }

  async function poll() {
    try {
      const query = until ? `?since=${encodeURIComponent(until)}` : "";
      const response = await fetch(url + query, {headers: {Accept: "application/json"}, credentials: "same-origin"});
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const data = await response.json();
      apply(data);
      active = data.active;
      status.textContent = active ? `live · updated ${clock(Date.now())}` : "the job has ended: final figures";
    } catch (error) {
      status.textContent = `could not update the charts (${error.message}); retrying`;
    }
    if (active) setTimeout(poll, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
  }

  grid.hidden = true;
  poll();
})();
