"""LMDB (the ``lmdb`` package): the script's reads, counted into probe.key_values.READS.

py-lmdb's ``Environment``, ``Transaction`` and ``Cursor`` are C extension types: they can be
neither patched nor subclassed. So when the script imports ``lmdb`` (the finder of
:mod:`probe.integrations` waits for it; nothing here imports it first) the module's names
``open``, ``Environment``, ``Transaction`` and ``Cursor`` become the proxy classes below.
``lmdb.open(...)`` then returns a proxy holding the real environment; its ``begin()`` a proxy
transaction, whose ``cursor()`` a proxy cursor. The proxies time and count the reads
(``Transaction.get``, ``Cursor.get``, ``Cursor.getmulti``, and a read transaction's begin
and end) and hand everything else to the real object unchanged. Objects made before the
import (none, in a script) and names taken from ``lmdb.cpython`` directly are not seen.

Reads also note their line in the script (the proxy's caller, one frame up), so a
finding can name it: every ``getmulti``, and one single-key read in ``SITE_SAMPLE``.
Measured (bench/bench_lmdb_probe.py, load ~10 on 2 cores, docs/BENCHMARKS.md): a one-key
transaction (begin, get, end) 1.3 us bare, 3.4 us proxied; a get in an open transaction
0.6 us bare, 1.5 us proxied; a 256-key ``getmulti`` within noise of bare. The time recorded is the library's own, inside the calls.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from time import perf_counter
from types import ModuleType
from typing import Any

from probe.key_values import READS

LIBRARY = "lmdb"
_REAL: dict[str, Any] = {}  # the module's own classes, while patched
_getframe = sys._getframe


# single-key reads note their line 1 in SITE_SAMPLE (by a process-wide count of them): the
# caller's frame object costs more than the rest of a proxied get (CPython 3.11 copies a
# materialised frame out when its function returns: ~1.5 us measured under load, against
# ~0.6 us for the timing and counting). A line read once per sample is still seen
# thousands of times a run; its calls are the sampled ones times SITE_SAMPLE
SITE_SAMPLE = 16


def _note_site(call: str, calls: int, keys: int) -> None:
    """The proxy's caller's line read ``keys`` values in ``calls`` calls."""
    frame = _getframe(2)
    code = frame.f_code
    where = (code.co_filename, frame.f_lineno)
    site = READS.sites.get(where)
    if site is None:
        READS.sites[where] = [call, code.co_qualname, calls, keys]
    else:
        site[2] += calls
        site[3] += keys


def _unwrap(obj: Any) -> Any:
    """The library's own object behind a proxy (or ``obj`` itself)."""
    return obj._real if isinstance(obj, _Proxy) else obj


class _Proxy:
    __slots__ = ("_real", "__weakref__")

    def __getattr__(self, name: str) -> Any:
        if name == "_real":  # not set yet: the real object's constructor failed
            raise AttributeError(name)
        # what is not timed (put, stat, info, iteration, ...) is the real object's own
        return getattr(self._real, name)

    def __repr__(self) -> str:
        return repr(self._real)


