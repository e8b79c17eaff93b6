// The dashboard's two spend charts, drawn from the page's json_script data (the same figures as the tables beside them).
// The amounts are catalogue-priced estimates (≈), as everywhere on the platform.
(() => {
  const css = getComputedStyle(document.documentElement);
  const brand = css.getPropertyValue("--brand").trim() || "#2450d3";
  // Dollars as the tables write them (common/numbers.py usd): whole dollars from $100, cents from $1, three
  // significant digits below, "< $0.0001" under that.
  const money = (value) => {
    const size = Math.abs(value);
    if (size === 0) return "$0";
    if (size < 0.0001) return "< $0.0001";
    if (size >= 100) return "$" + value.toLocaleString("en-US", { maximumFractionDigits: 0 });
    if (size >= 1) return "$" + value.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
    const text = value.toPrecision(3).replace(/0+$/, "");
    const decimals = Math.max(2, text.split(".")[1]?.length ?? 0);
    return "$" + value.toFixed(decimals);
  };
  // An axis tick: as few digits as tell the ticks apart (0.0005, 0.001, 0.0015 rather than $0 on every one).
  const tick = (value) => "$" + value.toLocaleString(undefined, { maximumSignificantDigits: 3 });

  function bars(canvasId, dataId, labelKey, horizontal) {
    const canvas = document.getElementById(canvasId);
    const rows = JSON.parse(document.getElementById(dataId).textContent);
    if (!canvas || !rows.length || typeof Chart === "undefined") return;
    new Chart(canvas, {
      type: "bar",
      data: {
        labels: rows.map((row) => row[labelKey]),
        datasets: [{ label: "Estimated spend ($)", data: rows.map((row) => row.cost), backgroundColor: brand }],
      },
      options: {
        indexAxis: horizontal ? "y" : "x",
        maintainAspectRatio: false,
        plugins: { legend: { display: false }, tooltip: { callbacks: { label: (item) => "≈ " + money(item.raw) } } },
        scales: {
          [horizontal ? "x" : "y"]: {
            beginAtZero: true,
            title: { display: true, text: "estimated spend ($, catalogue prices)" },
            ticks: { callback: tick },
          },
          [horizontal ? "y" : "x"]: { ticks: { autoSkip: false } },  // every user, every week
        },
      },
    });
  }

  bars("spend-by-week-chart", "spend-by-week", "week", false);
  bars("spend-by-user-chart", "spend-by-user", "user", true);
})();
