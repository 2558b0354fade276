"""More cases of ``bad_inputs.py``, which imports this module (run them with it): its groups
"files" to "command line", and the classes issue 28 adds (marked 28 below). Remote datasets are
tried on moto's S3 server, started in this process on 127.0.0.1, where moto and s3fs import.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from inputs.cases import (LENGTHS, NotHandled, batches, case, child, command, damage, dataset,
                        exact_or_refused, flip_index_field, loader, ramp_packets, refused, same)
from ndp.errors import NDPError
from ndp.loader.loader import Loader
from ndp.store.writer import ShardWriter
from ndp.wire.format import Typ
from ndp.wire.packet import encode_packet, encode_tokens

# ------------------------------------------------------------------- files changed under a reader
_CUT = """
    import os, sys
    from ndp.loader.loader import Loader
    from ndp.errors import ShardChangedError
    ld = Loader(sys.argv[1], batch_size=2, seq_len=16, shuffle=False, backend="cpu",
                output="arrays", prefetch=0, chunk_batches=1, mode=sys.argv[2])
    it = iter(ld)
    next(it)
    for name in os.listdir(sys.argv[1]):
        if name.endswith(".ndp"):
            os.truncate(os.path.join(sys.argv[1], name), 40)
    try:
        for _ in it:
            pass
    except ShardChangedError as exc:
        print("ShardChangedError:", str(exc)[:120])
        sys.exit(0)
    sys.exit(5)
"""
for _mode in ("padded", "packed"):
    def _cut(tmp, mode=_mode) -> str:
        return child(_CUT, str(dataset(tmp / "d")), mode)
    case("files", f"every shard cut in place under a running {_mode} loader")(_cut)


@case("files", "300 shards under ulimit -n 256")
def _many(tmp):
    d = tmp / "d"
    d.mkdir()
    for i in range(300):
        with ShardWriter(d, prefix=f"s{i:03d}") as w:
            w.write(encode_tokens(np.arange(5) + 1000 * i))
    return child("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        from ndp.loader.loader import Loader
        ld = Loader(sys.argv[1], batch_size=4, seq_len=8, backend="cpu", output="arrays")
        n = sum(1 for _ in ld)
        print(f"{n} batches, {ld.stats.valid} packets")
    """, str(d))


@case("files", "100 loaders opened, read and closed: descriptors held afterwards")
def _closed(tmp):
    d = dataset(tmp / "d")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(100):
        batches(loader(d))
    held = len(os.listdir("/proc/self/fd")) - before
    if held > 2:
        raise NotHandled(f"{held} descriptors held")
    return f"{held} descriptors held"


# ---------------------------------------------------------------------------------- values
@case("values", "an int32 token with its top bit set")
def _top_bit(tmp):
    packets = ramp_packets()
    packets[4] = encode_packet(np.array([4000, 2**32 - 1], ">u4").tobytes(), typ=Typ.TOKEN_IDS)
    ld = loader(dataset(tmp / "d", packets))
    got = batches(ld)
    if any((b["input_ids"] >= 2**31).any() for b in got):
        raise NotHandled("delivered")
    return f"dropped, counted: {ld.stats.corrupt}"


@case("values", "a zero-token packet")
def _empty(tmp):
    packets = ramp_packets()
    packets[4] = encode_tokens(np.zeros(0, np.int64))
    ld = loader(dataset(tmp / "d", packets))
    got = batches(ld)
    if any((b["attention_mask"].sum(axis=1) == 0).any() for b in got):
        raise NotHandled("an all-padding row")
    return f"dropped, counted: {ld.stats.corrupt}"


@case("values", "ids past the manifest's vocabulary size")
def _vocab(tmp):
    ld = loader(dataset(tmp / "d", extra={"tokenizer": {"vocab_size": 20000}}))
    got = batches(ld)
    if any((b["input_ids"] >= 20000).any() for b in got):
        raise NotHandled("delivered")
    return f"dropped, counted: {ld.stats.corrupt}"


