"""A manifest's recorded fields are checked by type and range when it is read
(``ndp.store.manifest_fields``): a damaged or hand-edited field is a ``ManifestError`` naming the
manifest and the field (a newer format an ``UnsupportedVersionError``), never an
``AttributeError`` or a ``RecursionError`` in whatever reads it first; and datasets made with
different tokenizers are not read together."""

from __future__ import annotations

import json

import pytest

from ndp.cli.main import main as cli
from ndp.errors import ManifestError, UnsupportedVersionError
from ndp.loader.loader import Loader
from ndp.store.writer import ShardWriter
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp

TOKENIZER = {"name": "tok-a", "vocab_size": 8000, "eos_token_id": 0, "pad_token_id": None,
             "has_chat_template": False, "fingerprint": "aaaa"}


def dataset(directory, tokenizer=TOKENIZER, n=8):
    with ShardWriter(directory) as writer:
        for k in range(n):
            writer.write(encode_tokens(ramp(k, 6)))
        writer.commit({"format_version": 1, "tokenizer": tokenizer})
    return directory


def edit(directory, change):
    path = directory / "ndp.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def read(directory):
    return Loader(directory, batch_size=2, seq_len=8, backend="cpu", output="arrays")


@pytest.mark.parametrize("field, value, match", [
    ("tokenizer", "gpt2", r"tokenizer must be a record of the tokenizer.*'gpt2' \(str\)"),
    ("tokenizer", ["gpt2"], r"tokenizer must be a record"),
    ("tokenizer.vocab_size", "8000", r"tokenizer.vocab_size must be an integer or None, got "
                                     r"'8000' \(str\)"),
    ("tokenizer.vocab_size", 0, r"tokenizer.vocab_size must be in \[1, "),
    ("tokenizer.eos_token_id", 1.5, r"tokenizer.eos_token_id must be an integer"),
    ("tokenizer.pad_token_id", 2**63, r"tokenizer.pad_token_id must be in \[0, 2,147,483,647\]"),
    ("tokenizer.has_chat_template", "yes", r"has_chat_template must be True or False"),
    ("token_width", 3, r"token_width must be one of 2, 4, got 3"),
    ("format_version", "1", r"format_version must be an integer, got '1' \(str\)"),
    ("format_version", True, r"format_version must be an integer, got True \(bool\)"),
    ("shards.packets", -1, r"shards\[0\] \('shard-00000.ndp'\).packets must be >= 0"),
    ("shards.crc32", 2**40, r"shards\[0\] .*crc32 must be in \[0, 4,294,967,295\]"),
])
def test_a_field_of_the_wrong_type_or_range_is_a_manifest_error_naming_it(tmp_path, field,
                                                                           value, match):
    d = dataset(tmp_path)

    def change(m):
        if field.startswith("shards."):
            m["shards"][0][field.split(".")[1]] = value
        elif field.startswith("tokenizer."):
            m["tokenizer"][field.split(".")[1]] = value
        else:
            m[field] = value

    edit(d, change)
    with pytest.raises(ManifestError, match=match) as err:
        read(d)
    assert str(d / "ndp.json") in str(err.value)


def test_a_newer_format_version_is_refused_as_unsupported(tmp_path):
    d = dataset(tmp_path)
    edit(d, lambda m: m.update(format_version=99))
    with pytest.raises(UnsupportedVersionError, match="format_version 99, this ndp reads up "
                                                      "to 1.*Upgrade ndp"):
        read(d)


def test_a_manifest_nested_past_pythons_limit_is_a_manifest_error(tmp_path, capsys):
    d = dataset(tmp_path)
    manifest = json.loads((d / "ndp.json").read_text())
    deep = "[" * 100_000 + "]" * 100_000
    text = json.dumps(manifest)[:-1] + f', "extra": {deep}}}'
    (d / "ndp.json").write_text(text)
    with pytest.raises(ManifestError, match="not valid JSON \\(nested too deep\\)"):
        read(d)
    assert cli(["verify", str(d)]) in (1, 2)
    said = capsys.readouterr()
    assert "nested too deep" in said.out + said.err and "Traceback" not in said.out + said.err


