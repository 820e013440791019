"""A few inline-SVG plotting primitives for the report (pure: strings in, strings out).

Why our own and not matplotlib: the evaluator writes the report at the end of every run, so it must not need an
optional extra, and it must stay fast (matplotlib's import and rendering alone take seconds on a small CPU
machine, per report). The report's plots are simple (histograms, lines with an interval band, bars); inline SVG
keeps them crisp at any zoom, small (a few kB each), styled by the page's CSS, and their labels are text a test
can read. Colours come from CSS classes (``s0``..``s7`` series, ``band``, ``mark``), not from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering ``[lo, hi]``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = start
    while value <= hi + 1e-9 * step:
        ticks.append(round(value, 10))
        value += step
    return ticks


def fmt(value: float) -> str:
    """Short tick label."""
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10 or float(value).is_integer():
        return f"{value:.0f}"
    return f"{value:.2g}" if abs(value) < 1 else f"{value:.1f}"


class Axes:
    """One plot area with linear x and y scales; collects SVG elements, :meth:`svg` renders them."""

    def __init__(
        self,
        x_range: tuple[float, float],
        y_range: tuple[float, float],
        *,
        width: int = 420,
        height: int = 220,
        margin: tuple[int, int, int, int] = (14, 14, 40, 52),  # top, right, bottom, left
    ):
        self.width, self.height = width, height
        self.top, self.right, self.bottom, self.left = margin
        x0, x1 = x_range
        y0, y1 = y_range
        self.x0, self.x1 = float(x0), float(x1) if x1 > x0 else float(x0) + 1.0
        self.y0, self.y1 = float(y0), float(y1) if y1 > y0 else float(y0) + 1.0
        self.parts: list[str] = []

    def x(self, value: float) -> float:
        span = self.width - self.left - self.right
        return round(self.left + (value - self.x0) / (self.x1 - self.x0) * span, 1)

    def y(self, value: float) -> float:
        span = self.height - self.top - self.bottom
        return round(self.height - self.bottom - (value - self.y0) / (self.y1 - self.y0) * span, 1)

    def frame(
        self,
        xlabel: str,
        ylabel: str,
        *,
        xticks: Sequence[float] | None = None,
        yticks: Sequence[float] | None = None,
        xfmt=fmt,
        yfmt=fmt,
    ) -> None:
        """Axes lines, ticks with labels, grid lines and the axis titles."""
        xticks = nice_ticks(self.x0, self.x1) if xticks is None else xticks
        yticks = nice_ticks(self.y0, self.y1, 4) if yticks is None else yticks
        bottom, left = self.height - self.bottom, self.left
        out = self.parts
        for t in yticks:
            if self.y0 <= t <= self.y1:
                y = self.y(t)
                out.append(f'<line class="grid" x1="{left}" x2="{self.width - self.right}" y1="{y}" y2="{y}"/>')
                out.append(f'<text class="tick" x="{left - 4}" y="{y + 3}" text-anchor="end">{escape(yfmt(t))}</text>')
        for t in xticks:
            if self.x0 <= t <= self.x1:
                x = self.x(t)
                out.append(f'<line class="axis" x1="{x}" x2="{x}" y1="{bottom}" y2="{bottom + 4}"/>')
                out.append(
                    f'<text class="tick" x="{x}" y="{bottom + 15}" text-anchor="middle">{escape(xfmt(t))}</text>'
                )
        out.append(f'<line class="axis" x1="{left}" x2="{self.width - self.right}" y1="{bottom}" y2="{bottom}"/>')
        out.append(f'<line class="axis" x1="{left}" x2="{left}" y1="{self.top}" y2="{bottom}"/>')
        mid_x = (left + self.width - self.right) / 2
        out.append(
            f'<text class="label" x="{mid_x}" y="{self.height - 6}" text-anchor="middle">{escape(xlabel)}</text>'
        )
        mid_y = (self.top + bottom) / 2
        out.append(
            f'<text class="label" transform="translate(12,{mid_y}) rotate(-90)" text-anchor="middle">{escape(ylabel)}</text>'
        )

    def line(self, xs: Sequence[float], ys: Sequence[float], cls: str = "s0", *, step: bool = False) -> None:
        """A polyline (``step``: horizontal then vertical segments)."""
        points: list[str] = []
        prev = None
        for xv, yv in zip(xs, ys):
            if yv is None or not math.isfinite(yv):
                if len(points) > 1:
                    self.parts.append(f'<polyline class="{cls}" points="{" ".join(points)}"/>')
                points, prev = [], None
                continue
            if step and prev is not None:
                points.append(f"{self.x(xv)},{self.y(prev)}")
            points.append(f"{self.x(xv)},{self.y(yv)}")
            prev = yv
        if len(points) > 1:
            self.parts.append(f'<polyline class="{cls}" points="{" ".join(points)}"/>')
        elif len(points) == 1:
            px, py = points[0].split(",")
            self.parts.append(f'<circle class="{cls} dot" cx="{px}" cy="{py}" r="2.5"/>')

    def band(self, xs: Sequence[float], lo: Sequence[float], hi: Sequence[float], cls: str = "band") -> None:
        """A filled area between ``lo`` and ``hi``."""
        if not xs:
            return
        upper = [f"{self.x(x)},{self.y(h)}" for x, h in zip(xs, hi)]
        lower = [f"{self.x(x)},{self.y(v)}" for x, v in zip(reversed(xs), reversed(lo))]
        self.parts.append(f'<polygon class="{cls}" points="{" ".join(upper + lower)}"/>')

    def bars(self, edges: Sequence[float], counts: Sequence[float], cls: str = "bar") -> None:
        """Histogram bars over consecutive ``edges``."""
        for a, b, c in zip(edges[:-1], edges[1:], counts):
            if c <= 0:
                continue
            x, w = self.x(a), max(0.5, self.x(b) - self.x(a) - 0.5)
            y = self.y(c)
            self.parts.append(
                f'<rect class="{cls}" x="{x}" y="{y}" width="{round(w, 1)}" height="{round(self.y(self.y0) - y, 1)}">'
                f"<title>{fmt(a)}-{fmt(b)}: {int(c)}</title></rect>"
            )

    def vline(self, value: float, text: str, cls: str = "mark", row: int = 0) -> None:
        """A labelled vertical marker (``row`` staggers labels that would overlap)."""
        x = self.x(value)
        self.parts.append(f'<line class="{cls}" x1="{x}" x2="{x}" y1="{self.top}" y2="{self.y(self.y0)}"/>')
        self.parts.append(f'<text class="marklabel" x="{x + 3}" y="{self.top + 10 + 11 * row}">{escape(text)}</text>')

    def hline(self, value: float, text: str = "", cls: str = "mark") -> None:
        y = self.y(value)
        self.parts.append(f'<line class="{cls}" x1="{self.left}" x2="{self.width - self.right}" y1="{y}" y2="{y}"/>')
        if text:
            self.parts.append(
                f'<text class="marklabel" x="{self.width - self.right - 2}" y="{y - 3}" text-anchor="end">{escape(text)}</text>'
            )

    def text(self, x: float, y: float, text: str, cls: str = "note", anchor: str = "start") -> None:
        """Text at pixel position (x, y)."""
        self.parts.append(f'<text class="{cls}" x="{x}" y="{y}" text-anchor="{anchor}">{escape(text)}</text>')

    def svg(self, title: str, plot_id: str = "") -> str:
        ident = f' id="{escape(plot_id)}"' if plot_id else ""
        return (
            f'<svg class="plot"{ident} viewBox="0 0 {self.width} {self.height}" width="{self.width}" '
            f'height="{self.height}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
            + "".join(self.parts)
            + "</svg>"
        )


def empty_plot(title: str, message: str, plot_id: str = "", width: int = 420, height: int = 220) -> str:
    """A framed placeholder saying why there is nothing to plot."""
    ident = f' id="{escape(plot_id)}"' if plot_id else ""
    return (
        f'<svg class="plot empty"{ident} viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<rect class="emptybox" x="1" y="1" width="{width - 2}" height="{height - 2}"/>'
        f'<text class="note" x="{width / 2}" y="{height / 2}" text-anchor="middle">{escape(message)}</text></svg>'
    )
