"""Render the PNG plots of docs/BENCHMARKS.md from the JSON results in this folder.

    QT_QPA_PLATFORM=offscreen .venv/bin/python docs/benchmarks/make_plots.py

Inputs (written by the commands listed in BENCHMARKS.md): eval_sweep.json (`a2ats eval
--budgets ... --json`), decode.json (`a2ats bench decode --json`), decode_1thread.json (the
same with OPENBLAS_NUM_THREADS=1), memory.json (`a2ats bench memory --json`). Outputs in
docs/img: recall_vs_budget.png, ppl_vs_budget.png, recall_vs_bytes_read.png and
ppl_vs_bytes_read.png (from eval_cost_sweep.json), tokens_per_s_vs_context.png,
speed_vs_full.png, bytes_per_token.png. Uses pyqtgraph's exporter (no matplotlib).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pyqtgraph as pg  # noqa: E402
from pyqtgraph.exporters import ImageExporter  # noqa: E402

HERE = Path(__file__).resolve().parent
IMG = HERE.parent / "img"
COLORS = {
    "full": "#222222",
    "kv8": "#8c564b",
    "kv4": "#e377c2",
    "a2ats": "#d62728",
    "a2ats_kv8": "#ff9896",
    "a2ats_kv4": "#ff7f0e",
    "oracle_topk": "#2ca02c",
    "window": "#1f77b4",
    "a2ats_plain_vq": "#9467bd",
    "a2ats_paper": "#bcbd22",
    "a2ats_no_wrope": "#17becf",
    "a2ats_random": "#7f7f7f",
    "a2ats_no_rerank": "#e7969c",
    "a2ats_rr1": "#e7969c",
}
SYMBOLS = "osdt+xph"
METRIC_LABELS = {
    "recall": "recall (exact attention mass)",
    "ppl": "perplexity (teacher-forced)",
    "ppl_vs_full": "ppl / ppl of full (teacher-forced)",
}


def _plot(
    title: str, x_label: str, y_label: str, log_x: bool = False, legend_at=(-10, 10)
) -> pg.PlotWidget:
    from PySide6.QtGui import QFont

    widget = pg.PlotWidget(background="w")
    widget.resize(960, 600)
    item = widget.getPlotItem()
    item.layout.setContentsMargins(12, 12, 24, 12)
    item.setTitle(title, color="k", size="10pt")
    style = {"color": "k", "font-size": "10pt"}
    item.setLabel("bottom", x_label, **style)
    item.setLabel("left", y_label, **style)
    item.showGrid(x=True, y=True, alpha=0.25)
    tick_font = QFont()
    tick_font.setPointSize(8)
    for axis in ("bottom", "left"):
        ax = item.getAxis(axis)
        ax.setPen("k")
        ax.setTextPen("k")
        ax.setTickFont(tick_font)
        ax.enableAutoSIPrefix(False)
    item.setLogMode(x=log_x, y=False)
    legend = item.addLegend(offset=legend_at, labelTextColor="k")
    legend.setBrush(pg.mkBrush(255, 255, 255, 220))
    return widget


def _line(widget, name: str, xs, ys, index: int, color_of: str | None = None, dashed=False) -> None:
    color = COLORS.get(color_of or name, pg.intColor(index))
    style = pg.QtCore.Qt.DashLine if dashed else pg.QtCore.Qt.SolidLine
    widget.plot(
        list(xs), list(ys), name=name, pen=pg.mkPen(color, width=2.5, style=style),
        symbol=SYMBOLS[index % len(SYMBOLS)], symbolSize=8, symbolBrush=color, symbolPen=color,
    )  # fmt: skip


def _save(widget, name: str) -> Path:
    IMG.mkdir(parents=True, exist_ok=True)
    widget.show()  # offscreen: lays the plot out at its real size before export
    pg.QtWidgets.QApplication.processEvents()
    exporter = ImageExporter(widget.getPlotItem())
    exporter.parameters()["width"] = widget.width()
    path = IMG / name
    exporter.export(str(path))
    return path


def _budget_sweep(data: dict) -> tuple[list[dict], list[str]]:
    """A budget sweep's runs, smallest budget first, and its methods less the baselines that
    have no budget (full, kv8, kv4)."""
    runs = sorted(data["runs"], key=lambda r: r["budget"])
    return runs, [m for m in runs[0]["methods"] if m not in ("full", "kv8", "kv4")]


def _metric_plot(metric: str, title: str, x_label: str) -> pg.PlotWidget:
    """A log-x plot of a sweep's `metric` (y axis: METRIC_LABELS): recall's legend top left,
    the others' top right."""
    legend_at = (10, 10) if metric == "recall" else (-10, 10)
    return _plot(title, x_label, METRIC_LABELS[metric], log_x=True, legend_at=legend_at)