@pytest.mark.parametrize("how", ["list", "mix"])
@pytest.mark.parametrize("key, other", [("vocab_size", 4096), ("fingerprint", "bbbb"),
                                        ("eos_token_id", 2)])
def test_datasets_made_with_different_tokenizers_are_not_mixed(tmp_path, how, key, other):
    a = dataset(tmp_path / "a")
    b = dataset(tmp_path / "b", {**TOKENIZER, key: other})
    data = [a, b] if how == "list" else {"a": a, "b": b}
    kw = {"mix": {"a": 1.0, "b": 1.0}} if how == "mix" else {}
    with pytest.raises(ManifestError, match=rf"{a} and {b} were made with different tokenizers "
                                            rf"\(tokenizer.{key} .*manifest='ignore'"):
        Loader(data, batch_size=2, seq_len=8, backend="cpu", output="arrays", **kw)
    Loader(data, batch_size=2, seq_len=8, backend="cpu", output="arrays", manifest="ignore",
           **kw).close()  # on purpose: read as they are


def test_datasets_of_one_tokenizer_mix_and_unrecorded_fields_are_not_compared(tmp_path):
    a = dataset(tmp_path / "a")
    b = dataset(tmp_path / "b", {**TOKENIZER, "name": "/elsewhere/tok-a"})  # another path
    c = dataset(tmp_path / "c", {"name": None, "vocab_size": None, "eos_token_id": None})
    loader = Loader({"a": a, "b": b, "c": c}, batch_size=2, seq_len=8, backend="cpu",
                    output="arrays", mix={"a": 1.0, "b": 1.0, "c": 1.0})
    assert sum(1 for _ in loader) > 0
    loader.close()


# --- a shard is the one its manifest lists (check_identity) -----------------------------------
def _foreign(tmp_path):
    """A dataset whose first shard (and its index) was replaced by another dataset's shard of
    the same size: valid packets, other tokens."""
    d = dataset(tmp_path / "d")
    other = tmp_path / "other"
    with ShardWriter(other) as writer:
        for k in range(8):
            writer.write(encode_tokens(ramp(k + 500, 6)))
        writer.commit({})
    (shard,) = sorted(other.glob("*.ndp"))
    assert shard.stat().st_size == (d / shard.name).stat().st_size
    for name in (shard.name, shard.name + ".idx"):
        (d / name).write_bytes((other / name).read_bytes())
    return d, d / shard.name


@pytest.mark.parametrize("verify", ["size", "full"])
def test_a_same_size_foreign_shard_with_its_own_index_is_refused(tmp_path, verify):
    """The held-out trial's: 7 foreign rows delivered under a warning that damaged packets are
    dropped, and none was."""
    from ndp.adapters.dataset import NDPDataset

    d, shard = _foreign(tmp_path)
    with pytest.raises(ManifestError, match=rf"{shard}: crc32 .* a scan of it finds only "
                                            r"sound packets, so it is not the shard"):
        Loader(d, batch_size=2, seq_len=8, backend="cpu", output="arrays", verify=verify)
    with pytest.raises(ManifestError, match="not the shard the dataset was written with"):
        NDPDataset(d, seq_len=8)
    (d / (shard.name + ".idx")).unlink()  # no index: a scan finds only sound packets
    with pytest.raises(ManifestError, match="a scan of it finds only sound packets"):
        Loader(d, batch_size=2, seq_len=8, backend="cpu", output="arrays", verify=verify)
    Loader(d, batch_size=2, seq_len=8, backend="cpu", output="arrays",
           manifest="ignore").close()  # on purpose


def test_a_damaged_shard_rescanned_is_read_for_its_sound_packets_and_says_so(tmp_path):
    d = dataset(tmp_path)
    (shard,) = sorted(d.glob("*.ndp"))
    data = bytearray(shard.read_bytes())
    data[-3] ^= 1  # the last packet's payload: one corrupt region
    shard.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"damaged after it was written; a scan of it found 1 "
                                         r"corrupt regions .* skipped and counted"):
        loader = Loader(d, batch_size=2, seq_len=8, backend="cpu", output="arrays",
                        verify="full")
    assert loader.stats.corrupt_regions == 1 and len(list(loader)) > 0
    loader.close()
