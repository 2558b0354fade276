"""The converter: input files -> tokenized examples -> packets -> shards with indexes.

Records are read in order, tokenized in batches (the fast tokenizer encodes a batch on every core),
cut to ``max_tokens`` (``overflow``: by default a plain-text document is split over consecutive
packets and an SFT example truncated, see ``ndp.wire.format``) and written as packets by an atomic
``ShardWriter``. A bad record is skipped and counted under its reason (default) or stops the run
(``strict``, which also refuses fields no schema has instead of ignoring them). A run that would
write no example, or skip more than ``max_skipped`` of its records, raises ``ConvertError`` and
commits nothing; one whose truncation cuts more than ``TRUNCATION_WARN`` of the tokens says so
loudly, with the options that keep them. The dataset is built beside ``output`` and swapped in whole
once its manifest ``ndp.json`` (the commit record, ``ndp.store.manifest``) is written: a run killed
at any moment leaves ``output`` as it was (nothing, or the old dataset when overwriting), never part
of a dataset; one stopped by SIGTERM or Ctrl-C also removes what it staged and says so in one line,
and a second conversion into the same output while this one runs is refused at once (a lock file
beside it). An output URL (``s3://bucket/prefix/``) gets each shard uploaded as it is finished and
the manifest last (``ndp.store.upload``). With ``append``, the shards are added to the dataset
at ``output`` as the next generation of its manifest (``ndp.convert.append``).
"""

from __future__ import annotations

import os
import time

from ndp.convert.options import (
    ConvertOptions,
    ConvertSummary,
    check_skipped,
    manifest_extra,
    warn_truncation,
)
from ndp.convert.append import (
    check_same_tokenizer,
    dataset_to_grow,
    grown_manifest,
    grown_output,
    next_shard,
    same_width,
)
from ndp.convert.packets import PacketMaker
from ndp.convert.sources import expand_inputs, input_size
from ndp.progress import progress_bar
from ndp.store.writer import ShardWriter
from ndp.store.upload import dataset_output

__all__ = ["ConvertOptions", "ConvertSummary", "convert"]


def convert(
    inputs: list[str | os.PathLike],
    output: str | os.PathLike,
    *,
    tokenizer: str,
    options: ConvertOptions = ConvertOptions(),
) -> ConvertSummary:
    """Convert ``inputs`` (JSONL, Parquet, text files or directories, local or at a URL read
    with ``options.storage_options``) into shards in ``output``.

    ``tokenizer`` is a local Hugging Face tokenizer directory or a cached name. Raises
    ``RecordError`` on the first bad record when ``options.strict``; otherwise bad records are
    logged (``ndp.convert`` logger) and counted in ``summary.skipped``.
    """
    opts = options
    old = dataset_to_grow(output, overwrite=opts.overwrite) if opts.append else None
    if old is not None:
        opts = same_width(opts, old, output)
    files = expand_inputs(list(inputs), storage_options=opts.storage_options)
    maker = PacketMaker(tokenizer, opts, output=output)
    summary = maker.summary
    started = time.perf_counter()
    if old is not None:
        check_same_tokenizer(old, maker.info, output)
    opened = grown_output(output, old) if old is not None else dataset_output(
        output, overwrite=opts.overwrite, storage_options=opts.storage_options)
    with opened as (stage, on_finish, publish):
        writer = ShardWriter(stage, first=0 if old is None else next_shard(old, output),
                             max_shard_bytes=opts.max_shard_bytes, on_finish=on_finish)
        with writer, progress_bar(total=sum(input_size(f) for f in files), unit="B",
                                  unit_scale=True, desc="convert", enabled=opts.progress) as bar:
            records = maker.run(files, writer, bar=bar, early_check=True)
            check_skipped(summary, records, opts, early=False)
            warn_truncation(summary, opts)
            writer.finish()
            summary.shards = [f"{summary.output}/{s.path.name}" for s in writer.finished]
            summary.bytes = sum(s.size for s in writer.finished)
            summary.seconds = time.perf_counter() - started
            extra = manifest_extra(summary, maker.info, opts)
            if old is not None:  # the next generation of the dataset's manifest
                extra = grown_manifest(old, extra, [s.path.name for s in writer.finished])
            publish(writer.commit(extra))
    return summary
