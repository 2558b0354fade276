"""A small real tokenizer, trained once per session the way ``ndp demo`` trains its own."""

from __future__ import annotations

import pytest

from ndp.cli.demo import stdlib_files, train_tokenizer


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    texts = [p.read_text(encoding="utf-8") for p in stdlib_files(40)]
    return str(train_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=1024))


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir):
    from ndp.convert import load_tokenizer

    return load_tokenizer(tokenizer_dir)

