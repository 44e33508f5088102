"""The config reference is generated from the config fields, and docs/CONFIG.md is that output."""

from __future__ import annotations

import re
import subprocess
import sys

from trainer.config import SCENARIO_PRESETS, SIZE_PRESETS
from trainer.config_docs import NOTES, main, render_markdown
from trainer.launch import config_fields


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^## ", text[start + len(heading) :], flags=re.MULTILINE)
    return text[start : start + len(heading) + following.start()] if following else text[start:]


def test_docs_config_md_is_the_generators_output(repo_root):
    committed = (repo_root / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    assert committed == render_markdown(), (
        "docs/CONFIG.md is stale: run python -m trainer.config_docs -o docs/CONFIG.md"
    )


def test_every_config_key_is_documented_with_its_default_and_help(repo_root):
    section = _section((repo_root / "docs" / "CONFIG.md").read_text(encoding="utf-8"), "## Keys")
    for field in config_fields():
        assert field.help, f"{field.key} has no help text to document"
        row = next((line for line in section.splitlines() if f"| `{field.key}` |" in line), None)
        assert row is not None, f"{field.key} is missing from docs/CONFIG.md"
        default = "null" if field.default is None else str(field.default).lower()
        assert f"`{default}`" in row.lower(), (
            f"{field.key}: docs/CONFIG.md default is not {default}"
        )
        assert field.allowed in row, f"{field.key}: allowed values missing"


def test_a_changed_default_changes_the_reference():
    fields = config_fields()
    lr = next(f for f in fields if f.key == "train.lr")
    changed = [f if f.key != "train.lr" else type(f)(**{**vars(f), "default": 0.5}) for f in fields]
    assert "| `train.lr` | float | `0.5` |" in render_markdown(changed)
    assert f"| `train.lr` | float | `{lr.default}` |" in render_markdown()


def test_notes_and_presets_name_only_real_keys():
    keys = {f.key for f in config_fields()}
    assert set(NOTES) <= keys
    text = render_markdown()
    for key in NOTES:
        assert f"- `{key}`: " in text
    for preset in (*SIZE_PRESETS.values(), *SCENARIO_PRESETS.values()):
        assert set(preset) <= keys
    assert "| `slow-loader` | `data.num_workers=0`," in text
    assert "| `model.hidden_size` | 192 | 768 |" in text


def test_main_prints_writes_and_reports_an_unwritable_path(tmp_path, capsys):
    assert main([]) == 0
    assert capsys.readouterr().out == render_markdown()
    out = tmp_path / "CONFIG.md"
    assert main(["-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render_markdown()
    assert main(["-o", str(tmp_path / "missing" / "CONFIG.md")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_the_generator_runs_without_torch(repo_root):
    # the docs must build on a machine (or CI job) without torch or a GPU
    code = (
        "import sys, trainer.config_docs as d; d.render_markdown(); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"
