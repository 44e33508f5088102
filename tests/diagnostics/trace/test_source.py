"""Reading bytes: plain and gzip, the decompression cap, broken gzip.

Every gzip case runs with both inflaters, ISA-L (``isal``, the default where installed) and
stdlib zlib, forced through ``iter_blocks(inflater=...)``: the bytes and the messages must
not depend on which one the host has.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import struct
import zlib
from functools import cache
from pathlib import Path

import pytest

from diagnostics.errors import InputError
from diagnostics.trace import source
from diagnostics.trace.source import (
    _READ_BYTES,
    CORRUPT_GZIP,
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    ISAL,
    ZLIB,
    default_inflater,
    iter_blocks,
)
from tests.diagnostics.trace.helpers import provenance_trace_names

MIB = 1 << 20
REQUIREMENTS = Path(__file__).resolve().parents[3] / "requirements.txt"

INFLATERS = [
    pytest.param(ZLIB, id="zlib"),
    pytest.param(ISAL, id="isal"),
]


@pytest.fixture(params=INFLATERS)
def inflater(request):
    # None would be iter_blocks' default (zlib): an ISA-L case must not pass as a zlib one
    assert request.param is not None, "isal does not import (requirements.txt pins it)"
    return request.param


def _both():
    assert ISAL is not None, "isal does not import (requirements.txt pins it)"
    return (ZLIB, ISAL)


def read_all(path, **kwargs) -> bytes:
    return b"".join(iter_blocks(path, **kwargs))


def outcome(path, inflater, **kwargs) -> tuple[str, int, str]:
    """(the InputError's text or "ok", bytes handed out, their sha256), streaming."""
    digest = hashlib.sha256()
    seen = 0
    try:
        for block in iter_blocks(path, inflater=inflater, **kwargs):
            assert len(block) <= kwargs.get("block_bytes", MIB)
            digest.update(block)
            seen += len(block)
    except InputError as exc:
        return str(exc), seen, digest.hexdigest()
    return "ok", seen, digest.hexdigest()


def test_isal_is_installed_here_and_is_the_default():
    # requirements.txt pins isal, so the tests' environment has it: a missing or broken
    # install fails here (and in each ISA-L case below) instead of skipping them all
    pinned = [line for line in REQUIREMENTS.read_text().splitlines() if line.startswith("isal==")]
    assert pinned, f"{REQUIREMENTS} no longer pins isal: drop the ISA-L cases with it"
    assert ISAL is not None, f"{pinned[0]} is pinned but isal_zlib does not import"
    assert default_inflater() is ISAL and ISAL.name == "isal"


def test_zlib_is_the_default_where_isal_does_not_import(monkeypatch):
    monkeypatch.setattr(source, "ISAL", None)
    assert default_inflater() is ZLIB


def test_plain_and_gzip_read_back_the_same_bytes_in_bounded_blocks(tmp_path, inflater):
    content = os.urandom(300_000).hex().encode()  # 600 kB of text
    plain = tmp_path / "t.json"
    plain.write_bytes(content)
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(content))
    for path in (plain, packed):
        blocks = list(iter_blocks(path, block_bytes=64 * 1024, inflater=inflater))
        assert b"".join(blocks) == content
        assert max(len(b) for b in blocks) <= 64 * 1024


def test_gzip_is_recognised_by_magic_bytes_not_by_name(tmp_path, inflater):
    misnamed = tmp_path / "trace.json"  # gzip content behind a .json name
    misnamed.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert read_all(misnamed, inflater=inflater) == b'{"traceEvents": []}'


def test_concatenated_gzip_members_are_one_stream(tmp_path, inflater):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b'{"a": ') + gzip.compress(b"1}"))
    assert read_all(path, inflater=inflater) == b'{"a": 1}'


def test_nul_padding_after_the_gzip_stream_is_ignored(tmp_path, inflater):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"[]") + b"\0" * 1000)
    assert read_all(path, inflater=inflater) == b"[]"


def test_garbage_after_the_gzip_stream_is_refused(tmp_path, inflater):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"[]") + b"not gzip")
    with pytest.raises(InputError, match=r"t\.json\.gz: has data after the end of its gzip"):
        read_all(path, inflater=inflater)


def test_truncated_gzip_names_the_file_and_says_truncated(tmp_path, inflater):
    whole = gzip.compress(os.urandom(50_000))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"cut\.json\.gz: is a truncated gzip file"):
        read_all(path, inflater=inflater)


def test_corrupt_gzip_body_is_refused(tmp_path, inflater):
    whole = bytearray(gzip.compress(b"x" * 100_000))
    for i in range(20, 40):  # inside the deflate stream, past the 10-byte header
        whole[i] ^= 0xFF
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(whole))
    with pytest.raises(InputError, match=r"bad\.json\.gz: is (not valid gzip|a truncated)"):
        read_all(path, inflater=inflater)


