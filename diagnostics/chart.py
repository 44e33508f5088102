"""The evidence chart a finding carries: ``Finding.evidence["chart"]``.

Rules build it with ``diagnostics.rules.evidence.chart(...)``; the reports and the app draw
it with ``diagnostics.report.plots.finding_figure``; the JSON result writes it as
:meth:`Chart.to_dict`. The contract is documented in ``docs/CHARTS.md``.

A leaf module: nothing here imports plotting, torch or streamlit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

ChartKind = Literal["line", "bar"]
CHART_KINDS: tuple[str, ...] = get_args(ChartKind)

XValue = int | float | str  # a step, a rank or a category label
YValue = int | float | None  # None is a gap (a NaN or a missing record)

# the JSON keys, in the order the result has always written them
CHART_KEYS = ("kind", "title", "x_label", "y_label", "x", "series", "highlight_x")


class ChartError(ValueError):
    """A chart that breaks the contract: says which chart and which field."""


def _is_x(value: object) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)


def _is_y(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


@dataclass(frozen=True)
class Chart:
    """Series drawn over shared x values, plus the x values the finding is about.

    Construction validates, so a ``Chart`` that exists can be drawn: a rule's mistake fails
    in the rule's own tests instead of drawing nothing on a page.
    """

    kind: ChartKind
    title: str
    x_label: str  # axis titles carry their units: "step", "time (ms)"
    y_label: str
    x: tuple[XValue, ...]
    series: Mapping[str, tuple[YValue, ...]]  # name -> one value per x, in drawing order
    highlight_x: tuple[XValue, ...] = ()  # marked on the first series

    def __post_init__(self) -> None:
        where = f"chart {self.title!r}"
        if self.kind not in CHART_KINDS:
            raise ChartError(f"{where}: kind {self.kind!r} is not one of {', '.join(CHART_KINDS)}")
        for name in ("title", "x_label", "y_label"):
            if not isinstance(getattr(self, name), str):
                raise ChartError(f"{where}: {name} must be a string")
        for name in ("x", "highlight_x"):
            values = getattr(self, name)
            if isinstance(values, str) or not isinstance(values, Sequence):
                raise ChartError(f"{where}: {name} must be a list of values")
            # tuples, so that a frozen chart is not changed through a list it was given
            object.__setattr__(self, name, tuple(values))
            bad = [v for v in values if not _is_x(v)]
            if bad:
                raise ChartError(f"{where}: {name} holds {bad[0]!r}, not a number or a string")
        if not isinstance(self.series, Mapping) or not self.series:
            raise ChartError(f"{where}: series must map at least one name to values")
        if any(isinstance(v, str) or not isinstance(v, Sequence) for v in self.series.values()):
            raise ChartError(f"{where}: each series must be a list of values")
        object.__setattr__(
            self, "series", {str(name): tuple(values) for name, values in self.series.items()}
        )
        for name, values in self.series.items():
            if len(values) != len(self.x):
                raise ChartError(
                    f"{where}: series {name!r} has {len(values)} values for {len(self.x)} x values"
                )
            bad = next((v for v in values if not _is_y(v)), None)
            if bad is not None:
                raise ChartError(f"{where}: series {name!r} holds {bad!r}, not a number or null")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (plain lists), as the analysis result and the JSON report write it."""
        return {
            "kind": self.kind,
            "title": self.title,
            "x_label": self.x_label,
            "y_label": self.y_label,
            "x": list(self.x),
            "series": {name: list(values) for name, values in self.series.items()},
            "highlight_x": list(self.highlight_x),
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Chart:
        """A chart read back from its JSON form; ChartError names a missing or extra key."""
        if not isinstance(doc, Mapping):
            raise ChartError(f"a chart must be a JSON object, not {type(doc).__name__}")
        missing = [key for key in CHART_KEYS if key not in doc]
        extra = sorted(str(key) for key in doc if key not in CHART_KEYS)
        if missing or extra:
            problem = f"missing {', '.join(missing)}" if missing else f"unknown {', '.join(extra)}"
            raise ChartError(f"chart {doc.get('title')!r}: {problem}")
        return cls(**{key: doc[key] for key in CHART_KEYS})
