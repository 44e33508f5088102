"""Markdown-safe pages: values from run folders, uploads and the URL are shown as text.

Real runs (written by the real trainer) are copied and their run.json / status.json given
markdown links, images and HTML in the run id, scenario, parent id, device, status reason,
config and patch; an upload gets such a file name; ``?run=`` holds a value that closes the
code span it is shown in. AppTest: no element's markdown makes a link, image or HTML.
Chromium (through scripts/serve.py with a token): no link or image to the attacker's host
exists and the browser asks that host for nothing, while the values read as written.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import pytest

from app_ui.safe_text import shown
from diagnostics.runs import HEARTBEAT_INTERVAL_S, RunWriter
from tests.app.conftest import REPO_ROOT, TrainedRuns, _free_port
from tests.app.markup import active_markup
from tests.app.test_e2e import wait_idle
from tests.app.test_pages import TIMEOUT_S, open_page

EVIL = "evil.example"
RUN_ID = f"run-![r](http://{EVIL}/run.png)-[r](http://{EVIL}/run)"
CHILD_ID = f'child-<img src="http://{EVIL}/child.png">-[c](http://{EVIL}/child)'
SCENARIO = f"![s](http://{EVIL}/scenario.png)"
PARENT_ID = f'[p](http://{EVIL}/parent) <img src="http://{EVIL}/parent.png">'
DEVICE = f"<img src=http://{EVIL}/device.png> www.{EVIL}"
REASON = f"[why](http://{EVIL}/reason) ![w](http://{EVIL}/reason.png) :red[alarm]"
CONFIG_VALUE = f"[c](http://{EVIL}/config) ![c](http://{EVIL}/config.png)"
BUSY_ID = f"busy-![b](http://{EVIL}/busy.png)-[b](http://{EVIL}/busy)"
# closes the code span the "not found" message puts it in, then an image and a link
QUERY = f"x` ![q](http://{EVIL}/query.png) [q](http://{EVIL}/query) `y"
UPLOAD_NAME = f"![u](https:{EVIL}) [l](https:{EVIL}) <img src=https:{EVIL}>.json.gz"


def _edit_json(path: Path, **fields: Any) -> None:
    raw = json.loads(path.read_text())
    raw.update(fields)
    path.write_text(json.dumps(raw))


def make_hostile_runs(trained: TrainedRuns, runs_dir: Path) -> None:
    """Two real, analysable runs whose records a hostile writer filled, and a live one."""
    runs_dir.mkdir(parents=True)
    for source, folder, run_id, parent in (
        (trained.slow, "hostile-a", RUN_ID, PARENT_ID),
        (trained.fixed, "hostile-b", CHILD_ID, RUN_ID),
    ):
        shutil.copytree(source, runs_dir / folder)
        manifest = json.loads((runs_dir / folder / "run.json").read_text())
        config = {**manifest["config"], "scenario": SCENARIO, "note": CONFIG_VALUE}
        _edit_json(
            runs_dir / folder / "run.json",
            run_id=run_id,
            parent_run_id=parent,
            config=config,
            environment={**manifest["environment"], "device": DEVICE},
            applied_patch={"data.num_workers": 2, "note": CONFIG_VALUE},
        )
        _edit_json(runs_dir / folder / "status.json", reason=REASON)
    busy = RunWriter.create(runs_dir, {"scenario": "healthy"}, {}, run_id="busy", total_steps=99)
    busy.update_manifest(run_id=BUSY_ID)
    busy.append_step({"step": 1, "wall_time": time.time(), "step_time_ms": 10.0})
    busy.heartbeat()


def keep_alive(runs_dir: Path) -> None:
    """The live run's heartbeat, refreshed so it stays 'running' for the whole test."""
    status = runs_dir / "busy" / "status.json"
    raw = json.loads(status.read_text())
    raw.update(heartbeat=time.time(), reason=REASON)
    scratch = status.with_suffix(".json.tmp")  # replaced whole: the app never reads half
    scratch.write_text(json.dumps(raw))
    scratch.replace(status)