# ------------------------------------------------------------------------------------- misuse
@case("misuse", "two threads iterating one Loader")
def _two_threads(tmp):
    """The second thread starts its loop while the first is inside its own (an event holds the
    first mid-epoch: two loops that merely follow each other are no misuse)."""
    ld = loader(dataset(tmp / "d"))
    errors: list[BaseException] = []
    inside, done = threading.Event(), threading.Event()

    def first() -> None:
        try:
            for _ in ld:
                inside.set()
                done.wait(30)
        except BaseException as exc:  # noqa: BLE001 - collected
            errors.append(exc)

    def second() -> None:
        inside.wait(30)
        try:
            for _ in ld:
                pass
        except BaseException as exc:  # noqa: BLE001 - collected
            errors.append(exc)
        finally:
            done.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ld.close()
    if any(not isinstance(e, NDPError) for e in errors) or not errors:
        raise NotHandled(f"{errors!r}")
    return f"{type(errors[0]).__name__}: {str(errors[0])[:100]}"


@case("misuse", "next() after close()")
def _after_close(tmp):
    ld = loader(dataset(tmp / "d"))
    it = iter(ld)
    next(it)
    ld.close()
    return refused(lambda: next(it))


@case("misuse", "batch_size=2.5")
def _float_batch(tmp):
    return refused(lambda: Loader(dataset(tmp / "d"), batch_size=2.5, seq_len=8))


# --------------------------------------------------------------------------------- the CLI
@case("command line", "ndp inspect nosuchdir")
def _inspect_missing(tmp):
    return command(["inspect", str(tmp / "nosuchdir")], codes=(2,))


@case("command line", "ndp index nosuchdir")
def _index_missing(tmp):
    return command(["index", str(tmp / "nosuchdir")], codes=(2,))


@case("command line", "ndp export -o <existing dir> --overwrite")
def _export_dir(tmp):
    d = dataset(tmp / "d")
    (tmp / "out").mkdir()
    return command(["export", str(d), "-o", str(tmp / "out"), "--overwrite", "--no-progress"],
                   codes=(2,))


@case("command line", "ndp verify with an unreadable index")
def _unreadable(tmp):
    d = dataset(tmp / "d")
    damage(sorted(d.glob("*.idx"))[0], b"\x00" * 10)
    return command(["verify", str(d)], codes=(1,))


# ----------------------------------------------------------------------- elastic resume (28)
def _resumed(d: Path, world: int, states: list[dict] | None = None) -> list:
    """Without ``states``: every rank's state after two batches of packing on ``world`` ranks;
    with them: every rank's batches resumed from them."""
    out = []
    for r in range(world):
        ld = loader(d, "packing", rank=r, world_size=world)
        if states is None:
            it = iter(ld)
            next(it), next(it)
            out.append(json.loads(json.dumps(ld.state_dict())))
            ld.close()
        else:
            ld.load_state_dict(states)
            out.append(batches(ld))
    return out


for _old, _new, _order in ((3, 2, (2, 0, 1)), (2, 3, (1, 0))):
    def _shuffled(tmp, old=_old, new=_new, order=_order) -> str:
        d = dataset(tmp / "d")
        states = _resumed(d, old)
        if len({(s["pos"], s["tok"]) for s in states}) < 2:
            raise RuntimeError("the old ranks stopped at one position: the order shows nothing")
        want, got = _resumed(d, new, states), _resumed(d, new, [states[k] for k in order])
        if not all(same(a, b) for a, b in zip(got, want)):
            raise NotHandled(f"states listed as {order}: other batches than in rank order")
        return f"exact batches (those of the list in rank order, {len(want[0])} per rank)"
    case("resume states", f"elastic {_old} -> {_new} ranks, packing, the old states listed "
         f"[{', '.join(f's{k}' for k in _order)}]")(_shuffled)

for _what, _pick in (("rank 1 twice", (1, 0, 1)), ("rank 1 missing", (2, 0))):
    def _bad_list(tmp, pick=_pick) -> str:
        states = _resumed(dataset(tmp / "d"), 3)
        return refused(lambda: loader(tmp / "d", "packing", world_size=2).load_state_dict(
            [states[k] for k in pick]))
    case("resume states", f"elastic 3 -> 2 ranks, packing, {_what} in the states list")(_bad_list)


