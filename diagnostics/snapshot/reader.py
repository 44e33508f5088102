"""The one reader of CUDA memory snapshots: a restricted unpickler, capped, typed.

A snapshot is a pickle, and ``pickle.load`` runs whatever callable a pickle names
(GLOBAL/STACK_GLOBAL then REDUCE): a snapshot from someone else could run code here.
PyTorch's own ``_memory_viz`` and Meta's Mosaic use plain ``pickle.load``. A real snapshot
holds only dicts, lists, tuples, strings, numbers, bools and None, which the unpickler
builds without resolving any global, so :class:`_NoGlobals` refuses every ``find_class``
and every persistent id: a snapshot reads at any protocol (2-5 tested) and nothing runs.

The file is read whole under a byte cap (decompressed for ``.pickle.gz``), and the object
graph is walked under an item budget of one item per byte. Unpickling itself allocates at
most one object per opcode, but memo references (``BINGET``) let a small pickle name one
big list a million times, which a naive walk would visit a million times. torch writes
snapshots exactly that way for a good reason: every frame dict is shared among the stacks
that hold it, and an entry's frames list is shared by its free_requested and
free_completed (75-87 % of a real snapshot's opcodes are memo gets). So the walk charges
each distinct frames list once, by identity; every element of a distinct list costs at
least one opcode byte, so a real snapshot never exceeds the budget, while a list that is
walked once per reference (a segment, a trace, a free-form field such as
``external_annotations``) is charged at each reference and a bomb runs out in
milliseconds. Everything else (wrong top-level type, a field of the wrong type, a
truncated file) is one :class:`~diagnostics.errors.InputError` line naming the file and
the field.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import pickle
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from diagnostics.errors import InputError
from diagnostics.snapshot.schema import (
    ACTIONS,
    BLOCK_SCHEMA,
    BLOCK_STATES,
    ENTRY_SCHEMA,
    SEGMENT_SCHEMA,
    STATE_ALIASES,
    Frame,
    MemorySnapshot,
    Stack,
)
from diagnostics.trace.budget import DEFAULT_MAX_DECOMPRESSED_BYTES, BudgetExceeded, human_bytes

SNAPSHOT_SUFFIXES = (".pickle", ".pickle.gz", ".pkl", ".pkl.gz")
_CHUNK = 1 << 20
# Items the walk may visit: one per pickle byte (see the module docstring), plus a floor
# for tiny files.
_MIN_ITEMS = 100_000
# How far a free-form field (allocator_settings, external_annotations) is kept, for display.
_FREE_FORM_DEPTH = 4
_FREE_FORM_ITEMS = 200
_FREE_FORM_TEXT = 500
_MAX_INT = 2**63 - 1
_ACTION_SET = frozenset(ACTIONS)


class _NoGlobals(pickle.Unpickler):
    """Refuses every global (classes, functions) and persistent id: builtins only."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refers to {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refers to a persistent object")


def is_snapshot_file(path: str | os.PathLike[str]) -> bool:
    return str(path).lower().endswith(SNAPSHOT_SUFFIXES)


