// The dashboard's two spend charts, drawn from the page's json_script data (the same figures as the tables beside them).
(() => {
  const css = getComputedStyle(document.documentElement);
  const brand = css.getPropertyValue("--brand").trim() || "#2450d3";
  const money = (value, digits = 2) =>
    "$" + value.toLocaleString(undefined, { minimumFractionDigits: digits, maximumFractionDigits: digits });

  function bars(canvasId, dataId, labelKey, horizontal) {
    const canvas = document.getElementById(canvasId);
    const rows = JSON.parse(document.getElementById(dataId).textContent);
    if (!canvas || !rows.length || typeof Chart === "undefined") return;
    new Chart(canvas, {
      type: "bar",
      data: {
        labels: rows.map((row) => row[labelKey]),
        datasets: [{ label: "Spend ($)", data: rows.map((row) => row.cost), backgroundColor: brand }],
      },
      options: {
        indexAxis: horizontal ? "y" : "x",
        maintainAspectRatio: false,
        plugins: { legend: { display: false }, tooltip: { callbacks: { label: (item) => money(item.raw) } } },
        scales: {
          [horizontal ? "x" : "y"]: { beginAtZero: true, ticks: { callback: (value) => money(value, 0) } },
          [horizontal ? "y" : "x"]: { ticks: { autoSkip: false } },  // every user, every week
        },
      },
    });
  }

  bars("spend-by-week-chart", "spend-by-week", "week", false);
  bars("spend-by-user-chart", "spend-by-user", "user", true);
})();