# -------------------------------------------------------------- a FIFO named like a shard (28)
_FIFO = """
    import sys
    sys.path.insert(0, sys.argv[3])
    from inputs.cases import Loader, command, refused
    d, tool = sys.argv[1:3]
    if tool != "Loader":
        print(command([tool, d]))
    else:  # refused as a shard that ndp.json does not list, and, read anyway, as a FIFO
        print("; ".join(refused(lambda: Loader(d, batch_size=2, seq_len=16, manifest=m))[:80]
                        for m in ("check", "ignore")))
"""
for _tool in ("Loader", "ndp verify", "ndp inspect", "ndp index"):
    def _fifo(tmp, tool=_tool.split()[-1]) -> str:
        os.mkfifo(dataset(tmp / "d") / "x.ndp")  # opened for reading, it waits for a writer
        return child(_FIFO, str(tmp / "d"), tool, str(Path(__file__).resolve().parents[1]),
                     timeout=60)
    case("files", f"a FIFO named x.ndp in the dataset: {_tool}")(_fifo)


# --------------------------------------------------------------------------------- indexes (28)
def warned(fn: Callable[[], object], text: str) -> tuple[object, list[str]]:
    """What ``fn()`` returns, and the warnings it gave that hold ``text``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if text in str(w.message)]


for _verify in ("size", "full"):
    def _zero_lengths(tmp, verify=_verify) -> str:
        ref = batches(loader(dataset(tmp / "ref"), "packed"))
        flip_index_field(dataset(tmp / "d"), "length", slice(None), value=0)  # every entry
        detail, said = warned(lambda: exact_or_refused(
            lambda: batches(loader(tmp / "d", "packed", verify=verify)), ref), "scanning")
        if detail == "exact batches" and not said:
            raise NotHandled("exact batches, but the index was rebuilt without a warning")
        return f"{'warned (scanning the shard), then ' if said else ''}{detail}"
    case("indexes", f"an index whose LEN fields are all zero, packed, verify={_verify}")(
        _zero_lengths)


@case("indexes", "an index that cannot be read (chmod 000; as root, a directory in its place)")
def _unreadable_index(tmp):
    ref = batches(loader(dataset(tmp / "ref"), "packed"))
    idx = sorted(dataset(tmp / "d").glob("*.idx"))[0]
    idx.chmod(0)
    if os.access(idx, os.R_OK):  # as root, chmod does not stop a read: a directory instead
        idx.unlink()
        idx.mkdir()
    try:
        got, said = warned(lambda: batches(loader(tmp / "d", "packed")), "scanning the shard")
    except NDPError as exc:  # the index is there to be rebuilt: a refusal is not what is asked
        raise NotHandled(f"refused, not scanned: {type(exc).__name__}: {exc}") from None
    if not same(got, ref) or not said:
        raise NotHandled("other batches" if said else "no warning that the shard was scanned")
    return f"scanned, exact batches: {said[0].rsplit('/', 1)[-1][:100]}"


# ------------------------------------------------------------------ a padded batch of no row (28)
@case("shards", "padded, batch_size=1, a corrupt packet: its batch delivered with no row")
def _no_row(tmp):
    from ndp.store.index import read_index

    ref = batches(loader(dataset(tmp / "ref"), batch_size=1))
    shard, k = sorted(dataset(tmp / "d").glob("*.ndp"))[0], 5  # shard 0 holds packets 0 to 15
    entry = read_index(f"{shard}.idx").entries[k]
    raw = bytearray(shard.read_bytes())
    raw[int(entry["offset"]) + int(entry["length"]) // 2] ^= 0x04
    damage(shard, bytes(raw))
    ld = loader(tmp / "d", batch_size=1)
    got, said = warned(lambda: batches(ld), "has no rows")
    steps, _ = warned(lambda: {len(batches(loader(tmp / "d", batch_size=1, rank=r,
                                                  world_size=2))) for r in (0, 1)}, "")
    # "intact" here: the intact dataset's batches at the same positions, packet k's row out
    want = [{key: v[~((b["input_ids"][:, 0] == k * 1000) & (b["attention_mask"][:, 0] == 1))]
             for key, v in b.items()} for b in ref]
    if not same(got, want) or ld.stats.empty_batches != 1 or not said or len(steps) != 1:
        raise NotHandled(f"empty_batches {ld.stats.empty_batches}, warned {bool(said)}, "
                         f"exact {same(got, want)}, batches per rank of 2: {sorted(steps)}")
    return f"exact batches, 1 of {len(got)} with no row: counted, warned; {ld.stats.corrupt}"


# -------------------------------------------------------- named errors, not raw exceptions (28)
def _not_utf8(tmp: Path) -> Path:
    d = dataset(tmp / "d")
    raw = (d / "ndp.json").read_bytes()
    at = raw.index(b'"shards"') + 1
    damage(d / "ndp.json", raw[:at] + b"\xff" + raw[at + 1:])
    return d


case("partial datasets", "ndp.json with a byte that is not UTF-8")(
    lambda tmp: refused(lambda: loader(_not_utf8(tmp))))
case("partial datasets", "ndp verify on an ndp.json with a byte that is not UTF-8")(
    lambda tmp: command(["verify", str(_not_utf8(tmp))]))
for _mode, _batch, _seq, _shown in (("padded", 64, 10**9, "10**9"), ("packed", 1, 2**62, "2**62")):
    case("misuse", f"seq_len={_shown}, {_mode}: refused when the Loader is made")(
        lambda tmp, m=_mode, b=_batch, s=_seq: refused(lambda: Loader(
            dataset(tmp / "d"), mode=m, batch_size=b, seq_len=s, backend="cpu", output="arrays")))


# -------------------------------------------------------------------------- a full disk (28)
_FULL_DISK = """
    import resource, signal, sys
    import ndp.convert.export_llmc
    from ndp.cli.main import main
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))  # the header and a few tokens fit
    sys.exit(main(["export", sys.argv[1], "-o", sys.argv[2], "--no-progress"]))
