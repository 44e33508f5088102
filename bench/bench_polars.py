"""Benchmark: the trainer's data preparation in Polars against the same steps in pandas.

1. Writes a transactions CSV of about ``--mb`` MB with the trainer's own generator
   (``trainer.corpus.make_corpus``, in chunks of a million rows, seeds 0, 1, ...): the
   statement line, amount, date and both labels (the model text is left out: step 3 makes
   it).
2. Times, alternating the libraries for ``--rounds`` rounds (medians reported):
   - **read**: the whole CSV into a frame (``pl.read_csv`` / ``pd.read_csv``, both with
     their default engines and the dates parsed);
   - **group-by**: per category and merchant type, the count, sum and mean of the amount;
   - **clean text**: the trainer's statement-to-text steps (``trainer.corpus.preprocess``:
     lowercase, ``[*#]`` and digit runs replaced, whitespace squeezed, the amount band and
     the weekday appended) on the first ``--clean-rows`` rows;
   and checks that both libraries give the same answer.

The field guide reports 12.3 s -> 3.7 s for reading and 1.2 s -> 0.3 s for a group-by.

    .venv/bin/python bench/bench_polars.py                 # ~1 GB CSV, 3 rounds
    .venv/bin/python bench/bench_polars.py --mb 256 --rounds 1
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import polars as pl

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from trainer.corpus import amount_band, make_corpus, model_text  # noqa: E402

CHUNK_ROWS = 1_000_000
GUIDE = {"read": (12.3, 3.7), "group-by": (1.2, 0.3)}  # seconds, pandas -> Polars
COLUMNS = ["statement", "amount", "date", "category_id", "merchant_type_id"]


def write_csv(path: Path, megabytes: int) -> int:
    """About ``megabytes`` MB of the trainer's transactions; the rows written."""
    rows = 0
    with path.open("wb") as out:
        seed = 0
        while out.tell() < megabytes * 1e6:
            frame = make_corpus(CHUNK_ROWS, seed).select(COLUMNS)
            frame.write_csv(out, include_header=seed == 0)
            rows += frame.height
            seed += 1
    return rows


def polars_read(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, try_parse_dates=True)


def pandas_read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, parse_dates=["date"])


def polars_group(frame: pl.DataFrame) -> pl.DataFrame:
    return (
        frame.group_by("category_id", "merchant_type_id")
        .agg(
            pl.len().alias("count"),
            pl.col("amount").sum().alias("sum"),
            pl.col("amount").mean().alias("mean"),
        )
        .sort("category_id", "merchant_type_id")
    )


def pandas_group(frame: pd.DataFrame) -> pd.DataFrame:
    return (
        frame.groupby(["category_id", "merchant_type_id"])["amount"]
        .agg(["count", "sum", "mean"])
        .reset_index()
        .sort_values(["category_id", "merchant_type_id"])
    )


def polars_clean(frame: pl.DataFrame) -> pl.Series:
    # trainer.corpus.preprocess's own text expressions, from the statement line
    band = amount_band(pl.col("amount"))
    text = model_text(pl.col("statement"), band, pl.col("date"))
    return frame.select(text.alias("text"))["text"]


def pandas_clean(frame: pd.DataFrame) -> pd.Series:
    clean = (
        frame["statement"]
        .str.lower()
        .str.replace(r"[*#]", " ", regex=True)
        .str.replace(r"\d+", " num ", regex=True)
        .str.replace(r"\s+", " ", regex=True)
        .str.strip()
    )
    band = pd.Series(
        np.select(
            [frame["amount"] < 10, frame["amount"] < 100, frame["amount"] < 1000],
            ["small", "medium", "large"],
            "huge",
        ),
        index=frame.index,
    )
    weekday = frame["date"].dt.strftime("%a")
    return (clean + " amount " + band + " " + weekday).str.lower()


def _timed(work: Callable[[Any], Any], data: Any) -> tuple[float, Any]:
    gc.collect()
    started = time.perf_counter()
    result = work(data)
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="CSV size to generate, MB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clean-rows", type=int, default=1_000_000)
    parser.add_argument("--csv", type=Path, help="reuse this CSV instead of generating one")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.csv or Path(tmp) / "transactions.csv"
        if args.csv is None:
            started = time.perf_counter()
            rows = write_csv(path, args.mb)
            print(f"generated {rows:,} rows in {time.perf_counter() - started:.1f} s")
        size_mb = os.path.getsize(path) / 1e6
        times: dict[str, dict[str, list[float]]] = {
            step: {"pandas": [], "polars": []} for step in ("read", "group-by", "clean text")
        }
        for _ in range(args.rounds):
            seconds, pd_frame = _timed(pandas_read, path)
            times["read"]["pandas"].append(seconds)
            seconds, pl_frame = _timed(polars_read, path)
            times["read"]["polars"].append(seconds)
            assert pd_frame.shape == pl_frame.shape, (pd_frame.shape, pl_frame.shape)
            seconds, pd_groups = _timed(pandas_group, pd_frame)
            times["group-by"]["pandas"].append(seconds)
            seconds, pl_groups = _timed(polars_group, pl_frame)
            times["group-by"]["polars"].append(seconds)
            assert pd_groups["count"].tolist() == pl_groups["count"].to_list()
            assert np.allclose(pd_groups["mean"], pl_groups["mean"].to_numpy())
            head_pd, head_pl = pd_frame.head(args.clean_rows), pl_frame.head(args.clean_rows)
            seconds, pd_text = _timed(pandas_clean, head_pd)
            times["clean text"]["pandas"].append(seconds)
            seconds, pl_text = _timed(polars_clean, head_pl)
            times["clean text"]["polars"].append(seconds)
            assert pd_text.tolist() == pl_text.to_list()
            rows = pl_frame.height
            del pd_frame, pl_frame, head_pd, head_pl, pd_groups, pl_groups, pd_text, pl_text
    print(
        f"{size_mb:,.0f} MB CSV, {rows:,} rows (clean text: the first "
        f"{min(rows, args.clean_rows):,}); pandas {pd.__version__}, Polars {pl.__version__}; "
        f"median of {args.rounds} round(s); {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the end"
    )
    print()
    print("| step | pandas (s) | Polars (s) | speed-up | the guide |")
    print("|---|---:|---:|---:|---|")
    for step, by_library in times.items():
        pandas_s = statistics.median(by_library["pandas"])
        polars_s = statistics.median(by_library["polars"])
        guide = GUIDE.get(step)
        guide_text = f"{guide[0]} s → {guide[1]} s ({guide[0] / guide[1]:.1f}×)" if guide else "—"
        print(
            f"| {step} | {pandas_s:.2f} | {polars_s:.2f} | {pandas_s / polars_s:.1f}× | "
            f"{guide_text} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
