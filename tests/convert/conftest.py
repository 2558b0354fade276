"""A small real tokenizer, trained once per session the way ``ndp demo`` trains its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ndp.demo import stdlib_files, train_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    texts = [p.read_text(encoding="utf-8") for p in stdlib_files(40)]
    return str(train_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=1024))


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir):
    from ndp.convert import load_tokenizer

    return load_tokenizer(tokenizer_dir)


def write_jsonl(path: Path, records: list) -> Path:
    """Write records (dicts, or raw strings written as-is) one per line."""
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path