"""


@case("command line", "ndp export onto a full disk (a 1500-byte file-size limit)")
def _full_disk(tmp):
    d, out = dataset(tmp / "d"), tmp / "out"
    out.mkdir()
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_FULL_DISK), str(d),
                        str(out / "train.bin")], capture_output=True, text=True, timeout=120)
    left = sorted(p.name for p in out.iterdir())  # no *.tmp, and no part of train.bin
    if r.returncode not in (1, 2) or "Traceback" in r.stderr or left:
        raise NotHandled(f"exit {r.returncode}, left {left}: {r.stderr[-200:]}")
    return f"exit {r.returncode}, nothing left: {r.stderr.strip().splitlines()[-1][:120]}"


# ------------------------------------------------------------------- remote datasets (28)
try:  # the remote cases: only where moto's S3 server and s3fs can be imported
    import s3fs
    from moto.server import ThreadedMotoServer
except ImportError:
    s3fs = None
_S3: dict = {}  # storage_options for the server, once started


def s3(tmp: Path, d: Path) -> tuple[str, dict, object]:
    """``d`` uploaded (ndp.json last) to a bucket of the case's own on moto's S3 server (on
    127.0.0.1, in this process, started once): its URL, storage_options and filesystem."""
    if not _S3:
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        atexit.register(server.stop)
        host, port = server.get_host_and_port()
        _S3.update(key="testing", secret="testing", skip_instance_cache=True,
                   client_kwargs={"endpoint_url": f"http://{host}:{port}",
                                  "region_name": "us-east-1"},
                   config_kwargs={"retries": {"max_attempts": 1}})
    fs, bucket = s3fs.S3FileSystem(**_S3), f"ndp-bad-inputs-{tmp.name}"
    fs.call_s3("create_bucket", Bucket=bucket)
    for f in sorted(d.iterdir(), key=lambda p: p.name == "ndp.json"):
        fs.pipe(f"{bucket}/data/{f.name}", f.read_bytes())
    return f"s3://{bucket}/data", _S3, fs


def _cache_replaced(tmp):
    local = dataset(tmp / "d")
    url, opts, _ = s3(tmp, local)
    ref, kw = batches(loader(local, "packed")), dict(storage_options=opts, cache_dir=tmp / "c")
    if not same(batches(loader(url, "packed", **kw)), ref):
        raise NotHandled("the first read from the URL: other batches than from disk")
    name = sorted(local.glob("*.ndp"))[1].name
    (cached,) = (tmp / "c").rglob(name)
    other = (dataset(tmp / "o", ramp_packets(base=500)) / name).read_bytes()
    if len(other) != cached.stat().st_size or other == cached.read_bytes():
        raise RuntimeError("no other shard of the same size to put in the cache")
    damage(cached, other)
    got, said = warned(lambda: batches(loader(url, "packed", **kw)), "downloaded again")
    restored = cached.read_bytes() == (local / name).read_bytes()
    if not same(got, ref) or not said or not restored:
        raise NotHandled(f"exact {same(got, ref)}, warned {bool(said)}, cache restored {restored}")
    return f"warned, downloaded again, exact batches: ...{said[0][-90:]}"


def _cache_is_a_file(tmp):
    url, opts, _ = s3(tmp, dataset(tmp / "d"))
    damage(tmp / "cache", b"not a directory")
    return refused(lambda: loader(url, storage_options=opts, cache_dir=tmp / "cache"))


def _overwrite_fails(tmp):
    url, opts, fs = s3(tmp, dataset(tmp / "d"))
    old = fs.cat_file(f"{url[5:]}/ndp.json")
    before = batches(loader(url, "packed", storage_options=opts, cache_dir=tmp / "c1"))
    tokens = tmp / "new.bin"  # another dataset's tokens, to convert over the old one
    command(["export", str(dataset(tmp / "new", ramp_packets(LENGTHS[::-1]))), "-o", str(tokens),
             "--no-progress"], codes=(0,))
    real = s3fs.S3FileSystem._put_file

    async def refuse(self, lpath, rpath, *args, **kwargs):  # the commit's PUT fails: a 403
        if str(rpath).endswith("/ndp.json"):
            raise PermissionError(13, "Access Denied (made up by bad_inputs_more.py)")
        return await real(self, lpath, rpath, *args, **kwargs)

    s3fs.S3FileSystem._put_file = refuse
    try:
        said = command(["convert", str(tokens), url, "--storage-options", json.dumps(opts),
                        "--overwrite", "--no-progress"])
    finally:
        s3fs.S3FileSystem._put_file = real
    if s3fs.S3FileSystem(**opts).cat_file(f"{url[5:]}/ndp.json") != old:
        raise NotHandled(f"{said}; but ndp.json at the URL changed")
    if not same(batches(loader(url, "packed", storage_options=opts, cache_dir=tmp / "c2")),
                before):
        raise NotHandled(f"{said}; but the old dataset reads other batches now")
    return f"{said}; the old dataset whole and the same"


def _cache_too_small_for_the_node(tmp):
    url, opts, _ = s3(tmp, dataset(tmp / "d", shards=6))  # a limit of all of them could not stall
    largest = max(f.stat().st_size for f in (tmp / "d").glob("*.ndp"))
    saved = os.environ.get("LOCAL_WORLD_SIZE")
    os.environ["LOCAL_WORLD_SIZE"] = "4"  # four ranks of this node share the cache
    try:
        return refused(lambda: loader(url, storage_options=opts, cache_dir=tmp / "c",
                                      cache_limit=2 * largest))
    finally:
        if saved is None:
            os.environ.pop("LOCAL_WORLD_SIZE", None)
        else:
            os.environ["LOCAL_WORLD_SIZE"] = saved


if s3fs is not None:
    case("remote", "a cache_limit of two shards shared by the 4 ranks of a node")(
        _cache_too_small_for_the_node)
    case("remote", "a cached shard replaced by a same-size shard of other packets")(
        _cache_replaced)
    case("remote", "a remote dataset's cache_dir that is a regular file")(_cache_is_a_file)
    case("remote", "an overwrite conversion to the URL whose ndp.json PUT fails")(
        _overwrite_fails)
