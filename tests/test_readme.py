"""The README runs: its "Quick start" section, as written, in an empty directory (it makes its
own data and tokenizer, converts them with ``ndp convert`` and builds batches in every mode), and
its test command is the one CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ndp_test_helpers import markdown_blocks, run_markdown

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_the_readme_quick_start_runs_as_written(tmp_path, monkeypatch):
    blocks = markdown_blocks(README.read_text(encoding="utf-8"), "## Quick start")
    assert [lang for lang, _ in blocks] == ["python", "bash", "python"]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__readme__"}
    run_markdown(blocks, namespace, "README.md quick start")
    assert (tmp_path / "out" / "ndp.json").is_file() and (tmp_path / "sft" / "ndp.json").is_file()
    assert "cu_seqlens" in namespace["batch"]  # the last loop was packing mode's
    assert len(namespace["dataset"]) > 0


def _bash_block_after(text: str, heading: str) -> list[str]:
    rest = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)```", rest, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_ci_builds_a_new_venv_and_runs_the_readme_test_command():
    """CI cannot pass on packages the machine happened to have: ``.ci/run`` makes a new venv
    (``python3 -m venv``) every run, then runs the README's install-and-test line in it, as
    written."""
    text = README.read_text(encoding="utf-8")
    venv_line, test_line = _bash_block_after(text, "**Install and run the tests**")
    assert venv_line.startswith("python3 -m venv ") and "bin/activate" in venv_line
    install, _, pytest_cmd = test_line.partition(" && ")
    assert install.startswith("pip install -c tests/constraints-cpu.txt ") and pytest_cmd
    ci = (README.parent / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    venv_at = next(i for i, ln in enumerate(lines) if ln.startswith("python3 -m venv "))
    activate_at = next(i for i, ln in enumerate(lines) if "bin/activate" in ln)
    install_at = lines.index(install)
    test_at = next(i for i, ln in enumerate(lines) if ln.startswith(pytest_cmd))
    assert venv_at < activate_at < install_at < test_at
    assert "mktemp -d" in ci  # a new folder every run, never a venv left from before


def test_the_readme_stays_a_front_door():
    """At most 300 lines, and no commit hashes or issue numbers: those belong in results files
    and commits; the reference material lives in docs/."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 300
    assert not re.search(r"\bissue \d+|#\d{2,}\b", text, re.I)
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"commit hashes in the README: {hashes}"
    for target in re.findall(r"\]\((docs/[^)#]+)", text):  # every docs link leads to a page
        assert (README.parent / target).is_file(), target
