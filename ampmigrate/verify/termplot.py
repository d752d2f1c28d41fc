"""A line chart in the terminal, drawn with braille characters (2 x 4 dots per cell)."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

from rich.text import Text

# Dot bits of a braille cell, by (column, row) within the cell.
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))
_BRAILLE = 0x2800

Series = Tuple[str, Sequence[float], str]  # label, values (one per step), rich style


def line_chart(series: Sequence[Series], width: int = 64, height: int = 12, y_label: str = "loss") -> Text:
    """Plot each series over its index (step); later series are drawn over earlier ones."""
    points = [v for _, values, _ in series for v in values if _finite(v)]
    if not points or width < 4 or height < 2:
        return Text("(nothing to plot)")
    low, high = min(points), max(points)
    if high - low < 1e-12:
        low, high = low - 0.5, high + 0.5
    length = max(len(values) for _, values, _ in series)
    cells: List[List[int]] = [[0] * width for _ in range(height)]
    owner: List[List[Optional[str]]] = [[None] * width for _ in range(height)]
    dots_x, dots_y = width * 2, height * 4

    def to_dot(step: int, value: float) -> Tuple[int, int]:
        x = round(step * (dots_x - 1) / max(1, length - 1))
        y = round((high - value) * (dots_y - 1) / (high - low))
        return x, y

    for _, values, style in series:
        previous = None
        for step, value in enumerate(values):
            if not _finite(value):
                previous = None
                continue
            current = to_dot(step, value)
            for x, y in _segment(previous or current, current):
                row, column = y // 4, x // 2
                cells[row][column] |= _DOTS[x % 2][y % 4]
                owner[row][column] = style
            previous = current

    labels = [f"{high:.4g}", f"{(high + low) / 2:.4g}", f"{low:.4g}"]
    margin = max(len(label) for label in labels) + 1
    text = Text()
    for row in range(height):
        if row == 0:
            label = labels[0]
        elif row == height // 2:
            label = labels[1]
        elif row == height - 1:
            label = labels[2]
        else:
            label = ""
        text.append(label.rjust(margin - 1) + " ┤" if label else " " * margin + "│", style="dim")
        for column in range(width):
            bits = cells[row][column]
            text.append(chr(_BRAILLE + bits) if bits else " ", style=owner[row][column] or "")
        text.append("\n")
    axis = " " * margin + "└" + "─" * width
    text.append(axis + "\n", style="dim")
    first, last = "1", f"step {length}"
    text.append(" " * (margin + 1) + first + " " * max(1, width - len(first) - len(last)) + last + "\n", style="dim")
    legend = Text(" " * (margin + 1))
    for index, (label, _, style) in enumerate(s for s in series if s[0]):  # unlabelled series share a label
        if index:
            legend.append("   ")
        legend.append("━━ ", style=style)
        legend.append(label)
    text.append(legend)
    text.append(f"\n{' ' * (margin + 1)}({y_label}, smoothed)", style="dim")
    return text


def _finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)


def _segment(start: Tuple[int, int], end: Tuple[int, int]):
    """Dots of a straight line from start to end (Bresenham)."""
    x0, y0 = start
    x1, y1 = end
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx = 1 if x0 < x1 else -1
    sy = 1 if y0 < y1 else -1
    error = dx + dy
    while True:
        yield x0, y0
        if x0 == x1 and y0 == y1:
            return
        doubled = 2 * error
        if doubled >= dy:
            error += dy
            x0 += sx
        if doubled <= dx:
            error += dx
            y0 += sy
