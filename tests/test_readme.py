"""The README runs: its `ndp convert` line makes `out/` from the embedded corpus (the standard
library's source, a tokenizer trained on it the way `ndp demo` trains its own), then every
Python block of its "Python" section runs as written, in order, in one namespace."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from ndp.cli.main import main
from ndp.cli.demo import stdlib_files, train_tokenizer

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks(text: str) -> list[str]:
    section = text[text.index("\n## Python"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def convert_line(text: str) -> list[str]:
    line = next(ln for ln in text.splitlines() if ln.startswith("ndp convert data.jsonl out/"))
    line = re.sub(r"\[[^\]]*\]", "", line)  # optional arguments
    return shlex.split(line)[1:]


@pytest.mark.slow
def test_the_readme_python_blocks_run_as_written(tmp_path, monkeypatch):
    text = README.read_text(encoding="utf-8")
    blocks = python_blocks(text)
    assert len(blocks) >= 3
    files = stdlib_files(40)
    texts = [p.read_text(encoding="utf-8") for p in files]
    train_tokenizer(texts, tmp_path / "my-tokenizer", vocab_size=1024)
    with open(tmp_path / "data.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    monkeypatch.chdir(tmp_path)
    assert main([*convert_line(text), "--no-progress"]) == 0
    namespace: dict = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as exc:  # say which block
            raise AssertionError(f"README python block {i + 1} failed: {exc!r}\n{block}") from exc
    assert float(namespace["loss"]) > 0  # the GPU block trained on shifted labels
    namespace["loader"].close()


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
