"""The tokenizer a conversion records (``ndp.convert.tokenizer``): its vocabulary's fingerprint
names it wherever it was loaded from, and tells it from another tokenizer, so that datasets
made with different ones are not read together (``ndp.store.manifest_fields``)."""

from __future__ import annotations

import json
import shutil

import pytest

from ndp.convert import MANIFEST, ConvertOptions, convert
from ndp.convert.tokenizer import load_tokenizer, vocabulary_fingerprint
from ndp.errors import ManifestError
from ndp.loader.loader import Loader


def test_the_fingerprint_names_the_vocabulary_not_the_path(tmp_path, tokenizer_dir,
                                                          hf_tokenizer):
    copy = shutil.copytree(tokenizer_dir, tmp_path / "copy")
    same = vocabulary_fingerprint(load_tokenizer(str(copy)))
    assert same == vocabulary_fingerprint(hf_tokenizer) and len(same) == 16
    grown = load_tokenizer(str(copy))
    grown.add_tokens(["<an-id-more>"])
    assert vocabulary_fingerprint(grown) != same


def test_datasets_converted_with_two_tokenizers_are_refused_together(tmp_path,
                                                                     tokenizer_dir):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x\n"}) + "\n"
                           for i in range(6)))
    other = load_tokenizer(tokenizer_dir)
    other.add_tokens(["<an-id-more>"])  # another vocabulary, as a fine-tune's tokenizer
    other.save_pretrained(tmp_path / "other-tok")
    opts = ConvertOptions(progress=False)
    convert([src], tmp_path / "a", tokenizer=tokenizer_dir, options=opts)
    convert([src], tmp_path / "b", tokenizer=str(tmp_path / "other-tok"), options=opts)
    recorded = [json.loads((tmp_path / d / MANIFEST).read_text())["tokenizer"]["fingerprint"]
                for d in ("a", "b")]
    assert recorded[0] != recorded[1] and None not in recorded
    with pytest.raises(ManifestError, match="different tokenizers"):
        Loader({"a": tmp_path / "a", "b": tmp_path / "b"}, mix={"a": 1.0, "b": 1.0},
               batch_size=2, seq_len=16, backend="cpu", output="arrays")
    convert([src], tmp_path / "c", tokenizer=tokenizer_dir, options=opts)
    Loader([tmp_path / "a", tmp_path / "c"], batch_size=2, seq_len=16, backend="cpu",
           output="arrays").close()  # one tokenizer: read together