def test_gzip_bomb_stops_at_the_cap_without_inflating_the_rest(tmp_path, inflater):
    # 64 MiB of zeros deflate to ~64 kB; with a 1 MiB cap reading must stop at ~1 MiB
    bomb = tmp_path / "bomb.json.gz"
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    packed = b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()
    bomb.write_bytes(packed)
    assert len(packed) < MIB // 4
    seen = 0
    with pytest.raises(InputError, match=r"bomb\.json\.gz: decompresses to more than 1\.0 MiB"):
        for block in iter_blocks(bomb, max_bytes=MIB, block_bytes=256 * 1024, inflater=inflater):
            seen += len(block)
    # everything handed out stayed under the cap: the rest was never inflated into memory
    assert seen <= MIB


@pytest.mark.slow
def test_default_cap_stops_a_bomb_larger_than_two_gib(tmp_path, inflater):
    # gzip members may be concatenated: 2,100 copies of one 1 MiB-of-zeros member is a
    # 2.05 GiB stream from ~2 MB of file, just over the default 2 GiB cap
    member = gzip.compress(bytes(MIB), 9)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(member * 2100)
    assert 2100 * MIB > DEFAULT_MAX_DECOMPRESSED_BYTES
    with pytest.raises(InputError, match=r"decompresses to more than 2\.0 GiB"):
        for _ in iter_blocks(bomb, inflater=inflater):
            pass


def test_plain_file_over_the_cap_is_refused(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * (2 * MIB))
    with pytest.raises(InputError, match=r"big\.json: is more than 1\.0 MiB of JSON"):
        read_all(path, max_bytes=MIB)


def test_missing_file_and_folder_are_input_errors(tmp_path):
    with pytest.raises(InputError, match=r"nope\.json: no such file"):
        read_all(tmp_path / "nope.json")
    with pytest.raises(InputError, match="is a folder"):
        read_all(tmp_path)


def test_display_name_replaces_the_path_in_messages(tmp_path, inflater):
    path = tmp_path / "tmp123.json.gz"
    path.write_bytes(gzip.compress(b"[]")[:-8])  # no trailer
    with pytest.raises(InputError, match=r"^my-upload\.json\.gz: "):
        read_all(path, display="my-upload.json.gz", inflater=inflater)


@pytest.mark.parametrize("name", sorted(provenance_trace_names()))
def test_every_shared_trace_inflates_to_the_same_bytes_with_both(shared_traces_dir, name):
    # read in place and hashed block by block: no whole inflated trace is ever held
    path = shared_traces_dir / name
    expected = hashlib.sha256()
    with gzip.open(path) as handle:  # stdlib gzip, an oracle apart from iter_blocks
        while chunk := handle.read(MIB):
            expected.update(chunk)
    for inflater in _both():
        status, seen, digest = outcome(path, inflater)
        assert (status, digest) == ("ok", expected.hexdigest()), inflater.name
        assert seen > 0


def _member(data: bytes, *, flags: int = 0, extra: bytes = b"", method: int = 8) -> bytes:
    """One gzip member built by hand: header (FLG ``flags``, ``extra`` after the fixed
    10 bytes), raw deflate of ``data``, CRC-32 and length."""
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = packer.compress(data) + packer.flush()
    header = b"\x1f\x8b" + bytes([method, flags]) + bytes(4) + b"\x00\xff" + extra
    return header + body + struct.pack("<II", zlib.crc32(data), len(data) & 0xFFFFFFFF)


def _json_like(n_events: int, seed: int) -> bytes:
    return (
        b"["
        + b",".join(
            b'{"ph":"X","name":"k%d","ts":%d,"dur":%d}' % ((i * seed) % 41, i * 7, (i * seed) % 97)
            for i in range(n_events)
        )
        + b"]"
    )


