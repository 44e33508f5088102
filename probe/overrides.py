"""``--override dataloader.KEY=VALUE``: the DataLoader arguments a re-run may change.

No torch here: the command line checks overrides before anything starts.
"""

from __future__ import annotations

from typing import Any

# the keys --override dataloader.KEY=VALUE accepts, with their type
OVERRIDE_KEYS: dict[str, type] = {
    "num_workers": int,
    "pin_memory": bool,
    "persistent_workers": bool,
    "prefetch_factor": int,
}
OVERRIDE_PREFIX = "dataloader."


def parse_override(text: str) -> tuple[str, Any]:
    """``dataloader.num_workers=4`` -> ("num_workers", 4); ValueError says what is allowed."""
    key, sep, raw = text.partition("=")
    allowed = ", ".join(f"dataloader.{k}" for k in OVERRIDE_KEYS)
    if not sep or not key.startswith("dataloader."):
        raise ValueError(f"--override {text!r}: expected dataloader.KEY=VALUE; keys: {allowed}")
    name = key.removeprefix("dataloader.")
    kind = OVERRIDE_KEYS.get(name)
    if kind is None:
        raise ValueError(f"--override {text!r}: unknown key {key!r}; keys: {allowed}")
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered not in ("true", "false", "1", "0"):
            raise ValueError(f"--override {text!r}: {name} takes true or false")
        return name, lowered in ("true", "1")
    try:
        number = int(raw)
    except ValueError:
        raise ValueError(f"--override {text!r}: {name} takes a whole number") from None
    least = 1 if name == "prefetch_factor" else 0
    if number < least:
        raise ValueError(f"--override {text!r}: {name} must be at least {least}")
    return name, number


def as_patch(overrides: dict[str, Any]) -> dict[str, Any]:
    """The overrides in a finding's ``config_patch`` keys: ``dataloader.num_workers``."""
    return {OVERRIDE_PREFIX + key: value for key, value in overrides.items()}


def from_patch(patch: dict[str, Any]) -> dict[str, Any]:
    """A ``config_patch`` of ``dataloader.*`` keys as overrides; ValueError for others."""
    overrides = {}
    for key, value in patch.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        name, parsed = parse_override(f"{key}={text}")
        overrides[name] = parsed
    return overrides
