"""The activity plot as inline SVG geometry (no script, no inline style: the CSP allows neither).

Grouped bars per day: admitted, rejected, forgotten (store/console/console_reads.py ``activity``). The
template draws what this returns; colours are SVG presentation attributes."""

from __future__ import annotations

import math
from typing import Any

WIDTH, HEIGHT = 640, 200
LEFT, BOTTOM, TOP = 36, 40, 12
COLOURS = {"admitted": "#2f7d4f", "rejected": "#b8860b", "forgotten": "#a33b3b"}
MAX_DAYS = 30  # the last 30 days that saw activity


def activity_svg(activity: dict[str, Any]) -> dict[str, Any]:
    days: list[str] = activity["days"][-MAX_DAYS:]
    skip = len(activity["days"]) - len(days)
    series = {name: values[skip:] for name, values in activity["series"].items()}
    peak = max((v for values in series.values() for v in values), default=0)
    # Counts are whole: ticks at whole steps (at most five), the axis topped at the last tick.
    step = max(1, math.ceil(peak / 4))
    top = step * math.ceil(peak / step) if peak else 0
    plot_h = HEIGHT - BOTTOM - TOP
    slot = (WIDTH - LEFT - 8) / max(len(days), 1)
    bar = max(2.0, min(18.0, slot / (len(COLOURS) + 1)))
    bars, labels = [], []
    for i, day in enumerate(days):
        x0 = LEFT + i * slot + (slot - bar * len(COLOURS)) / 2
        for j, name in enumerate(COLOURS):
            value = series.get(name, [0] * len(days))[i]
            h = plot_h * value / top if top else 0
            bars.append({"x": round(x0 + j * bar, 1), "y": round(TOP + plot_h - h, 1), "w": round(bar - 1, 1),
                         "h": round(h, 1), "fill": COLOURS[name], "title": f"{day}: {value} {name}"})
        labels.append({"x": round(LEFT + i * slot + slot / 2, 1), "text": day[5:]})
    ticks = [{"y": round(TOP + plot_h - plot_h * v / top, 1), "text": str(v)} for v in range(0, top + 1, step)]
    totals = {name: sum(values) for name, values in series.items()}
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "top": TOP, "base": TOP + plot_h, "bars": bars,
            "labels": labels, "ticks": ticks, "legend": [{"name": n, "fill": c, "total": totals.get(n, 0)}
                                                        for n, c in COLOURS.items()], "empty": not days}
