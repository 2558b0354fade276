"""The README runs: its `ndp convert` line makes `out/` from the embedded corpus (the standard
library's source, a tokenizer trained on it the way `ndp demo` trains its own), then every
Python block of its "Python" section runs as written, in order, in one namespace."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from ndp.cli import main
from ndp.demo import stdlib_files, train_tokenizer

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
