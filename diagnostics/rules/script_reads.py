"""The lines of a profiled script that read a key-value store, and the fix written for them.

A script run (``pipeline-doctor profile``) whose script read LMDB has, in run.json's
``probe.key_value_reads``, each line that read: its ``file:line``, the function it is in,
the call (``Transaction.get``, ``Cursor.get``, ``Cursor.getmulti``), how many calls and keys,
and the line's source (probe/key_values.py writes it). A per-sample-lookups finding on such a
run names the line that reads one key a call and gives a ``__getitems__`` for its dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnostics.sources import RunData

SINGLE_KEY_CALLS = ("Transaction.get", "Cursor.get")


@dataclass(frozen=True)
class ReadSite:
    site: str  # as shown: "train.py:41" (relative to the script's folder)
    function: str | None  # the qualified name: "LmdbFeatures.__getitem__"
    call: str
    calls: int
    keys: int
    code: str | None  # the line's source, stripped

    @property
    def owner_class(self) -> str | None:
        """``LmdbFeatures`` for a method ``LmdbFeatures.__getitem__``; None for a function."""
        if not self.function or "." not in self.function:
            return None
        owner = self.function.rsplit(".", 1)[0]
        return None if "<locals>" in owner.split(".")[-1] else owner.split(".")[-1]


def _site(raw: Any) -> ReadSite | None:
    if not isinstance(raw, dict):
        return None
    site, call = raw.get("site"), raw.get("call")
    calls, keys = raw.get("calls"), raw.get("keys")
    if not (isinstance(site, str) and isinstance(call, str)):
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (calls, keys)):
        return None
    function, code = raw.get("function"), raw.get("code")
    return ReadSite(
        site=site,
        function=function if isinstance(function, str) else None,
        call=call,
        calls=calls,
        keys=keys,
        code=code if isinstance(code, str) else None,
    )


def reading_sites(run: RunData | None) -> tuple[ReadSite, ...]:
    """Each line that read, most keys first; empty for a trainer run or no store."""
    if run is None or run.kind != "script":
        return ()
    probe = run.manifest.extra.get("probe")
    reads = probe.get("key_value_reads") if isinstance(probe, dict) else None
    raw_sites = reads.get("sites") if isinstance(reads, dict) else None
    if not isinstance(raw_sites, list):
        return ()
    sites = [s for s in (_site(raw) for raw in raw_sites) if s is not None]
    return tuple(sorted(sites, key=lambda s: -s.keys))


def per_key_site(run: RunData | None) -> ReadSite | None:
    """The line that read the most keys one call at a time (``get``), if any."""
    single = [s for s in reading_sites(run) if s.call in SINGLE_KEY_CALLS]
    return single[0] if single else None


def fix_code(site: ReadSite, dataset_class: str | None) -> str:
    """Before (the script's own line) and after: a ``__getitems__`` reading the batch in one
    transaction with one ``getmulti``, for the dataset class the line belongs to."""
    owner = site.owner_class or dataset_class or "YourDataset"
    where = f"{site.site}, in {site.function}" if site.function else site.site
    return f"""\
# before: {where}, one read transaction and one {site.call} per sample
#     {site.code or "(the line's source was not readable)"}

# after: DataLoader calls __getitems__ with the whole batch's indices when the dataset has
# one; read the batch in one transaction with one getmulti (keys sorted: LMDB walks its
# B-tree once, in order) and build the samples from the values
class {owner}(Dataset):
    def __getitems__(self, indices):
        keys = [self.key_of(index) for index in indices]  # the keys __getitem__ reads
        with self.env.begin() as txn:
            found = dict(txn.cursor().getmulti(sorted(keys)))
        return [self.sample_from(found[key]) for key in keys]  # what __getitem__ returns
"""