class Environment(_Proxy):
    """``lmdb.open`` / ``lmdb.Environment``: the real environment, with counted reads."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any):
        self._real = _REAL["Environment"](*args, **kwargs)

    def begin(
        self, db: Any = None, parent: Any = None, write: bool = False, buffers: bool = False
    ) -> Transaction:
        if parent is not None:
            parent = _unwrap(parent)
        started = perf_counter()
        txn = self._real.begin(db, parent, write, buffers)
        if not write:
            READS.seconds += perf_counter() - started
        proxy = _new_transaction(Transaction)
        proxy._real = txn
        proxy._reading = not write
        proxy._generation = -1
        return proxy

    def open_db(self, *args: Any, **kwargs: Any) -> Any:
        if "txn" in kwargs:
            kwargs["txn"] = _unwrap(kwargs["txn"])
        elif len(args) > 1:
            args = (args[0], _unwrap(args[1]), *args[2:])
        return self._real.open_db(*args, **kwargs)

    def __enter__(self) -> Environment:
        self._real.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._real.__exit__(*exc)


class Transaction(_Proxy):
    """A transaction; ``get`` is timed and counted, the first read of each step as a read."""

    __slots__ = ("_reading", "_generation")

    def __init__(
        self,
        env: Any,
        db: Any = None,
        parent: Any = None,
        write: bool = False,
        buffers: bool = False,
    ):
        started = perf_counter()
        self._real = _REAL["Transaction"](_unwrap(env), db, _unwrap(parent), write, buffers)
        if not write:
            READS.seconds += perf_counter() - started
        self._reading = not write
        self._generation = -1

    def get(self, key: Any, default: Any = None, db: Any = None) -> Any:
        reads = READS
        started = perf_counter()
        value = self._real.get(key, default, db)
        reads.seconds += perf_counter() - started
        reads.keys += 1
        if self._generation != reads.generation:
            self._generation = reads.generation
            reads.reads += 1
        reads.single_key_calls += 1
        if not reads.single_key_calls % SITE_SAMPLE:
            _note_site("Transaction.get", SITE_SAMPLE, SITE_SAMPLE)
        return value

    def cursor(self, db: Any = None) -> Cursor:
        proxy = _new_cursor(Cursor)
        proxy._real = self._real.cursor(db)
        proxy._txn = self
        return proxy

    def _ended(self, end: Callable[..., Any], *args: Any) -> Any:
        if not self._reading:
            return end(*args)
        started = perf_counter()
        try:
            return end(*args)
        finally:
            READS.seconds += perf_counter() - started

    def commit(self) -> Any:
        return self._ended(self._real.commit)

    def abort(self) -> Any:
        return self._ended(self._real.abort)

    def __enter__(self) -> Transaction:
        # the library's own __enter__ only returns the transaction: not called, a proxied
        # call being a good part of a one-key transaction's cost
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> Any:
        if not self._reading:
            return self._real.__exit__(kind, value, traceback)
        started = perf_counter()
        try:
            return self._real.__exit__(kind, value, traceback)
        finally:
            READS.seconds += perf_counter() - started


class Cursor(_Proxy):
    """A cursor; ``get`` and ``getmulti`` are timed and counted as their transaction's."""

    __slots__ = ("_txn",)

    def __init__(self, db: Any, txn: Any):
        self._real = _REAL["Cursor"](db, _unwrap(txn))
        self._txn = txn if isinstance(txn, Transaction) else None

    def _read(self, keys: int, started: float) -> None:
        reads = READS
        reads.seconds += perf_counter() - started
        reads.keys += keys
        txn = self._txn
        if txn is None:
            reads.reads += 1  # a cursor made on a transaction from before the patch
        elif txn._generation != reads.generation:
            txn._generation = reads.generation
            reads.reads += 1

    def get(self, key: Any, default: Any = None) -> Any:
        started = perf_counter()
        value = self._real.get(key, default)
        self._read(1, started)
        reads = READS
        reads.single_key_calls += 1
        if not reads.single_key_calls % SITE_SAMPLE:
            _note_site("Cursor.get", SITE_SAMPLE, SITE_SAMPLE)
        return value

    def getmulti(self, keys: Any, *args: Any, **kwargs: Any) -> Any:
        if not hasattr(keys, "__len__"):
            keys = list(keys)  # a generator: its length is the keys asked for
        started = perf_counter()
        values = self._real.getmulti(keys, *args, **kwargs)
        self._read(len(keys), started)
        _note_site("Cursor.getmulti", 1, len(keys))  # once a batch: each call noted
        return values

    def __iter__(self) -> Any:
        return iter(self._real)

    def __enter__(self) -> Cursor:
        self._real.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._real.__exit__(*exc)


# a proxy around an object the library made, without __init__ (which makes one)
_new_transaction = Transaction.__new__
_new_cursor = Cursor.__new__

_NAMES = {"open": Environment, "Environment": Environment}
_NAMES.update(Transaction=Transaction, Cursor=Cursor)


def patch_lmdb_module(module: ModuleType) -> Callable[[], None]:
    """Puts the proxies in place of the module's names; returns the undo."""
    originals = {name: getattr(module, name) for name in _NAMES}
    if "Environment" not in _REAL:
        _REAL.update(
            Environment=originals["Environment"],
            Transaction=originals["Transaction"],
            Cursor=originals["Cursor"],
        )
    for name, proxy in _NAMES.items():
        setattr(module, name, proxy)
    READS.activate(LIBRARY)

    def undo() -> None:
        for name, original in originals.items():
            setattr(module, name, original)

    return undo