@contextlib.contextmanager
def heartbeating(runs_dir: Path) -> Iterator[None]:
    """The live run's heartbeat refreshed as often as a training run's, while the browser
    visits pages: under a load of ~18 one visit took longer than the 15 s after which a
    silent run is reported dead, and the live page dropped its Cancel button."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_INTERVAL_S):
            keep_alive(runs_dir)

    keep_alive(runs_dir)
    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join()


@pytest.fixture(scope="module")
def hostile_runs(trained_runs, tmp_path_factory) -> Path:
    runs_dir = tmp_path_factory.mktemp("hostile") / "runs"
    make_hostile_runs(trained_runs, runs_dir)
    return runs_dir


# --- AppTest: the element tree ------------------------------------------------------------

# Proto fields Streamlit renders as markdown, and the elements whose text is never markdown.
MARKDOWN_FIELDS = {"body", "label", "help", "options", "placeholder", "caption", "text"}
PLAIN_ELEMENTS = {"code", "text", "json", "plotly_chart", "arrow_data_frame", "exception"}
# a selectbox's and a multiselect's options are plain text in the browser (checked in
# Chromium: "![i](...)" shows as written); radio and pills options are markdown
PLAIN_OPTIONS = {"selectbox", "multiselect"}


def _proto_strings(proto: Any, kind: str) -> Iterator[str]:
    for descriptor, value in proto.ListFields():
        if descriptor.name not in MARKDOWN_FIELDS:
            continue
        if descriptor.name == "options" and kind in PLAIN_OPTIONS:
            continue
        if isinstance(value, str):
            yield value
        elif isinstance(value, Iterable):  # repeated: a selectbox's options
            yield from (v for v in value if isinstance(v, str))


def rendered_markdown(node: Any) -> Iterator[tuple[str, str]]:
    """(element type, markdown source) for every text Streamlit renders as markdown."""
    kind = getattr(node, "type", "")
    if kind == "table":
        for row in node.value.astype(str).itertuples(index=False):
            yield from (("table", cell) for cell in row)
    elif kind not in PLAIN_ELEMENTS and getattr(node, "proto", None) is not None:
        proto = node.proto
        yield from ((kind, text) for text in _proto_strings(proto, kind))
        if "type" in proto.DESCRIPTOR.oneofs_by_name:  # a block: expander, tab, popover...
            sub = getattr(proto, proto.WhichOneof("type") or "", None)
            if sub is not None and hasattr(sub, "ListFields"):
                yield from ((kind, text) for text in _proto_strings(sub, kind))
    for child in getattr(node, "children", {}).values():
        yield from rendered_markdown(child)


def markup_on(at) -> list[str]:
    assert not at.exception, at.exception
    return [
        f"{kind}: {found} in {text!r}"
        for kind, text in rendered_markdown(at._tree)
        for found in active_markup(text)
    ]


def all_text(at) -> str:
    return "\n".join(text for _, text in rendered_markdown(at._tree))


CASES = [
    ("app.py", {}),
    ("pages/1_Launch.py", {"run": QUERY}),
    ("pages/2_Runs.py", {}),
    ("pages/3_Run_detail.py", {"run": RUN_ID}),
    ("pages/3_Run_detail.py", {"run": CHILD_ID}),
    ("pages/3_Run_detail.py", {"run": QUERY}),
    ("pages/5_Compare.py", {"a": RUN_ID, "b": CHILD_ID}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("page", "query"), CASES)
def test_run_records_and_the_url_make_no_markup(hostile_runs, monkeypatch, page, query):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(hostile_runs))
    keep_alive(hostile_runs)
    at = open_page(page, query)
    assert markup_on(at) == []
    text = all_text(at)
    # the values are there, as text (escaped), not dropped
    if page == "pages/3_Run_detail.py" and query["run"] == RUN_ID:
        for fragment in ("scenario.png", "parent.png", "device.png", "reason.png", "child"):
            assert fragment in text, fragment
    if query.get("run") == QUERY and page.endswith("Run_detail.py"):
        assert "query.png" in text and "was not found" in text


@pytest.mark.slow
def test_an_upload_file_name_makes_no_markup(monkeypatch, tmp_path, shared_traces_dir):
    monkeypatch.setenv("PIPELINE_DOCTOR_RUNS_DIR", str(tmp_path / "runs"))
    trace = shared_traces_dir / "hta_a100_alexnet_with_syncs.json.gz"
    at = open_page("pages/4_Upload_trace.py")
    at.file_uploader[0].set_value((UPLOAD_NAME, trace.read_bytes(), "application/gzip"))
    at.run()
    assert markup_on(at) == []
    assert "[l](https" in shown(all_text(at))  # the name is shown, as written
    at.file_uploader[0].set_value((UPLOAD_NAME, gzip.compress(b"{not json"), "application/gzip"))
    at.run()
    assert markup_on(at) == []
    assert len(at.error) == 1 and "[l](https" in shown(at.error[0].value)


# --- a real browser ------------------------------------------------------------------------

TOKEN = "browser-test-token-0123456789"


@pytest.fixture(scope="module")
def hostile_server(hostile_runs, tmp_path_factory) -> Iterator[str]:
    """scripts/serve.py on every interface with a token, over the hostile runs."""
    import os
    import urllib.request

    port = _free_port()
    log = (tmp_path_factory.mktemp("serve") / "serve.log").open("w")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_DOCTOR_")},
        "PIPELINE_DOCTOR_RUNS_DIR": str(hostile_runs),
        "PIPELINE_DOCTOR_TOKEN": TOKEN,
    }
    process = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "scripts/serve.py"), "--address", "0.0.0.0"]
        + ["--port", str(port), "--server.fileWatcherType", "none"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None and time.monotonic() < deadline, "serve.py did not start"
        try:
            urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).close()
            break
        except OSError:
            time.sleep(0.3)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _sign_in(page, url: str) -> None:
    page.goto(url)
    page.get_by_label("Access token").fill(TOKEN)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", level=1).filter(has_not_text="Pipeline Doctor").or_(
        page.get_by_role("heading", name="Pipeline Doctor", level=1)
    ).first.wait_for()
    page.wait_for_function("() => !document.querySelector('input[type=password]')")
    wait_idle(page)


@pytest.mark.browser
@pytest.mark.slow
def test_in_chromium_nothing_links_to_or_loads_from_the_attackers_host(
    hostile_server, hostile_runs, page, shared_traces_dir
):
    requests: list[str] = []
    page.context.route("**/*", lambda route: _only_local(route, requests))

    # before signing in, nothing of any run is on the page
    page.goto(f"{hostile_server}/Run_detail?run={quote(RUN_ID)}")
    page.get_by_label("Access token").wait_for()
    assert "scenario.png" not in page.content()
    page.get_by_label("Access token").fill("not-the-token")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("That token is not right.").wait_for()

    visits = [
        ("", "Recent runs"),
        ("Runs", "select a row to open it"),
        (f"Run_detail?run={quote(RUN_ID)}", "scenario.png"),
        (f"Run_detail?run={quote(CHILD_ID)}", "Re-run of"),
        (f"Run_detail?run={quote(QUERY)}", "was not found"),
        (f"Compare?a={quote(RUN_ID)}&b={quote(CHILD_ID)}", "Gone in B"),
        (f"Launch?run={quote(QUERY)}", "Cancel run"),
    ]
    with heartbeating(hostile_runs):
        for path, marker in visits:
            _sign_in(page, f"{hostile_server}/{path}")
            page.get_by_text(marker).first.wait_for()
            wait_idle(page)
            page.wait_for_timeout(1500)  # give any image the page asks for time to be requested
            if "Run_detail?run=run-" in path:  # read as written, in the page's own text
                words = page.locator('[data-testid="stMain"]').inner_text().replace("\u2060", "")
                for value in (RUN_ID, SCENARIO, PARENT_ID, DEVICE, CHILD_ID):
                    assert value in words, (value, words)  # only an invisible joiner added
            _assert_inert(page, path)

    _sign_in(page, f"{hostile_server}/Upload_trace")
    trace = shared_traces_dir / "hta_a100_alexnet_with_syncs.json.gz"
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        files=[{"name": UPLOAD_NAME, "mimeType": "application/gzip", "buffer": trace.read_bytes()}]
    )
    page.get_by_role("heading", name="Findings").wait_for(timeout=120_000)
    page.wait_for_timeout(1500)
    _assert_inert(page, "Upload_trace")
    assert "[l](https:" in page.locator('[data-testid="stMain"]').inner_text()

    external = sorted({urlparse(u).hostname or u for u in requests})
    assert not [host for host in external if EVIL in host], external
    # the tab icon is a local file and Streamlit ships its fonts (issue 11): no host at all
    assert external == [], f"requests to other hosts: {external}"


def _only_local(route, requests: list[str]) -> None:
    host = urlparse(route.request.url).hostname
    if host in {"127.0.0.1", "localhost"} or route.request.url.startswith(("data:", "blob:")):
        route.continue_()
    else:
        requests.append(route.request.url)
        route.abort()


# Every element that links to or loads a URL, with that URL's host (our own links carry
# run ids as query values, so the host is what tells an injected link from ours).
_URL_HOSTS = """() => [...document.querySelectorAll('[href], [src], [srcset], [data], [action]')]
  .flatMap(el => ['href', 'src', 'srcset', 'data', 'action']
    .filter(name => el.getAttribute(name))
    .map(name => { let host; try { host = new URL(el.getAttribute(name), location.href).hostname }
                   catch (e) { host = '?' } return [el.tagName, name, host, el.outerHTML.slice(0, 300)] }))"""


def _assert_inert(page, where: str) -> None:
    hosts = page.evaluate(_URL_HOSTS)
    assert hosts, "the page has links and images of its own"
    assert [h for h in hosts if EVIL in h[2]] == [], where  # tag, attribute, host, html
    assert page.locator(f'a[href^="http://{EVIL}"], img[src*="{EVIL}"]').count() == 0, where
    # the hostile values are on the page (as text: no element links or loads them); the
    # runs grid draws them on a canvas, so that page is left out of this check
    assert where == "Runs" or EVIL in page.content(), where


__all__ = ["TIMEOUT_S"]
