"""per-sample-lookups: the step waits for one key-value read per sample.

What it finds
    Runs whose step records count the batch's key-value store reads (``store_reads``,
    ``store_keys``, ``store_read_ms``: the reference trainer's LMDB embedding store, or a
    script's LMDB reads as ``pipeline-doctor profile`` counts them) where
    the batch makes about one read transaction per sample, the step waits for the
    DataLoader (the data-wait share of the key metrics, over the steady-state steps) and
    those reads are a large part of that wait. Reported: reads and keys per batch, the
    read time per batch and per read, and its share of the data wait.

Why it matters
    Each read transaction pays a fixed cost (a transaction, a decode and a tensor per key
    locally; a network round trip for a remote store) however little it reads. Read in
    ``__getitem__``, a batch of 32 pays it 32 times; batched, once per shard. In a trace it
    reads only as "DataLoader wait", which more workers would hide only by multiplying the
    reads in flight.

How to fix
    Give the dataset a ``__getitems__(indices)``, which PyTorch's DataLoader calls with the
    whole batch's indices instead of ``__getitem__`` per index, and read the batch there
    with one ``batch_get`` (one read transaction per shard, keys sorted, LMDB's
    ``getmulti``). The reference trainer's switch is ``data.embedding_lookup=batched``.
    On a script run (``pipeline-doctor profile``, which counts the script's LMDB reads) the
    finding names the line that reads one key a call, with its source, and writes the
    ``__getitems__`` for that line's dataset class; there is no config patch (the fix is
    code), and no saving estimate (the store's shards, which bound the batched reads, are
    not known).
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from diagnostics.metrics import median_share_pct, steady_steps
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules import script_loaders, script_reads
from diagnostics.rules.base import Example, Finding, Fix, Rule, Severity, need_run_steps
from diagnostics.rules.evidence import chart, config_count, config_value, numeric, r
from diagnostics.rules.stats import median
from diagnostics.thresholds import Thresholds

COLUMNS = ("store_reads", "store_read_ms", "data_wait_ms", "step_time_ms", "batch_size")

FIX_CODE = """\
# before: one key-value read per sample, {reads} a batch
class Transactions(Dataset):
    def __getitem__(self, index):
        sample = self.rows[index]
        sample["vector"] = self.store.get(index)  # a read transaction per sample
        return sample

# after: DataLoader hands __getitems__ the whole batch's indices; one read per shard
class Transactions(Dataset):
    def __getitem__(self, index):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices):
        vectors = self.store.batch_get(indices)  # one txn per shard, sorted keys, getmulti
        return [{{**self.rows[i], "vector": v}} for i, v in zip(indices, vectors)]
"""


def _per_read(ms: float) -> str:
    # a local LMDB read takes microseconds, a remote store's a millisecond or more
    return f"{ms:.2f} ms" if ms >= 0.1 else f"{ms * 1e3:.1f} µs"


def _names_the_line(finding: Finding, site: str, dataset: str) -> None:
    """A script run's finding names the reading line and writes the fix for its class."""
    assert site in finding.recommendation, finding.recommendation
    assert f"# before: {site}" in finding.fix.code, finding.fix.code
    assert f"class {dataset}(Dataset):" in finding.fix.code, finding.fix.code
    assert "getmulti(sorted(keys))" in finding.fix.code, finding.fix.code
    assert finding.fix.config_patch is None
    assert finding.evidence["reading_site"]["site"] == site


