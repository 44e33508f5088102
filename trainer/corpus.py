"""The synthetic bank-transaction corpus and its WordPiece tokenizer (no torch here).

The corpus imitates card-statement lines: a merchant name wrapped in processor noise
("POS ", "SQ *", store numbers, city, shouting case, dropped letters), an amount and a
date; each row is labelled with the merchant's spending category and merchant type. It is
a deterministic function of (rows, seed): the same arguments give the same frame on any
machine, which exact resume and run-to-run comparisons rely on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

import numpy as np
import polars as pl
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import WordPieceTrainer

CORPUS_VERSION = 1  # bump when generation changes, so cached tokenizers are not reused

CATEGORIES: tuple[str, ...] = (
    "groceries",
    "dining",
    "transport",
    "utilities",
    "entertainment",
    "health",
    "shopping",
    "travel",
    "income",
    "transfer",
)
MERCHANT_TYPES: tuple[str, ...] = ("in_store", "online", "subscription", "atm", "bank")

# merchant, category, merchant type
MERCHANTS: tuple[tuple[str, str, str], ...] = (
    ("TESCO STORES", "groceries", "in_store"),
    ("SAINSBURYS", "groceries", "in_store"),
    ("LIDL GB", "groceries", "in_store"),
    ("OCADO RETAIL", "groceries", "online"),
    ("ALDI", "groceries", "in_store"),
    ("PRET A MANGER", "dining", "in_store"),
    ("DELIVEROO", "dining", "online"),
    ("JUST EAT", "dining", "online"),
    ("NANDOS", "dining", "in_store"),
    ("STARBUCKS", "dining", "in_store"),
    ("TFL TRAVEL CH", "transport", "online"),
    ("UBER TRIP", "transport", "online"),
    ("SHELL PETROL", "transport", "in_store"),
    ("TRAINLINE", "transport", "online"),
    ("BRITISH GAS", "utilities", "subscription"),
    ("THAMES WATER", "utilities", "subscription"),
    ("OCTOPUS ENERGY", "utilities", "subscription"),
    ("VODAFONE", "utilities", "subscription"),
    ("NETFLIX COM", "entertainment", "subscription"),
    ("SPOTIFY", "entertainment", "subscription"),
    ("ODEON CINEMAS", "entertainment", "in_store"),
    ("STEAM GAMES", "entertainment", "online"),
    ("BOOTS PHARMACY", "health", "in_store"),
    ("PUREGYM", "health", "subscription"),
    ("BUPA", "health", "subscription"),
    ("AMAZON MKTPLACE", "shopping", "online"),
    ("ARGOS", "shopping", "in_store"),
    ("IKEA", "shopping", "in_store"),
    ("EBAY", "shopping", "online"),
    ("RYANAIR", "travel", "online"),
    ("BOOKING COM", "travel", "online"),
    ("PREMIER INN", "travel", "in_store"),
    ("ACME LTD SALARY", "income", "bank"),
    ("HMRC REFUND", "income", "bank"),
    ("CASH WITHDRAWAL", "transfer", "atm"),
    ("LINK ATM", "transfer", "atm"),
    ("FASTER PAYMENT", "transfer", "bank"),
    ("STANDING ORDER", "transfer", "bank"),
)
_PREFIXES = ("", "", "", "POS ", "CARD PURCHASE ", "DEBIT ", "SQ *", "PAYPAL *", "CONTACTLESS ")
_CITIES = ("LONDON", "LEEDS", "MANCHESTER", "BRISTOL", "GLASGOW", "CARDIFF", "YORK", "")
_TYPICAL_AMOUNT = {  # median spend in pounds per category: amounts carry signal too
    "groceries": 25.0,
    "dining": 12.0,
    "transport": 8.0,
    "utilities": 60.0,
    "entertainment": 11.0,
    "health": 20.0,
    "shopping": 35.0,
    "travel": 120.0,
    "income": 1800.0,
    "transfer": 80.0,
}
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def make_corpus(rows: int, seed: int) -> pl.DataFrame:
    """``rows`` labelled transactions: text, amount, date, category_id, merchant_type_id."""
    rng = np.random.default_rng([seed, CORPUS_VERSION])
    # a few merchants dominate real statements: Zipf-like merchant frequencies
    weights = 1.0 / np.arange(1, len(MERCHANTS) + 1) ** 0.8
    merchant_idx = rng.choice(len(MERCHANTS), size=rows, p=weights / weights.sum())
    names = np.array([m[0] for m in MERCHANTS])[merchant_idx]
    category = np.array([CATEGORIES.index(m[1]) for m in MERCHANTS])[merchant_idx]
    mtype = np.array([MERCHANT_TYPES.index(m[2]) for m in MERCHANTS])[merchant_idx]
    typical = np.array([_TYPICAL_AMOUNT[c] for c in CATEGORIES])[category]
    raw = pl.DataFrame(
        {
            "merchant": names,
            "prefix": np.array(_PREFIXES)[rng.integers(0, len(_PREFIXES), rows)],
            "store": rng.integers(0, 10_000, rows),
            "has_store": rng.random(rows) < 0.5,
            "city": np.array(_CITIES)[rng.integers(0, len(_CITIES), rows)],
            "case": rng.integers(0, 3, rows),
            "drop_at": rng.integers(0, 40, rows),
            "drop": rng.random(rows) < 0.15,
            "amount": np.round(typical * rng.lognormal(0.0, 0.6, rows), 2),
            "day": rng.integers(0, 366, rows),
            "category_id": category,
            "merchant_type_id": mtype,
        }
    )
    return preprocess(raw)


def amount_band(amount: pl.Expr) -> pl.Expr:
    """The amount as a word (small, medium, large, huge): what the model text says of it."""
    return (
        pl.when(amount < 10)
        .then(pl.lit("small"))
        .when(amount < 100)
        .then(pl.lit("medium"))
        .when(amount < 1000)
        .then(pl.lit("large"))
        .otherwise(pl.lit("huge"))
    )


def model_text(statement: pl.Expr, band: pl.Expr, date: pl.Expr) -> pl.Expr:
    """The model's text from a statement line: lower case, digits as "num", no '*' or '#',
    then the amount band and the weekday."""
    clean = (
        statement.str.to_lowercase()
        .str.replace_all(r"[*#]", " ")
        .str.replace_all(r"\d+", " num ")
        .str.replace_all(r"\s+", " ")
        .str.strip_chars()
    )
    return pl.concat_str(
        [clean, pl.lit(" amount "), band, pl.lit(" "), date.dt.strftime("%a")]
    ).str.to_lowercase()


def preprocess(raw: pl.DataFrame) -> pl.DataFrame:
    """Noisy statement line -> model text, with polars expressions (no Python row loops)."""
    merchant = (
        pl.when(pl.col("drop") & (pl.col("drop_at") < pl.col("merchant").str.len_chars()))
        .then(  # a dropped letter, as truncating processors do
            pl.col("merchant").str.slice(0, pl.col("drop_at"))
            + pl.col("merchant").str.slice(pl.col("drop_at") + 1)
        )
        .otherwise(pl.col("merchant"))
    )
    store = (
        pl.when(pl.col("has_store"))
        .then(pl.lit(" #") + pl.col("store").cast(pl.String))
        .otherwise(pl.lit(""))
    )
    line = pl.concat_str([pl.col("prefix"), merchant, store, pl.lit(" "), pl.col("city")])
    line = (
        pl.when(pl.col("case") == 1)
        .then(line.str.to_lowercase())
        .when(pl.col("case") == 2)
        .then(line.str.to_titlecase())
        .otherwise(line)
    )
    date = pl.date(2024, 1, 1) + pl.duration(days=pl.col("day"))
    frame = raw.with_columns(
        statement=line.str.strip_chars(), date=date, band=amount_band(pl.col("amount"))
    )
    text = model_text(pl.col("statement"), pl.col("band"), pl.col("date"))
    return frame.select(
        "statement",
        text.alias("text"),
        "amount",
        "date",
        pl.col("category_id").cast(pl.Int64),
        pl.col("merchant_type_id").cast(pl.Int64),
    )


def _new_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def _finish(tokenizer: Tokenizer, max_length: int) -> Tokenizer:
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )
    tokenizer.enable_truncation(max_length=max_length)
    tokenizer.enable_padding(length=max_length, pad_id=tokenizer.token_to_id("[PAD]"))
    return tokenizer


def train_tokenizer(
    texts: list[str], vocab_size: int, max_length: int, cache_dir: Path | None = None
) -> Tokenizer:
    """A WordPiece tokenizer trained on ``texts`` here (never downloaded).

    Training is not deterministic: the library breaks ties between equally frequent pairs
    in hash order, so two trainings on the same texts can number (and, at the vocabulary
    limit, choose) tokens differently. Hence a cache under ``cache_dir``, keyed by a hash of
    the texts and the vocabulary size, that the first writer wins: every run on the same
    corpus in one runs directory then uses the same tokenizer, and the run folder keeps its
    own copy (``tokenizer.json``) for resume.
    """
    digest = hashlib.sha256()
    digest.update(f"v{CORPUS_VERSION}:{vocab_size}\n".encode())
    for text in texts:
        digest.update(text.encode() + b"\n")
    cached = cache_dir / f"wordpiece-{digest.hexdigest()[:20]}.json" if cache_dir else None
    if cached is not None and cached.exists():
        with contextlib.suppress(Exception):  # a torn file: retrain below
            return load_tokenizer(cached, max_length)
        cached.unlink(missing_ok=True)
    tokenizer = _new_tokenizer()
    trainer = WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        tmp.write_text(tokenizer.to_str())
        try:
            os.link(tmp, cached)  # atomic and exclusive: fails if another run got there first
        except FileExistsError:
            tmp.unlink(missing_ok=True)
            return load_tokenizer(cached, max_length)
        tmp.unlink(missing_ok=True)
    return _finish(tokenizer, max_length)


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    return _finish(Tokenizer.from_file(str(path)), max_length)


def save_tokenizer(tokenizer: Tokenizer, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(tokenizer.to_str())
    os.replace(tmp, path)