@cache
def _hostile_cases() -> dict[str, tuple[bytes, str, bytes | None]]:
    """name -> (file bytes, message after ``<path>: `` or "ok", the content when ok)."""
    a, b = _json_like(20_000, 3), _json_like(30_000, 5)
    gz_a = gzip.compress(a)
    many = [_json_like(8_000, seed) for seed in range(1, 60)]  # members straddle 1 MiB reads
    truncated = "is a truncated gzip file (the stream ends early)"
    after = "has data after the end of its gzip stream"
    bad_header_crc = _member(a, flags=0x02, extra=b"\0\0")
    return {
        "two_members": (gz_a + gzip.compress(b), "ok", a + b),
        "many_members_across_reads": (b"".join(map(gzip.compress, many)), "ok", b"".join(many)),
        "an_empty_member_between": (gz_a + gzip.compress(b"") + gzip.compress(b), "ok", a + b),
        "header_fields": (_member(a, flags=0x04 | 0x08, extra=b"\3\0abcname\0"), "ok", a),
        "nul_padding": (gz_a + b"\0" * 1000, "ok", a),
        "nul_padding_over_reads": (gz_a + b"\0" * (3 * MIB), "ok", a),
        "garbage_after": (gz_a + b"not gzip", after, None),
        "garbage_after_padding": (gz_a + b"\0" * 100 + b"x", after, None),
        "truncated_in_the_middle": (gz_a[: len(gz_a) // 2], truncated, None),
        "truncated_in_the_header": (gz_a[:5], truncated, None),
        "magic_only": (b"\x1f\x8b", truncated, None),
        "no_trailer": (gz_a[:-8], truncated, None),
        "trailer_short_by_one": (gz_a[:-1], truncated, None),
        "second_member_magic_only": (gz_a + b"\x1f\x8b", truncated, None),
        "second_member_truncated": (gz_a + gz_a[:100], truncated, None),
        "bad_crc": (gz_a[:-8] + b"\0\0\0\0" + gz_a[-4:], CORRUPT_GZIP, None),
        "bad_length": (gz_a[:-4] + b"\1\0\0\0", CORRUPT_GZIP, None),
        "bad_header_crc": (bad_header_crc, CORRUPT_GZIP, None),
        # zlib refuses reserved FLG bits; ISA-L would read on: iter_blocks refuses for both
        "reserved_flag_bits": (_member(a, flags=0x20), CORRUPT_GZIP, None),
        "reserved_flag_bits_second_member": (gz_a + _member(b, flags=0x80), CORRUPT_GZIP, None),
        "unknown_method": (_member(a, method=7), CORRUPT_GZIP, None),
        "invalid_block_type": (
            gz_a[:10] + bytes([gz_a[10] | 0x06]) + gz_a[11:],
            CORRUPT_GZIP,
            None,
        ),
    }


@pytest.mark.parametrize("case", sorted(_hostile_cases()))
def test_hostile_gzip_gives_the_same_result_and_message_with_both(tmp_path, case):
    data, message, content = _hostile_cases()[case]
    path = tmp_path / "t.json.gz"
    path.write_bytes(data)
    expected = "ok" if message == "ok" else f"{path}: {message}"
    handed_out = {}
    for inflater in _both():
        blocks: list[bytes] = []
        try:
            for block in iter_blocks(path, inflater=inflater, block_bytes=64 * 1024):
                assert len(block) <= 64 * 1024
                blocks.append(block)
            status = "ok"
        except InputError as exc:
            status = str(exc)
        assert status == expected, inflater.name
        handed_out[inflater.name] = b"".join(blocks)
    if content is not None:
        assert handed_out["zlib"] == handed_out["isal"] == content
    else:
        # before an error both hand out the same bytes, but on a stream that ends early
        # ISA-L may hold back the last few it decoded (it reads ahead): one is a prefix
        shorter, longer = sorted(handed_out.values(), key=len)
        assert longer.startswith(shorter)
        assert len(longer) - len(shorter) < 64


def test_a_bomb_over_the_budget_stops_alike_with_both(tmp_path):
    member = gzip.compress(bytes(4 * MIB), 9)  # ~4 kB each
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(member * 64)  # 256 MiB of zeros from ~260 kB
    results = [outcome(bomb, inf, max_bytes=3 * MIB, block_bytes=256 * 1024) for inf in _both()]
    assert results[0] == results[1]
    status, seen, _ = results[0]
    assert status.startswith(f"{bomb}: decompresses to more than 3.0 MiB of JSON")
    assert seen <= 3 * MIB


def _member_of_size(size: int, data: bytes) -> bytes:
    """A valid gzip member of ``data``, exactly ``size`` bytes: a FEXTRA field takes up the
    slack (``data`` must not compress, and be a little smaller than ``size``)."""
    bare = _member(data, flags=0x04, extra=b"\0\0")
    slack = size - len(bare)
    assert 0 <= slack <= 0xFFFF, slack
    return _member(data, flags=0x04, extra=struct.pack("<H", slack) + b"x" * slack)


@pytest.mark.parametrize("in_first_read", [1, 2, 3, 4])
def test_a_member_whose_header_straddles_a_read_is_read(tmp_path, inflater, in_first_read):
    # the second member's first `in_first_read` bytes end one 1 MiB read, the rest begin the
    # next: its magic (1) or its FLG byte (1-3) is only whole after another read
    data = random.Random(in_first_read).randbytes(1_000_000)
    first = _member_of_size(_READ_BYTES - in_first_read, data)
    path = tmp_path / "t.json.gz"
    path.write_bytes(first + _member(b'{"b": 2}'))
    assert read_all(path, inflater=inflater) == data + b'{"b": 2}'
    path.write_bytes(first + _member(b'{"b": 2}', flags=0x40))  # a reserved FLG bit
    with pytest.raises(InputError, match=r"t\.json\.gz: is not valid gzip"):
        read_all(path, inflater=inflater)
