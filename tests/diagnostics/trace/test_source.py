"""Reading bytes: plain and gzip, the decompression cap, broken gzip."""

from __future__ import annotations

import gzip
import os
import zlib

import pytest

from diagnostics.errors import InputError
from diagnostics.trace.source import DEFAULT_MAX_DECOMPRESSED_BYTES, iter_blocks

MIB = 1 << 20


def read_all(path, **kwargs) -> bytes:
    return b"".join(iter_blocks(path, **kwargs))


def test_plain_and_gzip_read_back_the_same_bytes_in_bounded_blocks(tmp_path):
    content = os.urandom(300_000).hex().encode()  # 600 kB of text
    plain = tmp_path / "t.json"
    plain.write_bytes(content)
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(content))
    for path in (plain, packed):
        blocks = list(iter_blocks(path, block_bytes=64 * 1024))
        assert b"".join(blocks) == content
        assert max(len(b) for b in blocks) <= 64 * 1024


def test_gzip_is_recognised_by_magic_bytes_not_by_name(tmp_path):
    misnamed = tmp_path / "trace.json"  # gzip content behind a .json name
    misnamed.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    assert read_all(misnamed) == b'{"traceEvents": []}'


def test_concatenated_gzip_members_are_one_stream(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b'{"a": ') + gzip.compress(b"1}"))
    assert read_all(path) == b'{"a": 1}'


def test_nul_padding_after_the_gzip_stream_is_ignored(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"[]") + b"\0" * 1000)
    assert read_all(path) == b"[]"


def test_garbage_after_the_gzip_stream_is_refused(tmp_path):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(b"[]") + b"not gzip")
    with pytest.raises(InputError, match=r"t\.json\.gz: has data after the end of its gzip"):
        read_all(path)


def test_truncated_gzip_names_the_file_and_says_truncated(tmp_path):
    whole = gzip.compress(os.urandom(50_000))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=r"cut\.json\.gz: is a truncated gzip file"):
        read_all(path)


def test_corrupt_gzip_body_is_refused(tmp_path):
    whole = bytearray(gzip.compress(b"x" * 100_000))
    for i in range(20, 40):  # inside the deflate stream, past the 10-byte header
        whole[i] ^= 0xFF
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(whole))
    with pytest.raises(InputError, match=r"bad\.json\.gz: is (not valid gzip|a truncated)"):
        read_all(path)


def test_gzip_bomb_stops_at_the_cap_without_inflating_the_rest(tmp_path):
    # 64 MiB of zeros deflate to ~64 kB; with a 1 MiB cap reading must stop at ~1 MiB
    bomb = tmp_path / "bomb.json.gz"
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    packed = b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()
    bomb.write_bytes(packed)
    assert len(packed) < MIB // 4
    seen = 0
    with pytest.raises(InputError, match=r"bomb\.json\.gz: decompresses to more than 1\.0 MiB"):
        for block in iter_blocks(bomb, max_bytes=MIB, block_bytes=256 * 1024):
            seen += len(block)
    # everything handed out stayed under the cap: the rest was never inflated into memory
    assert seen <= MIB


@pytest.mark.slow
def test_default_cap_stops_a_bomb_larger_than_two_gib(tmp_path):
    # gzip members may be concatenated: 2,100 copies of one 1 MiB-of-zeros member is a
    # 2.05 GiB stream from ~2 MB of file, just over the default 2 GiB cap
    member = gzip.compress(bytes(MIB), 9)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(member * 2100)
    assert 2100 * MIB > DEFAULT_MAX_DECOMPRESSED_BYTES
    with pytest.raises(InputError, match=r"decompresses to more than 2\.0 GiB"):
        for _ in iter_blocks(bomb):
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


def test_display_name_replaces_the_path_in_messages(tmp_path):
    path = tmp_path / "tmp123.json.gz"
    path.write_bytes(gzip.compress(b"[]")[:-8])  # no trailer
    with pytest.raises(InputError, match=r"^my-upload\.json\.gz: "):
        read_all(path, display="my-upload.json.gz")
