"""Chrome-trace duration events written as ``B``/``E`` pairs, read as complete (``X``) events.

The Chrome trace format lets a writer mark a range by its begin (``ph: "B"``) and end
(``ph: "E"``) instead of one ``X`` event with a ``dur``. An ``E`` closes the latest open
``B`` of its own thread (a stack per (pid, tid), so ranges nest). Pairing happens chunk by
chunk as the file is decoded (diagnostics.trace.decode): only the ranges still open are
held, never the file. The range keeps its ``B`` event's name, category and args.

Phase letters other writers spell in the other case are read as Kineto's: ``x`` as ``X``,
``I`` (Chrome's older instant) as ``i``, ``m`` as ``M``. ``b``/``e`` are async ranges in
the format, a different thing, and are left as they are.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec

from diagnostics.trace.columns import Event

_SAME_PHASE = {"x": "X", "I": "i", "m": "M"}
PAIRED_PHASES = {"B", "E", *_SAME_PHASE}  # what pair() rewrites or holds back
UNMATCHED_END = "an 'E' (end) event with no open 'B' on its thread"
UNMATCHED_BEGIN = "a 'B' (begin) event never ended on its thread"


class BeginEndPairs:
    """The open ``B`` events of every thread, across the chunks of one file."""

    def __init__(self) -> None:
        self.open: dict[tuple[Any, Any], list[Event]] = {}
        self.unmatched: Counter[str] = Counter()

    def pair(self, events: list[Event]) -> list[Event]:
        """``events`` with each closed B/E pair as one X event (at its E's place) and
        open ``B`` events held back; events of other phases untouched."""
        if not PAIRED_PHASES.intersection({event.ph for event in events}):
            return events  # the usual Kineto chunk: one set pass, no copy
        out: list[Event] = []
        for event in events:
            ph = event.ph
            if ph in _SAME_PHASE:
                out.append(msgspec.structs.replace(event, ph=_SAME_PHASE[ph]))
            elif ph == "B":
                self.open.setdefault((event.pid, event.tid), []).append(event)
            elif ph == "E":
                stack = self.open.get((event.pid, event.tid))
                if not stack:
                    self.unmatched[UNMATCHED_END] += 1
                    continue
                begin = stack.pop()
                if begin.ts is None or event.ts is None:
                    self.unmatched[UNMATCHED_END] += 1
                    continue
                out.append(msgspec.structs.replace(begin, ph="X", dur=float(event.ts - begin.ts)))
            else:
                out.append(event)
        return out

    def finish(self) -> Counter[str]:
        """What could not be paired (ranges still open at the end of the file included)."""
        still_open = sum(len(stack) for stack in self.open.values())
        if still_open:
            self.unmatched[UNMATCHED_BEGIN] += still_open
        self.open.clear()
        return self.unmatched
