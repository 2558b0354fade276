"""The convert tests' fixtures: the small real tokenizer (``tokenizer_dir``, ``hf_tokenizer``)
lives in ``tests/conftest.py``, which the CLI tests share."""
