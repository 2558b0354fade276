"""The fields a manifest (``ndp.json``, ``ndp.store.manifest``) records, checked by type and
range when it is read (``check_fields``), with the checks every option gets (``ndp.checks``):
a field of the wrong type is a ``ManifestError`` that names the manifest and the field, never an
``AttributeError`` in whatever reads it first; a ``format_version`` newer than this ndp reads is
an ``UnsupportedVersionError``. Fields the manifest does not have are left to their readers'
defaults (older manifests lack some); fields ndp does not know are kept as they are.

And what several manifests read together must agree on (``check_tokenizers``): token ids
mean a tokenizer's vocabulary, so datasets made with different tokenizers cannot be mixed.
"""

from __future__ import annotations

import os
from typing import Any

from ndp.checks import INT32_END, choice, flag, integer, text
from ndp.errors import ManifestError, UnsupportedVersionError
from ndp.wire.format import SHARD_VERSION

#: the tokenizer record's fields (``ndp.convert.tokenizer.TokenizerInfo``): (check, options)
_TOKENIZER = {
    "name": (text, {"none": True}),
    "vocab_size": (integer, {"least": 1, "most": INT32_END, "none": True}),
    "eos_token_id": (integer, {"least": 0, "most": INT32_END - 1, "none": True}),
    "pad_token_id": (integer, {"least": 0, "most": INT32_END - 1, "none": True}),
    "fingerprint": (text, {"none": True}),
}


def check_fields(manifest: dict[str, Any], where: str | os.PathLike) -> None:
    """``ManifestError`` (``UnsupportedVersionError`` for a newer format) unless every field
    ``manifest`` records that ndp reads has a type and value it can use."""
    hint = "the manifest is damaged or was edited by hand: re-run the conversion"

    def field(name: str) -> str:
        return f"{where}: {name}"

    version = manifest.get("format_version")
    if version is not None:
        integer(field("format_version"), version, least=1, error=ManifestError)
        if version > SHARD_VERSION:
            raise UnsupportedVersionError(
                f"{where}: format_version {version}, this ndp reads up to {SHARD_VERSION}: "
                f"the dataset was written by a newer ndp. Upgrade ndp to read it")
    tok = manifest.get("tokenizer")
    if tok is not None:
        if not isinstance(tok, dict):
            raise ManifestError(f"{field('tokenizer')} must be a record of the tokenizer "
                                f"(name, vocab_size, eos_token_id, ...), got {tok!r:.60} "
                                f"({type(tok).__name__}); {hint}")
        for name, (check, options) in _TOKENIZER.items():
            if name in tok:
                check(field(f"tokenizer.{name}"), tok[name], error=ManifestError, **options)
        if tok.get("has_chat_template") is not None:
            flag(field("tokenizer.has_chat_template"), tok["has_chat_template"],
                 error=ManifestError)
    if manifest.get("token_width") is not None:
        choice(field("token_width"), manifest["token_width"], (2, 4), error=ManifestError)
    for i, shard in enumerate(manifest.get("shards", [])):
        name = f"shards[{i}] ({shard.get('name')!r})"
        integer(field(f"{name}.bytes"), shard["bytes"], least=0, error=ManifestError)
        integer(field(f"{name}.crc32"), shard["crc32"], least=0, most=(1 << 32) - 1,
                error=ManifestError)
        if "packets" in shard:
            integer(field(f"{name}.packets"), shard["packets"], least=0, error=ManifestError)


def tokenizer_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer a manifest records (checked by ``check_fields``), ``{}`` if none."""
    tok = manifest.get("tokenizer")
    return tok if isinstance(tok, dict) else {}


#: what tells two tokenizers apart, as far as manifests record it
_IDENTITY = ("fingerprint", "vocab_size", "eos_token_id")


def check_tokenizers(manifests: list[dict[str, Any]], names: list[str]) -> None:
    """``ManifestError`` if the datasets whose ``manifests`` (read from ``names``) are read
    together were made with different tokenizers: a fingerprint of the vocabulary, a
    vocabulary size or an EOS id that two of them record and that differ. A field one of them
    does not record (token files imported without a tokenizer, an older manifest) is not
    compared."""
    seen: dict[str, tuple[Any, str]] = {}
    for manifest, name in zip(manifests, names):
        tok = tokenizer_of(manifest)
        for key in _IDENTITY:
            value = tok.get(key)
            if value is None:
                continue
            if key in seen and seen[key][0] != value:
                first, where = seen[key]
                raise ManifestError(
                    f"{where} and {name} were made with different tokenizers "
                    f"(tokenizer.{key} {first!r} and {value!r}; "
                    f"{_described(tokenizer_of(manifests[names.index(where)]))} and "
                    f"{_described(tok)}): a token id means another token in each, so their "
                    f"batches cannot be mixed. Convert both with one tokenizer, or read them "
                    f"as they are on purpose with `manifest='ignore'`")
            seen.setdefault(key, (value, name))


def _described(tok: dict[str, Any]) -> str:
    name = tok.get("name")
    return f"{name!r}, {tok.get('vocab_size')} ids" if name else f"{tok.get('vocab_size')} ids"


def check_identity(path: Any, entry: dict[str, Any], crc32: int, packets: int,
                   scan: Any, *, stacklevel: int = 3) -> None:
    """The shard at ``path``, whose index records ``crc32`` and ``packets`` where its manifest
    ``entry`` records others, changed after the dataset was written (its size was compared
    already, and its bytes are not the manifest's: ``ndp.store.corpus.as_listed``). ``scan``,
    a framing scan of it, says how: where it found damage (corrupt regions, skipped and
    counted as the Loader's ``corrupt_regions``), the shard is read for its sound packets,
    with a warning that says so; where it found none, the shard is one of valid packets that
    are not the dataset's (another shard of the same size, with an index made for it): a
    ``ManifestError``, since reading it would deliver another dataset's rows as this one's
    (``manifest="ignore"``, which reads no manifest, reads it as it is)."""
    import warnings

    found = (f"{path}: crc32 {crc32:#010x} and {packets:,} packets where the dataset's "
             f"manifest recorded {entry['crc32']:#010x} and {entry.get('packets', packets):,}")
    if scan.corrupt:
        warnings.warn(
            f"{found}: the shard was damaged after it was written; a scan of it found "
            f"{len(scan.corrupt):,} corrupt regions ({scan.corrupt_bytes:,} bytes), skipped "
            f"and counted (stats.corrupt_regions), and its sound packets are read ('ndp "
            f"verify' shows where)", stacklevel=stacklevel)
        return
    raise ManifestError(
        f"{found}: a scan of it finds only sound packets, so it is not the shard the dataset "
        f"was written with (changed or replaced since, with its index rebuilt), and its rows "
        f"would be another dataset's. Restore the shard and its index, or re-run the "
        f"conversion (or pass `manifest='ignore'` to read it as it is, on purpose)")