class PerSampleLookups(Rule):
    id = "per-sample-lookups"
    title = "Each sample makes its own key-value read while the step waits"
    severity = Severity.HIGH
    needs = (need_run_steps(*COLUMNS),)
    threshold_names = (
        "store_reads_per_sample_min",
        "store_read_share_of_wait_min_pct",
        "dataloader_share_min_pct",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        assert inputs.run is not None
        steady = steady_steps(inputs.run.steps).drop_nulls(list(COLUMNS))
        if steady.height == 0:
            return []
        reads = median(numeric(steady, "store_reads"))
        batch = median(numeric(steady, "batch_size"))
        read_ms = median(numeric(steady, "store_read_ms"))
        wait_ms = median(numeric(steady, "data_wait_ms"))
        if reads < 2 or batch <= 0 or wait_ms <= 0:
            return []
        reads_per_sample = reads / batch
        if reads_per_sample < thresholds.store_reads_per_sample_min:
            return []
        wait_share = inputs.metrics.data_wait_pct
        if wait_share is None:
            wait_share = median_share_pct(steady["data_wait_ms"], steady["step_time_ms"])
        if wait_share is None or wait_share < thresholds.dataloader_share_min_pct:
            return []
        # with workers a read overlaps the step, so its time can exceed the wait it causes
        read_share = min(100.0, 100.0 * read_ms / wait_ms)
        if read_share < thresholds.store_read_share_of_wait_min_pct:
            return []
        return [
            self._finding(inputs, steady, reads, batch, read_ms, wait_ms, wait_share, read_share)
        ]

    def _finding(
        self,
        inputs: AnalysisInputs,
        steady: pl.DataFrame,
        reads: float,
        batch: float,
        read_ms: float,
        wait_ms: float,
        wait_share: float,
        read_share: float,
    ) -> Finding:
        run = inputs.run
        shards = config_count(run, "data.embedding_shards")
        keys = median(numeric(steady, "store_keys")) if "store_keys" in steady.columns else None
        step_ms = inputs.metrics.median_step_time_ms or median(numeric(steady, "step_time_ms"))
        saving = None
        if shards is not None and step_ms:
            # batched, the batch pays one read per shard instead of one per sample; what the
            # step waited for the reads is the most that can go
            after_ms = read_ms * min(1.0, shards / reads)
            hidden_ms = min(read_ms, wait_ms) - min(after_ms, min(read_ms, wait_ms))
            saving = min(100.0 * hidden_ms / step_ms, wait_share)
        patch = (
            {"data.embedding_lookup": "batched"}
            if config_value(run, "data.embedding_lookup") is not None
            else None
        )
        severity = Severity.HIGH if wait_share >= 20.0 else Severity.MEDIUM
        shard_text = (
            f" Batched, a batch makes one read per shard touched: at most {shards} here."
            if shards is not None
            else ""
        )
        site = script_reads.per_key_site(run)
        how = (
            "Read the batch in `__getitems__` with one `batch_get` instead of one `get` per "
            f"sample in `__getitem__`.{shard_text}"
        )
        fix = Fix(code=FIX_CODE.format(reads=f"{reads:g}"), config_patch=patch)
        if site is not None:
            loader = script_loaders.training_loader(run)
            function = f" ({site.function})" if site.function else ""
            code = f": `{site.code}`" if site.code else ""
            how = (
                f"{site.site}{function} reads one key a call with `{site.call}`{code}. Give "
                "the dataset a `__getitems__` that reads the batch in one transaction with "
                "one `Cursor.getmulti`."
            )
            fix = Fix(
                code=script_reads.fix_code(site, loader.dataset_class if loader else None),
                config_patch=None,
            )
        recommendation = (
            f"Each batch of {batch:g} samples makes {reads:g} key-value read transactions "
            f"(median), {read_ms:.1f} ms in all ({_per_read(read_ms / reads)} a read): "
            f"{pct(read_share)} of the {wait_ms:.1f} ms the step waits for its batch, and the "
            f"wait is {pct(wait_share)} of the step. {how}"
        )
        rest = [
            max(0.0, w - s)
            for w, s in zip(
                numeric(steady, "data_wait_ms"), numeric(steady, "store_read_ms"), strict=True
            )
        ]
        evidence: dict[str, Any] = {
            "source": "run step records (store reads per batch, steady-state steps)",
            "store_reads_per_batch_median": r(reads, 1),
            "store_keys_per_batch_median": r(keys, 1) if keys is not None else None,
            "batch_size_median": r(batch, 1),
            "store_reads_per_sample": r(reads / batch, 3),
            "store_read_ms_per_batch_median": r(read_ms),
            "store_read_ms_per_read": r(read_ms / reads, 3),
            "data_wait_ms_median": r(wait_ms),
            "store_read_share_of_data_wait_pct": r(read_share, 1),
            "data_wait_share_pct": r(wait_share, 1),
            "step_time_ms_median": step_ms,
            "embedding_lookup": config_value(run, "data.embedding_lookup"),
            "embedding_shards": shards,
            "num_workers": config_count(run, "data.num_workers"),
            # a script run: the line that read one key a call (probe.key_value_reads)
            "reading_site": (
                {
                    "site": site.site,
                    "function": site.function,
                    "call": site.call,
                    "calls": site.calls,
                    "code": site.code,
                }
                if site is not None
                else None
            ),
            "steps": [steady["step"][0], steady["step"][-1]],
            "chart": chart(
                "bar",
                "Key-value reads in the data wait of each step",
                "step",
                "time (ms)",
                steady["step"].to_list(),
                {
                    "store reads (ms)": numeric(steady, "store_read_ms"),
                    "rest of the wait (ms)": rest,
                },
            ),
        }
        return Finding(
            rule=self.id,
            severity=severity,
            title=(
                f"{reads:g} key-value reads a batch, one per sample: {pct(read_share)} of the "
                "data wait"
            ),
            evidence=evidence,
            recommendation=recommendation,
            fix=fix,
            estimated_saving_pct=r(saving, 1) if saving is not None else None,
        )

    examples: ClassVar = (
        Example(
            "run: 32 reads of ~1.1 ms a batch of 32, 36 of the 40 ms data wait, no workers",
            True,
            lambda: ex.cpu_run(
                20,
                step_time_ms=100.0,
                data_wait_ms=40.0,
                batch_size=32,
                store_reads=32,
                store_keys=32,
                store_read_ms=36.0,
                config={"data.embedding_lookup": "per-sample", "data.embedding_shards": 4},
            ),
        ),
        Example(
            "run: batch_get, 4 reads a batch of 32 (one per shard)",
            False,
            lambda: ex.cpu_run(
                20,
                step_time_ms=66.0,
                data_wait_ms=6.0,
                batch_size=32,
                store_reads=4,
                store_keys=32,
                store_read_ms=5.0,
                config={"data.embedding_lookup": "batched", "data.embedding_shards": 4},
            ),
        ),
        Example(
            "run: one read per sample, but workers hide it: 0.3 ms of a 60 ms step waits",
            False,
            lambda: ex.cpu_run(
                20,
                step_time_ms=60.0,
                data_wait_ms=0.3,
                batch_size=32,
                store_reads=32,
                store_keys=32,
                store_read_ms=30.0,
                config={"data.embedding_lookup": "per-sample", "data.num_workers": 2},
            ),
        ),
        Example(
            "run: one read per sample, 2 ms of a 40 ms wait: something else is slow",
            False,
            lambda: ex.cpu_run(
                20,
                step_time_ms=100.0,
                data_wait_ms=40.0,
                batch_size=32,
                store_reads=32,
                store_keys=32,
                store_read_ms=2.0,
                config={"data.embedding_lookup": "per-sample"},
            ),
        ),
        Example(
            "script run: lmdb_features.py:56 makes a transaction and a get per sample",
            True,
            lambda: ex.script_cpu_run(
                20,
                {
                    "key_value_reads": {
                        "library": "lmdb",
                        "sites": [
                            {
                                "site": "lmdb_features.py:56",
                                "function": "LmdbFeatures.__getitem__",
                                "call": "Transaction.get",
                                "calls": 5120,
                                "keys": 5120,
                                "code": "return txn.get(key_of(index))",
                            }
                        ],
                    }
                },
                step_time_ms=1.3,
                data_wait_ms=1.0,
                batch_size=256,
                store_reads=256,
                store_keys=256,
                store_read_ms=0.34,
            ),
            lambda finding: _names_the_line(finding, "lmdb_features.py:56", "LmdbFeatures"),
        ),
        Example(
            "script run: one getmulti a batch of 256 (one read transaction)",
            False,
            lambda: ex.script_cpu_run(
                20,
                {"key_value_reads": {"library": "lmdb", "sites": []}},
                step_time_ms=0.7,
                data_wait_ms=0.4,
                batch_size=256,
                store_reads=1,
                store_keys=256,
                store_read_ms=0.2,
            ),
        ),
        Example(
            "run: no store-read records (no store, or an older run)",
            False,
            lambda: ex.cpu_run(20, step_time_ms=100.0, data_wait_ms=40.0, batch_size=32),
            skipped=True,
        ),
    )
