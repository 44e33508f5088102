"""Uploaded archives of rank traces: unpacked flat, bounded, and analysed like the files."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from diagnostics import views
from diagnostics.analyze import analyze_files
from diagnostics.errors import InputError
from diagnostics.unpack.archives import extract_traces

TRACE = b'{"traceEvents": []}'


def _zip(members: dict[str, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    buffer.seek(0)
    return buffer


def _tar_gz(members: dict[str, bytes], links: dict[str, str] | None = None) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            archive.addfile(info)
    buffer.seek(0)
    return buffer


def _recorder():
    seen = {}

    def analyse(paths, display_names):
        seen["paths"] = list(paths)
        seen["names"] = list(display_names)
        seen["data"] = [Path(p).read_bytes() for p in paths]
        return "ok"

    return analyse, seen


def test_a_zip_of_64_ranks_is_analysed_as_64_files(tmp_path: Path) -> None:
    members = {f"job/rank{r}.json": TRACE for r in range(64)}
    analyse, seen = _recorder()
    assert views.analyse_uploads([("job.zip", _zip(members))], analyse, tmp_path) == "ok"
    assert len(seen["paths"]) == 64
    assert seen["names"][5] == "job.zip/job/rank5.json"
    assert {Path(p).name for p in seen["paths"]} == {f"rank{r}.json" for r in range(64)}
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone


def test_member_paths_cannot_leave_the_folder(tmp_path: Path) -> None:
    inside = tmp_path / "upload"
    archive = _zip({"../../escape.json": TRACE, "/etc/abs.json": TRACE, "a/../../up.json": TRACE})
    written = extract_traces("evil.zip", archive, inside)
    assert len(written) == 3
    for _, path in written:
        assert path.parent == inside  # flat, under the folder, whatever the member said
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == [
        "abs.json",
        "escape.json",
        "up.json",
    ]
    assert not (tmp_path.parent / "escape.json").exists()


def test_links_and_non_traces_are_skipped(tmp_path: Path) -> None:
    archive = _tar_gz(
        {"rank0.json": TRACE, "README.md": b"hello", "inner.zip": b"PK", "._rank0.json": b"x"},
        links={"rank1.json": "/etc/passwd"},
    )
    written = extract_traces("ranks.tar.gz", archive, tmp_path / "x")
    assert [name for name, _ in written] == ["ranks.tar.gz/rank0.json"]


def test_a_zip_bomb_stops_at_the_byte_budget(tmp_path: Path) -> None:
    archive = _zip({"rank0.json": b" " * (4 * 2**20)})  # 4 MiB of spaces, a few KiB packed
    assert archive.getbuffer().nbytes < 64 * 1024
    with pytest.raises(InputError, match=r"^bomb.zip: unpacks to more than .* rank0.json"):
        extract_traces("bomb.zip", archive, tmp_path, max_bytes=2**20)


def test_member_count_is_bounded(tmp_path: Path) -> None:
    archive = _tar_gz({f"r{i}.txt": b"" for i in range(11)})
    with pytest.raises(InputError, match=r"^many.tar.gz: holds more than 10 members"):
        extract_traces("many.tar.gz", archive, tmp_path, max_members=10)
    with pytest.raises(InputError, match=r"^many.zip: holds more than 10 members"):
        extract_traces(
            "many.zip", _zip({f"r{i}.json": TRACE for i in range(11)}), tmp_path, max_members=10
        )


def test_broken_or_empty_archives_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^broken.zip: is not a readable archive"):
        extract_traces("broken.zip", io.BytesIO(b"not a zip"), tmp_path)
    with pytest.raises(InputError, match=r"^docs.zip: holds no trace files"):
        extract_traces("docs.zip", _zip({"a.txt": b"x"}), tmp_path)
    # expanded archives count towards the file limit
    members = {f"rank{r}.json": TRACE for r in range(views.MAX_UPLOAD_FILES)}
    with pytest.raises(InputError, match=r"too many at once"):
        views.analyse_uploads(
            [("all.zip", _zip(members)), ("extra.json", io.BytesIO(TRACE))],
            lambda *a, **k: None,
            tmp_path,
        )


def test_a_real_archive_of_rank_traces_is_analysed(shared_traces_dir: Path, tmp_path: Path) -> None:
    names = (
        "hta_a100_rank0_of_16.json.gz",
        "hta_a100_rank3_of_8.json.gz",
        "hta_v100_rank1_of_2_large.json.gz",
    )
    archive = _tar_gz({f"traces/{n}": (shared_traces_dir / n).read_bytes() for n in names})
    result = views.analyse_uploads([("traces.tar.gz", archive)], analyze_files, tmp_path)
    assert result.source["ranks"] == [0, 1, 3]
    assert result.source["files"][0] == "traces.tar.gz/traces/hta_a100_rank0_of_16.json.gz"
    assert result.summary["comm_source"] == "gpu_kernels"