def _read_capped(path: Path, display: str, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as raw:
            magic = raw.read(2)
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw
            parts, total = [], 0
            while True:
                chunk = stream.read(_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:
                    raise BudgetExceeded(
                        display,
                        f"the snapshot is larger than the {human_bytes(max_bytes)} limit "
                        "(decompressed); raise --max-decompressed-mb or "
                        "PIPELINE_DOCTOR_MAX_DECOMPRESSED_MB to read it",
                    )
                parts.append(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(display, f"cannot be read as a snapshot ({exc})") from None
    return b"".join(parts)


def _protocol(data: bytes) -> int | None:
    if len(data) >= 2 and data[0] == 0x80:
        return data[1]
    return None


def _unpickle(data: bytes, display: str) -> Any:
    try:
        return _NoGlobals(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if text.startswith("refers to"):
            raise InputError(
                display,
                f"refused: the pickle {text}, and a memory snapshot holds only plain data "
                "(dicts, lists, strings, numbers); nothing was run",
            ) from None
        if "truncated" in text:
            raise InputError(display, _TRUNCATED) from None
        raise InputError(display, f"is not a readable pickle ({text})") from None
    except EOFError:
        raise InputError(display, _TRUNCATED) from None
    except MemoryError:
        # bytes and bytearray are allocated at their declared length before they are read:
        # a length beyond the file is a truncated or corrupt file, not a lack of memory
        beyond = _length_beyond_end(data)
        if beyond is None:
            raise
        raise InputError(display, beyond) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError) as exc:
        if "truncated" in str(exc):
            raise InputError(display, _TRUNCATED) from None
        raise InputError(display, f"is not a readable pickle ({exc})") from None


_TRUNCATED = "is truncated (the pickle ends early)"


def _length_beyond_end(data: bytes, budget_s: float = 2.0) -> str | None:
    """The line for an object whose declared length runs past the end of ``data``, found
    by walking the opcodes (pickletools reads a length without allocating it); None when
    there is none, or when the walk would take longer than ``budget_s``."""
    import pickletools  # the error path only: not worth importing for every read
    import time

    deadline = time.monotonic() + budget_s
    try:
        for i, (opcode, _arg, _position) in enumerate(pickletools.genops(data)):
            if i % 4096 == 0 and time.monotonic() > deadline:
                return None
            if opcode.name == "STOP":
                return None
    except ValueError as exc:  # "expected N bytes in a bytes8, but only M remain"
        if "remain" in str(exc):
            return (
                f"is truncated: an object in it declares more bytes than the "
                f"{len(data):,}-byte file holds ({exc})"
            )
        return None
    return None


class _Walker:
    """Turns the raw dicts into the typed frames, checking each field it uses."""

    def __init__(self, display: str, max_items: int):
        self.display = display
        self.items_left = max_items
        self.stacks: list[Stack] = []
        self._stack_ids: dict[Any, int] = {}
        self._by_id: dict[int, int] = {}
        self.compile_context = 0
        self.user_metadata = 0

    def fail(self, where: str, problem: str) -> InputError:
        return InputError(self.display, f"{where}: {problem}")

    def spend(self, n: int = 1, where: str | None = None) -> None:
        self.items_left -= n
        if self.items_left < 0:
            prefix = f"{where}: " if where else ""
            raise InputError(
                self.display,
                f"{prefix}holds more items than its size allows (shared references, a "
                "pickle bomb?)",
            )

    def integer(self, value: Any, where: str, *, optional: bool = False) -> int | None:
        if type(value) is int and -_MAX_INT <= value <= _MAX_INT:
            return value
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"expected an integer, found {type(value).__name__}")
        if not -_MAX_INT <= value <= _MAX_INT:
            raise self.fail(where, "integer out of range")
        return value

    def mapping(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a dict, found {type(value).__name__}")
        return value

    def sequence(self, value: Any, where: str) -> list[Any] | tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise self.fail(where, f"expected a list, found {type(value).__name__}")
        return value

    def stack(self, frames: Any, where: str, entry: int | None = None) -> int | None:
        """The index of ``frames`` in the stack table; ``where`` names the field (with
        ``entry``, the entry's ``frames`` under it: formatted only for an error)."""
        if frames is None:
            return None
        # real snapshots share one frames list among the entries of one traceback
        known = self._by_id.get(id(frames))
        if known is not None:
            return known
        if not frames and type(frames) is list:
            return None
        if entry is not None:
            where = f"{where}[{entry}].frames"
        frames = self.sequence(frames, where)
        if not frames:
            return None
        self.spend(len(frames))
        try:
            raw_key = tuple((f.get("filename"), f.get("line"), f.get("name")) for f in frames)
        except AttributeError:
            bad = next(i for i, f in enumerate(frames) if not isinstance(f, dict))
            raise self.fail(f"{where}[{bad}]", "expected a dict") from None
        try:
            index = self._stack_ids.get(raw_key)
        except TypeError:  # an unhashable field: the checks below name it
            index = None
        if index is None:  # a new stack: checked once, however many entries share it
            parsed = []
            for i, (filename, line, name) in enumerate(raw_key):
                filename = "??" if filename is None else filename
                name = "??" if name is None else name
                if not isinstance(filename, str) or not isinstance(name, str):
                    raise self.fail(f"{where}[{i}]", "filename and name must be strings")
                line = self.integer(0 if line is None else line, f"{where}[{i}].line")
                parsed.append(Frame(filename, int(line or 0), name))
            index = len(self.stacks)
            self._stack_ids[raw_key] = index
            self.stacks.append(tuple(parsed))
        self._by_id[id(frames)] = index
        return index

    def segments(self, raw: Any) -> tuple[dict[str, list], dict[str, list]]:
        segs: dict[str, list] = {k: [] for k in SEGMENT_SCHEMA}
        blocks: dict[str, list] = {k: [] for k in BLOCK_SCHEMA}
        for i, seg in enumerate(self.sequence(raw, "segments")):
            where = f"segments[{i}]"
            seg = self.mapping(seg, where)
            self.spend()
            device = self.integer(seg.get("device", 0), f"{where}.device")
            address = self.integer(seg.get("address"), f"{where}.address", optional=True)
            total = self.integer(seg.get("total_size"), f"{where}.total_size")
            if total is None or total < 0:
                raise self.fail(f"{where}.total_size", "must be a size in bytes")
            segs["segment"].append(i)
            segs["device"].append(device)
            segs["address"].append(address)
            segs["total_size"].append(total)
            for key in ("allocated_size", "active_size"):
                segs[key].append(self.integer(seg.get(key), f"{where}.{key}", optional=True))
            segs["stream"].append(self.integer(seg.get("stream", 0), f"{where}.stream"))
            kind = seg.get("segment_type")
            segs["segment_type"].append(kind if isinstance(kind, str) else None)
            segs["is_expandable"].append(bool(seg.get("is_expandable", False)))
            offset = 0
            raw_blocks = self.sequence(seg.get("blocks", []), f"{where}.blocks")
            self.spend(len(raw_blocks))
            for j, block in enumerate(raw_blocks):
                bwhere = f"{where}.blocks[{j}]"
                block = self.mapping(block, bwhere)
                size = self.integer(block.get("size"), f"{bwhere}.size")
                if size is None or size < 0:
                    raise self.fail(f"{bwhere}.size", "must be a size in bytes")
                state = block.get("state")
                if type(state) is str:
                    state = STATE_ALIASES.get(state, state)
                if type(state) is not str or state not in BLOCK_STATES:
                    raise self.fail(
                        f"{bwhere}.state",
                        f"unknown state {str(state)[:40]!r} (expected one of "
                        f"{', '.join(BLOCK_STATES)}, or active_pending_free)",
                    )
                addr = self.integer(block.get("address"), f"{bwhere}.address", optional=True)
                if addr is None and address is not None:
                    addr = address + offset  # legacy snapshots list blocks in address order
                requested = self.integer(
                    block.get("requested_size", size), f"{bwhere}.requested_size"
                )
                blocks["segment"].append(i)
                blocks["device"].append(device)
                blocks["address"].append(addr)
                blocks["size"].append(size)
                blocks["requested_size"].append(requested)
                blocks["state"].append(state)
                blocks["stack"].append(self.stack(block.get("frames"), f"{bwhere}.frames"))
                offset += size
        return segs, blocks

    def int_column(self, values: list[Any], where: str, key: str, optional: bool) -> pl.Series:
        """One field of every entry as Int64, checked in one pass; a bad value is located
        (and named) only when there is one."""
        try:
            series = pl.Series(key, values, dtype=pl.Int64, strict=True)
        except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
            series = None
        if (
            series is None
            or (not optional and series.null_count())
            or any(type(v) is bool for v in values)
        ):
            for i, value in enumerate(values):
                self.integer(value, f"{where}[{i}].{key}", optional=optional)
            raise self.fail(f"{where}.{key}", "expected integers")  # pragma: no cover
        return series

    def entries(self, raw: Any) -> pl.DataFrame:
        frames = []
        for device, trace in enumerate(self.sequence(raw, "device_traces")):
            where = f"device_traces[{device}]"
            trace = self.sequence(trace, where)
            self.spend(len(trace))
            for i, entry in enumerate(trace):
                if type(entry) is not dict:
                    self.mapping(entry, f"{where}[{i}]")
            actions = [e.get("action") for e in trace]
            if not all(type(a) is str and a in _ACTION_SET for a in actions):
                i = next(
                    i for i, a in enumerate(actions) if type(a) is not str or a not in _ACTION_SET
                )
                raise self.fail(f"{where}[{i}].action", f"unknown action {str(actions[i])[:40]!r}")
            columns = {
                "device": pl.Series("device", [device] * len(trace), dtype=pl.Int64),
                "seq": pl.Series("seq", range(len(trace)), dtype=pl.Int64),
                "action": pl.Series("action", actions, dtype=pl.String),
            }
            for key, optional in (
                ("addr", True),
                ("size", False),
                ("stream", True),
                ("time_us", True),
                ("device_free", True),
            ):
                values = (
                    [e.get(key, 0) for e in trace] if key == "size" else [e.get(key) for e in trace]
                )
                columns[key] = self.int_column(values, where, key, optional)
            columns["stack"] = pl.Series(
                "stack",
                [self.stack(e.get("frames"), where, i) for i, e in enumerate(trace)],
                dtype=pl.Int64,
            )
            self.compile_context += sum(1 for e in trace if e.get("compile_context"))
            self.user_metadata += sum(1 for e in trace if e.get("user_metadata"))
            frames.append(pl.DataFrame(columns).select(list(ENTRY_SCHEMA)))
        if not frames:
            return pl.DataFrame(schema=ENTRY_SCHEMA)
        return pl.concat(frames).cast(ENTRY_SCHEMA)

    def free_form(self, value: Any, where: str, depth: int = 0) -> Any:
        """A free-form field (allocator_settings, an annotation) kept as plain data, cut to
        a size worth showing; it is shown, never run. Each visit is charged: a field that
        names one list many times runs out of budget here, not memory."""
        self.spend(1, where)
        if depth > _FREE_FORM_DEPTH:
            return None
        # errors name the field and its own keys, not a path a bomb makes endless
        if type(value) is dict:
            return {
                _key_text(k): self.free_form(
                    v, f"{where}.{_key_text(k)}" if depth == 0 else where, depth + 1
                )
                for k, v in list(value.items())[:_FREE_FORM_ITEMS]
            }
        if isinstance(value, list | tuple):
            return [self.free_form(v, where, depth + 1) for v in value[:_FREE_FORM_ITEMS]]
        if isinstance(value, str):
            return value[:_FREE_FORM_TEXT]
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            return self.integer(value, where)
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        return str(value)[:_FREE_FORM_ITEMS]


def _key_text(key: Any) -> str:
    return key[:_FREE_FORM_ITEMS] if isinstance(key, str) else type(key).__name__


def parse_snapshot(raw: Any, display: str, *, bytes_read: int = 0) -> MemorySnapshot:
    """The typed snapshot from an unpickled object (a dict, or memory_viz's legacy bare
    list of segments)."""
    if isinstance(raw, list):
        raw = {"segments": raw, "device_traces": []}
    if not isinstance(raw, dict):
        raise InputError(
            display,
            f"is a pickle of a {type(raw).__name__}, not a CUDA memory snapshot (a dict "
            "with segments and device_traces, from torch.cuda.memory._dump_snapshot)",
        )
    if "segments" not in raw:
        raise InputError(display, "is not a CUDA memory snapshot (no 'segments' key)")
    walker = _Walker(display, _MIN_ITEMS + bytes_read)
    segs, blocks = walker.segments(raw["segments"])
    entries = walker.entries(raw.get("device_traces") or [])
    settings = raw.get("allocator_settings")
    if settings is not None and not isinstance(settings, dict):
        raise InputError(display, "allocator_settings: expected a dict")
    if settings is not None:
        expandable = settings.get("expandable_segments", False)
        if type(expandable) is not bool and expandable not in (0, 1):
            raise InputError(display, "allocator_settings.expandable_segments: expected a bool")
    annotations = raw.get("external_annotations") or []
    if not isinstance(annotations, list | tuple):
        raise InputError(display, "external_annotations: expected a list")
    kept_settings = (
        walker.free_form(settings, "allocator_settings") if settings is not None else None
    )
    kept_annotations = tuple(
        walker.free_form(a, f"external_annotations[{i}]")
        for i, a in enumerate(annotations[:10_000])
    )
    warnings = []
    if entries.height == 0:
        warnings.append(
            "the snapshot has no trace entries (recorded without _record_memory_history): "
            "the state at dump time is known, the peak and the timeline are not"
        )
    return MemorySnapshot(
        source=display,
        segments=pl.DataFrame(segs, schema=SEGMENT_SCHEMA),
        blocks=pl.DataFrame(blocks, schema=BLOCK_SCHEMA),
        entries=entries,
        stacks=tuple(walker.stacks),
        generation="new" if "allocator_settings" in raw else "old",
        allocator_settings=kept_settings,
        annotations=kept_annotations,
        entries_with_compile_context=walker.compile_context,
        entries_with_user_metadata=walker.user_metadata,
        bytes_read=bytes_read,
        warnings=tuple(warnings),
    )


def read_snapshot(
    path: str | os.PathLike[str],
    *,
    display_name: str | None = None,
    max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES,
) -> MemorySnapshot:
    """A ``.pickle`` / ``.pickle.gz`` memory snapshot, read without running anything."""
    path = Path(path)
    display = display_name or str(path)
    data = _read_capped(path, display, max_bytes)
    if not data:
        raise InputError(display, "is empty, not a memory snapshot")
    raw = _unpickle(data, display)
    protocol, size = _protocol(data), len(data)
    del data
    return replace(parse_snapshot(raw, display, bytes_read=size), pickle_protocol=protocol)
