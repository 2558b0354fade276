"""``ndp convert INPUTS OUTPUT --append``: new shards added to a committed dataset, atomically.

The dataset grows by a new generation of its manifest: the new shards are named after its last
(``shard-<n>.ndp`` from the next number, so they sort after every shard it had), and the new
manifest lists the old shards unchanged, then the new ones, with ``generation`` counted up and
what each append wrote recorded in ``appended``. The new dataset is built as any conversion
builds one (``ndp.store.manifest.staged_output``): beside ``OUTPUT``, its old shards hard-linked
in (no byte copied; copied where the filesystem has no hard links), and swapped in whole once
its manifest is written. A reader opening ``OUTPUT`` meanwhile reads the old generation, whole;
a run killed at any moment leaves it as it was.

Token ids must mean what they meant: the conversion's tokenizer must be the dataset's (its
vocabulary's fingerprint, size and EOS id, as ``ndp.store.manifest_fields.check_tokenizers``
compares them), and the new shards use the dataset's token width. A resume state saved before
the append resumes exactly, its epoch over the old shards, and the new ones join at the next
epoch (``ndp.store.growth``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ndp.errors import ConfigError
from ndp.store.manifest import MANIFEST, read_manifest, staged_output
from ndp.store.manifest_fields import check_tokenizers
from ndp.store.remote import is_url
from ndp.wire.format import INDEX_SUFFIX, SHARD_SUFFIX

log = logging.getLogger(__name__)

#: the shard names ``ShardWriter`` gives (``shard-00012.ndp``)
_NAMED = re.compile(r"shard-(\d+)" + re.escape(SHARD_SUFFIX) + "$")


def dataset_to_grow(output: Any, *, overwrite: bool) -> dict:
    """The manifest of the committed dataset at ``output`` that ``--append`` grows;
    ``ConfigError`` where there is none to grow, saying what to do."""
    if overwrite:
        raise ConfigError("--append adds shards to OUTPUT's dataset and --overwrite replaces "
                          "it: choose one")
    if is_url(output):
        raise ConfigError(f"--append grows a dataset on a local disk, not at a URL ({output}): "
                          f"append to a local copy, then upload it")
    manifest = read_manifest(output) if Path(output).is_dir() else None
    if manifest is None:
        raise ConfigError(f"{output}: no committed dataset to append to (no {MANIFEST}); "
                          f"convert into it without --append first")
    return manifest


def same_width(opts: Any, manifest: dict, output: Any) -> Any:
    """``opts`` with the dataset's token width (``ConfigError`` if they name another)."""
    width = manifest.get("token_width")
    if width is None or opts.token_width == width:
        return opts
    if opts.token_width:
        raise ConfigError(f"--append: {output} holds {width}-byte tokens, and this conversion "
                          f"asks for {opts.token_width}-byte ones; drop --token-width")
    return replace(opts, token_width=width)


def check_same_tokenizer(manifest: dict, info: Any, output: Any) -> None:
    """``ConfigError`` unless this conversion's tokenizer (``info``) is the one ``manifest``
    records: its token ids would mean other tokens in the same dataset."""
    try:
        check_tokenizers([manifest, {"tokenizer": asdict(info)}],
                         [str(output), "this conversion's tokenizer"])
    except ConfigError as err:
        raise ConfigError(f"--append: {err}") from None


def next_shard(manifest: dict, output: Any) -> int:
    """The number of the first new shard: after the dataset's last, so that the new shards'
    names sort after all of its (the order packets are numbered in)."""
    names = [entry["name"] for entry in manifest.get("shards", [])]
    numbers = [int(m.group(1)) for m in map(_NAMED.match, names) if m]
    first = max(numbers, default=-1) + 1
    name = f"shard-{first:05d}{SHARD_SUFFIX}"
    if names and name <= max(names):
        raise ConfigError(
            f"{output}: --append would name its first shard {name}, which sorts before the "
            f"dataset's shard {max(names)}: the packets' numbering, and every resume state, "
            f"would change. Convert the new data into a directory of its own and read both "
            f"(a list, or a dict of sources)")
    return first


@contextlib.contextmanager
def grown_output(output: Any, manifest: dict) -> Iterator[tuple[Path, None, Any]]:
    """As ``ndp.store.upload.dataset_output``: a directory holding the dataset at ``output``
    (hard links of its shards, indexes and manifest) for the ``ShardWriter`` to add to, swapped
    in whole as ``output`` when the block ends."""
    output = Path(output)
    with staged_output(output, overwrite=True) as stage:  # the writers' lock held from here
        if read_manifest(output) != manifest:  # another writer committed since it was read
            raise ConfigError(f"{output}: another conversion changed this dataset while this "
                              f"one started (its {MANIFEST} is not the one read at the "
                              f"start); nothing of this one was kept: run the append again")
        names = [entry["name"] for entry in manifest["shards"]]
        for name in [MANIFEST, *names, *(n + INDEX_SUFFIX for n in names)]:
            if (output / name).exists():
                _link(output / name, stage / name)
        yield stage, None, lambda manifest: None


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # no hard links here (some network and FUSE filesystems): a copy
        shutil.copy2(source, target)


def grown_manifest(old: dict, extra: dict, shards: list[str]) -> dict:
    """The manifest fields of the next generation: the dataset's own (what wrote it first),
    ``generation`` counted up, and this append (its ``extra``: tokenizer, options, summary;
    the ``shards`` it wrote) added to ``appended``."""
    generation = int(old.get("generation", 0)) + 1
    kept = {k: v for k, v in old.items() if k not in ("format_version", "shards")}
    this = {"generation": generation, "shards": shards,
            **{k: v for k, v in extra.items() if k in ("summary", "max_tokens", "overflow",
                                                       "src", "dst", "fields")}}
    return {**kept, "generation": generation, "appended": [*old.get("appended", []), this]}
