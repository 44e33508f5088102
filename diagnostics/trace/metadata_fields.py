"""The numbers of a trace's ``deviceProperties`` and ``distributedInfo``, checked once.

They come from the user's file and are read far downstream: ``int("lots")`` for a
device's memory failed inside a rule (the finding was lost, a warning said why), and a
rank of 10**30 failed polars' Int32 cast as an internal error. Kineto writes whole
numbers; a whole float (``4.2e10``) or a string of digits is read as the number it says,
and anything else in a field the analyser uses is one :class:`InputError` naming the
file and the field.
"""

from __future__ import annotations

from typing import Any

from diagnostics.errors import InputError

# the fields of one deviceProperties entry read downstream (memory size, tensor-core
# generation, device id for matching kernels), each with the largest value that is a value
_DEVICE_FIELDS = {
    "id": 2**31 - 1,
    "totalGlobalMem": 2**62,
    "computeMajor": 2**15,
    "computeMinor": 2**15,
    "numSms": 2**31 - 1,
}
# ranks and world sizes are Int32 in the event table and the rank tables
_MOST_RANKS = 2**31 - 1


def _whole_number(value: Any) -> int | None:
    """``value`` as an int when it is one (an int, a whole finite float, a digit string)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit() and value.isascii():
        return int(value.strip())
    return None


def _checked(display: str, field: str, value: Any, least: int, most: int) -> int:
    number = _whole_number(value)
    if number is None:
        raise InputError(display, f"{field} is {value!r:.60}, not a whole number")
    if not least <= number <= most:
        raise InputError(display, f"{field} is {number:.3g}, out of range ({least} to {most:,})")
    return number


def checked_device_properties(display: str, devices: Any) -> tuple[dict[str, Any], ...]:
    """The entries of ``deviceProperties`` that are objects, their numeric fields as ints."""
    if not isinstance(devices, list):
        return ()
    checked = []
    for i, entry in enumerate(devices):
        if not isinstance(entry, dict):
            continue
        entry = dict(entry)
        for field, most in _DEVICE_FIELDS.items():
            if entry.get(field) is not None:
                where = f"deviceProperties[{i}].{field}"
                entry[field] = _checked(display, where, entry[field], 0, most)
        checked.append(entry)
    return tuple(checked)


def checked_distributed_info(display: str, info: Any) -> dict[str, Any] | None:
    """``distributedInfo`` with ``rank`` and ``world_size`` as ints, or None when absent.

    A negative rank (written by a process outside any process group) stays as it is: the
    loader reads it as "no rank", as before.
    """
    if not isinstance(info, dict):
        return None
    info = dict(info)
    rank = info.get("rank")
    if rank is not None and not (isinstance(rank, int) and not isinstance(rank, bool) and rank < 0):
        info["rank"] = _checked(display, "distributedInfo.rank", rank, 0, _MOST_RANKS - 1)
    if info.get("world_size") is not None:
        info["world_size"] = _checked(
            display, "distributedInfo.world_size", info["world_size"], 1, _MOST_RANKS
        )
    return info