def sweep_plots(data: dict) -> list[Path]:
    runs, methods = _budget_sweep(data)
    budgets = [r["budget"] for r in runs]
    out = []
    for metric, fname in (("recall", "recall_vs_budget.png"), ("ppl", "ppl_vs_budget.png")):
        widget = _metric_plot(
            metric,
            f"{metric} vs budget, context {data['context']} ({data['model']})",
            "budget (share of the context per query head, log scale)",
        )
        for i, m in enumerate(methods):
            _line(widget, m, budgets, [r["methods"][m][metric] for r in runs], i)
        if metric == "ppl" and "full" in runs[0]["methods"]:
            _line(widget, "full", budgets, [r["methods"]["full"]["ppl"] for r in runs], 7)
        out.append(_save(widget, fname))
    return out


def cost_plots(data: dict) -> list[Path]:
    """Recall and ppl against the bytes one decode step reads (equal-cost comparison), from a
    budget sweep recorded with the cost accounting (eval_cost_sweep.json)."""
    runs, methods = _budget_sweep(data)
    out = []
    for metric, fname in (
        ("recall", "recall_vs_bytes_read.png"),
        ("ppl_vs_full", "ppl_vs_bytes_read.png"),
    ):
        widget = _metric_plot(
            metric,
            f"{metric} vs bytes read per decode step, context {data['context']} "
            f"(budgets {', '.join(str(r['budget']) for r in runs)})",
            "MB read per decode step, all layers (log scale)",
        )
        for i, m in enumerate(methods):
            xs = [r["methods"][m]["bytes_read_per_step"] / 1e6 for r in runs]
            _line(widget, m, xs, [r["methods"][m][metric] for r in runs], i)
        if "full" in runs[0]["methods"]:
            full = runs[0]["methods"]["full"]
            _line(widget, "full", [full["bytes_read_per_step"] / 1e6], [full[metric]], 7)
        out.append(_save(widget, fname))
    return out


def _per_method_plot(data: dict, field: str, title: str, y_label: str, name: str) -> Path:
    """One line per method: `field` of `a2ats bench ... --json`'s results against the context."""
    rows = data["results"]
    widget = _plot(title, "context (tokens)", y_label)
    for i, m in enumerate(dict.fromkeys(r["method"] for r in rows)):
        pts = sorted((r["context"], r[field]) for r in rows if r["method"] == m)
        _line(widget, m, [p[0] for p in pts], [p[1] for p in pts], i)
    return _save(widget, name)


def decode_plot(data: dict) -> Path:
    title = f"decode tokens/s vs context ({data['model']}, budget {data['budget']})"
    return _per_method_plot(data, "tokens_per_s", title, "tokens/s", "tokens_per_s_vs_context.png")


def speed_ratio_plot(runs: dict[str, dict]) -> Path:
    """Speed vs full per method and context, one line per (method, BLAS threads setting)."""
    widget = _plot(
        "decode speed relative to full (mlx-lm KVCache), same run",
        "context (tokens)",
        "tokens/s / tokens/s of full",
        legend_at=(10, 10),
    )
    index = 0
    for run, (label, data) in enumerate(runs.items()):
        rows = data["results"]
        for m in dict.fromkeys(r["method"] for r in rows):
            if m == "full":
                continue
            pts = sorted((r["context"], r["speed_vs_full"]) for r in rows if r["method"] == m)
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            _line(widget, f"{m} ({label})", xs, ys, index, color_of=m, dashed=run > 0)
            index += 1
    widget.getPlotItem().addLine(y=1.0, pen=pg.mkPen("k", width=1, style=pg.QtCore.Qt.DashLine))
    return _save(widget, "speed_vs_full.png")


def memory_plot(data: dict) -> Path:
    title = f"cache bytes per token vs context ({data['model']}, K/V {data['kv_dtype']})"
    y_label = "bytes per token (all layers)"
    return _per_method_plot(data, "bytes_per_token", title, y_label, "bytes_per_token.png")


def main() -> int:
    pg.mkQApp()
    made = []
    for fname, fn in (
        ("eval_sweep.json", sweep_plots),
        ("eval_cost_sweep.json", cost_plots),
        ("decode.json", decode_plot),
        ("memory.json", memory_plot),
    ):
        path = HERE / fname
        if not path.is_file():
            print(f"skip: {path} not found", file=sys.stderr)
            continue
        result = fn(json.loads(path.read_text()))
        made.extend(result if isinstance(result, list) else [result])
    ratio_runs = {
        label: json.loads((HERE / fname).read_text())
        for label, fname in (
            ("2 BLAS threads", "decode.json"),
            ("1 BLAS thread", "decode_1thread.json"),
        )
        if (HERE / fname).is_file()
    }
    if ratio_runs:
        made.append(speed_ratio_plot(ratio_runs))
    for path in made:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
