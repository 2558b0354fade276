"""Conversion on Ray Data: ``ndp convert --engine ray`` (or ``convert_ray``), the local
converter's work spread over a Ray cluster's cores.

    ndp convert data/*.jsonl out/ --tokenizer tok/ --engine ray             # a local Ray
    RAY_ADDRESS=http://head:8265 ray job submit --working-dir . -- \\
        ndp convert /shared/in/ s3://bucket/tokens/ --tokenizer gpt2 --engine ray

The inputs (after ``expand_inputs``: files in sorted order, local or at a URL, which each task
then reads itself) are a Ray Dataset of one row per file; a ``map`` over it runs, in Ray tasks, the local converter's own records-to-packets code
(``ndp.convert.packets.PacketMaker``) on one file each, into shards named after the file's
place in the input order (``shard-<file>-<k>.ndp``). So the packets are the local converter's,
in the same order when shards are read by name; only where shards begin and end differs (each
file starts a shard). The driver gathers each file's counts as its task finishes (a progress
bar over the input bytes), checks the totals as the local converter does (``max_skipped``,
truncation), then writes one manifest: the commit.

A local Ray that ndp starts (no ``address``, no ``RAY_ADDRESS``, or ``"local"``) dies with the
command, even one killed with SIGKILL (``ndp.convert.reaper``), and is shut down before a failed
or stopped conversion removes its staging directory. A local output is locked
(``ndp.store.manifest.staged_output``) before Ray starts.

Output: a local directory (written by the tasks in place, so on a cluster it must be a shared
filesystem) or a URL (each task uploads its shards as it finishes them, ``ndp.store.upload``; the
driver uploads the manifest last). Parallelism is across input files: split one huge file
before converting it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ndp.convert.options import (
    ConvertOptions,
    ConvertSummary,
    check_skipped,
    log,
    manifest_extra,
    warn_truncation,
)
from ndp.convert.packets import PacketMaker
from ndp.convert.sources import expand_inputs, input_size
from ndp.errors import ConfigError
from ndp.wire.format import SHARD_VERSION
from ndp.store.manifest import shard_entry, staged_output, write_manifest
from ndp.progress import progress_bar
from ndp.store.remote import is_url
from ndp.store.writer import ShardWriter

_COUNTS = ("examples", "packets", "tokens", "truncated", "truncated_tokens", "split",
           "straddled", "input_bytes")


class _ConvertFile:
    """A Ray Data task's work: one input file to shards (the tokenizer loaded once per
    worker)."""

    def __init__(self, tokenizer: str, options: ConvertOptions, target: str,
                 inputs: list, tag: str | None = None) -> None:
        from ndp.convert.tokenizer import load_tokenizer

        self.tokenizer, self.opts, self.target = tokenizer, options, target
        #: replacing a dataset at a URL: the new shards' names carry it (``ndp.store.upload``)
        self.tag = tag
        self.inputs = inputs  # every input (a local path, "hf:NAME" or a RemoteInput)
        self.tok = load_tokenizer(tokenizer)

    def __call__(self, row: dict) -> dict:
        unit = int(row["unit"])
        maker = PacketMaker(self.tokenizer, self.opts, output=self.target, tok=self.tok)
        remote = is_url(self.target)
        with contextlib.ExitStack() as stack:
            if remote:
                from ndp.store.upload import RemoteOutput

                local = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ndp-")))
                uploader = RemoteOutput(self.target, storage_options=self.opts.storage_options,
                                        overwrite=True, keep_manifest=True)
                on_finish = uploader.put
            else:
                local, on_finish = Path(self.target), None
            tag = f"-{self.tag}" if self.tag else ""
            writer = ShardWriter(local, prefix=f"shard-{unit:05d}{tag}",
                                 max_shard_bytes=self.opts.max_shard_bytes, on_finish=on_finish)
            try:
                records = maker.run([self.inputs[unit]], writer, early_check=False)
                writer.finish()
            except BaseException:
                writer.abort()
                if remote:
                    uploader.abort()
                raise
            if remote:
                uploader.wait()
        s = maker.summary
        return {"unit": unit, "result": json.dumps({
            "records": records, "skipped": s.skipped, "ignored": s.ignored_fields,
            "skip_log": maker.skip_log,
            **{k: getattr(s, k) for k in _COUNTS},
            "shards": [shard_entry(i.path, i.size, i.packets, i.crc32) for i in writer.finished],
        })}


@contextlib.contextmanager
def _shut_down_on_error(ray) -> Iterator[None]:
    """ndp's own local Ray is shut down when the conversion fails, before the staging directory
    is removed: its tasks write there, and one still running would make it anew."""
    try:
        yield
    except BaseException:
        ray.shutdown()
        raise


def convert_ray(inputs: list[str | os.PathLike], output: str | os.PathLike, *, tokenizer: str,
                options: ConvertOptions = ConvertOptions(), address: str | None = None,
                num_cpus: int | None = None) -> ConvertSummary:
    """``ndp.convert.convert`` on Ray Data (see the module docstring). ``address``: the Ray
    cluster (default: ``RAY_ADDRESS``, else a local Ray with ``num_cpus``)."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray Data: "
                          "pip install 'neural-datagram[ray]'") from None
    opts = options
    files = expand_inputs(list(inputs), storage_options=opts.storage_options)
    maker = PacketMaker(tokenizer, opts, output=output)  # checks the options and tokenizer here
    summary = maker.summary
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if is_url(output):
            from ndp.store.upload import RemoteOutput

            uploader = RemoteOutput(str(output), storage_options=opts.storage_options,
                                    overwrite=opts.overwrite)
            stage = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ndp-")))
            target = str(output)
        else:  # locked before Ray starts: a second writer is refused before it waits for Ray
            uploader = None
            stage = stack.enter_context(staged_output(Path(output), overwrite=opts.overwrite))
            target = str(stage)
        own = not ray.is_initialized() and (address or os.environ.get("RAY_ADDRESS")
                                            or "local") == "local"
        if own:  # a local Ray, ndp's own: it must not outlive the command (ndp.convert.reaper)
            from ndp.convert.reaper import reap_with_this_process

            temp_dir = reap_with_this_process()  # None without /proc: Ray's default
            stack.enter_context(_shut_down_on_error(ray))
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False,
                     log_to_driver=False, configure_logging=False,
                     **({"_temp_dir": str(temp_dir)} if temp_dir else {}))
        elif num_cpus is not None:
            joined = ("the Ray already running in this process" if ray.is_initialized() else
                      f"the cluster at {address or os.environ.get('RAY_ADDRESS')}")
            raise ConfigError(f"`num_cpus={num_cpus}` sizes a local Ray that ndp starts; this "
                              f"conversion runs on {joined}: leave `num_cpus` out")
        elif not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # ndp's own bar counts the input bytes
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        units = [{"unit": i} for i in range(len(files))]
        dataset = ray.data.from_items(units, override_num_blocks=max(1, len(units))).map(
            _ConvertFile, fn_constructor_kwargs={"tokenizer": tokenizer, "options": opts,
                                                 "target": target, "inputs": files,
                                                 "tag": uploader.tag if uploader else None},
            compute=ray.data.ActorPoolStrategy(
                min_size=1, max_size=max(1, int(ray.available_resources().get("CPU", 1)))))
        done: dict[int, dict] = {}
        try:
            with progress_bar(total=sum(input_size(f) for f in files), unit="B",
                              unit_scale=True, desc="convert (ray)", enabled=opts.progress) as bar:
                for row in dataset.iter_rows():
                    done[int(row["unit"])] = result = json.loads(row["result"])
                    bar.update(result["input_bytes"])
        except BaseException:
            if uploader is not None:
                uploader.abort()
            raise
        records, entries, ignored, logged = 0, [], set(), 0
        for unit in sorted(done):
            r = done[unit]
            for line in r["skip_log"]:  # as the local converter logs them
                if logged < 20:
                    log.warning("skipped %s", line)
                elif logged == 20:
                    log.warning("more records skipped; the summary counts them all")
                logged += 1
            records += r["records"]
            for k in _COUNTS:
                setattr(summary, k, getattr(summary, k) + r[k])
            for kind, n in r["skipped"].items():
                summary.skipped[kind] = summary.skipped.get(kind, 0) + n
            ignored.update(r["ignored"])
            entries.extend(r["shards"])
        summary.ignored_fields = sorted(ignored)
        check_skipped(summary, records, opts, early=False)
        warn_truncation(summary, opts)
        summary.shards = [f"{summary.output}/{e['name']}" for e in entries]
        summary.bytes = sum(e["bytes"] for e in entries)
        summary.seconds = time.perf_counter() - started
        manifest = write_manifest(stage, {"format_version": SHARD_VERSION,
                                          **manifest_extra(summary, maker.info, opts),
                                          "engine": "ray", "shards": entries})
        if uploader is not None:
            uploader.uploaded.extend(e["name"] for e in entries)
            uploader.finish(manifest)
    return summary

