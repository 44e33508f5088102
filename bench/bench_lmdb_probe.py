"""Benchmark: what the probe's LMDB proxies add to each read (probe/integrations/lmdb.py).

The same page-cached store is read bare (``lmdb.cpython``'s own classes) and through the
proxies a profiled script gets from ``lmdb.open``, alternating the two for ``--rounds``
rounds so both see the same drift in the machine's load (the first round is a warm-up):

- ``txn + get``: a one-key read transaction, what a per-sample ``__getitem__`` does;
- ``get``: one get in a transaction kept open;
- ``getmulti``: one ``Cursor.getmulti`` of ``--batch`` sorted keys in one transaction.

Reported per call: the median bare and proxied time, what the proxy adds, and the ratio.

``--script-rounds N`` then profiles tests/scripts/lmdb_features.py (one get per sample in
``__getitem__``) and its ``--batched`` version (one getmulti a batch in ``__getitems__``)
under ``python -m probe profile``, alternated N times, and prints each's median step, data
wait, reads and read time a batch, and whether per-sample-lookups fired.

    .venv/bin/python bench/bench_lmdb_probe.py --script-rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from probe.integrations import Integrations  # noqa: E402
from probe.key_values import READS  # noqa: E402


def _key(index: int) -> bytes:
    return index.to_bytes(8, "big")


def _cases(env, keys: list[bytes], batch: int) -> dict[str, Callable]:
    held = env.begin()
    sorted_batches = [sorted(keys[i : i + batch]) for i in range(0, len(keys), batch)]

    def txn_get() -> int:
        for key in keys:
            with env.begin() as txn:
                txn.get(key)
        return len(keys)

    def get() -> int:
        for key in keys:
            held.get(key)
        return len(keys)

    def getmulti() -> int:
        for chunk in sorted_batches:
            with env.begin() as txn:
                txn.cursor().getmulti(chunk)
        return len(sorted_batches)

    return {"txn + get": txn_get, "get": get, f"getmulti ({batch} keys)": getmulti}


SCRIPT = REPO_ROOT / "tests" / "scripts" / "lmdb_features.py"


def _profile_script(runs: Path, batched: bool) -> dict[str, float | str]:
    from diagnostics.analyze import analyze
    from diagnostics.runs import RunFolder

    command = [sys.executable, "-m", "probe", "profile", "--runs-dir", str(runs), "--no-trace"]
    command += [str(SCRIPT), "--steps", "60", *(["--batched"] if batched else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    folder = RunFolder(Path(done.stdout.strip().splitlines()[-1]))
    steps = folder.steps().filter(folder.steps()["step"] > 1)
    fired = [f for f in analyze(folder.path).findings if f.rule == "per-sample-lookups"]
    return {
        "step_ms": steps["step_time_ms"].median(),
        "wait_ms": steps["data_wait_ms"].median(),
        "reads": steps["store_reads"].median(),
        "read_ms": steps["store_read_ms"].median(),
        "finding": (
            f"fires: {fired[0].evidence['store_read_share_of_data_wait_pct']} % of the wait"
            if fired
            else "silent"
        ),
    }


def script_table(rounds: int) -> None:
    results: dict[bool, list[dict[str, float | str]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for batched in (False, True):
                results[batched].append(_profile_script(Path(tmp) / "runs", batched))
    print(f"\ntests/scripts/lmdb_features.py under the probe ({rounds} alternated rounds, medians)")
    print(
        f"{'dataset':<34}{'step ms':>9}{'wait ms':>9}{'reads':>7}{'read ms':>9}  per-sample-lookups"
    )
    for batched, label in (
        (False, "one get per sample (__getitem__)"),
        (True, "getmulti a batch (__getitems__)"),
    ):
        runs = results[batched]
        med = {
            k: statistics.median(float(r[k]) for r in runs)
            for k in ("step_ms", "wait_ms", "reads", "read_ms")
        }
        findings = sorted({str(r["finding"]) for r in runs})
        print(
            f"{label:<34}{med['step_ms']:>9.2f}{med['wait_ms']:>9.2f}{med['reads']:>7.0f}"
            f"{med['read_ms']:>9.2f}  {'; '.join(findings)}"
        )
    before = statistics.median(float(r["step_ms"]) for r in results[False])
    after = statistics.median(float(r["step_ms"]) for r in results[True])
    print(f"median step ratio (per sample / batched): {before / after:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--reads", type=int, default=20_000, help="keys read a round")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--script-rounds", type=int, default=0)
    args = parser.parse_args(argv)

    import random

    integrations = Integrations(print)
    integrations.install()
    import lmdb
    import lmdb.cpython as bare

    with tempfile.TemporaryDirectory() as tmp:
        env = bare.open(tmp, map_size=2**28)
        with env.begin(write=True) as txn:
            for index in range(args.keys):
                txn.put(_key(index), bytes(64), append=True)
        env.close()
        rng = random.Random(0)
        keys = [_key(rng.randrange(args.keys)) for _ in range(args.reads)]
        # one environment (LMDB refuses a second of the same path in a process): the proxy,
        # and the library's own object it holds
        proxied = lmdb.open(tmp, readonly=True, lock=False, readahead=False)
        cases = {
            "bare": _cases(proxied._real, keys, args.batch),
            "probe": _cases(proxied, keys, args.batch),
        }
        times: dict[tuple[str, str], list[float]] = {}
        for round_ in range(args.rounds):
            for name in cases["bare"]:
                for kind in ("bare", "probe"):
                    started = time.perf_counter()
                    calls = cases[kind][name]()
                    per_call_us = (time.perf_counter() - started) / calls * 1e6
                    READS.take()
                    if round_:
                        times.setdefault((name, kind), []).append(per_call_us)
    integrations.uninstall()

    print(f"LMDB reads bare and through the probe's proxies ({args.rounds - 1} rounds, medians)")
    print(f"{'call':<22}{'bare us':>10}{'probe us':>10}{'added us':>10}{'ratio':>8}")
    for name in cases["bare"]:
        bare_us = statistics.median(times[(name, "bare")])
        probe_us = statistics.median(times[(name, "probe")])
        print(
            f"{name:<22}{bare_us:>10.2f}{probe_us:>10.2f}{probe_us - bare_us:>10.2f}"
            f"{probe_us / bare_us:>8.2f}"
        )
    if args.script_rounds:
        script_table(args.script_rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
