"""Issue 39's classes, as cases of ``bad_inputs.py`` (which imports this module: run them with
it): the count cache against damaged indexes, a foreign shard, options and manifest fields of
the wrong type, an epoch of no batch, tokenizers mixed, split documents in packed mode, a
Loader across threads and forks, and the tools' and writers' cases (a shard cut under a tool,
remote answers that are not the shard, ranks of a cache, destinations refused, documents
kept whole by an export).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import warnings

import numpy as np

from inputs.cases import (NotHandled, batches, case, child, command, damage, dataset,
                        exact_or_refused, loader, ramp_packets, refused, same)
from ndp.errors import NDPError
from ndp.loader.loader import Loader
from ndp.store.writer import ShardWriter
from ndp.wire.format import INDEX_ENTRY_DTYPE, INDEX_HEADER_BYTES
from ndp.wire.packet import encode_tokens


def _rewrite_entries(d, change) -> None:
    """The first index's entries changed in place by ``change`` (header, size kept)."""
    idx = sorted(d.glob("*.idx"))[0]
    raw = idx.read_bytes()
    e = np.frombuffer(raw[INDEX_HEADER_BYTES:], INDEX_ENTRY_DTYPE).copy()
    change(e)
    damage(idx, raw[:INDEX_HEADER_BYTES] + e.tobytes())


def _with_counts(tmp, name: str):
    os.environ["NDP_COUNT_CACHE"] = str(tmp / name)


# ------------------------------------------------------------------ the count cache (1, 2)
def _repeat(e):
    e[1:6] = e[0]


def _swap(e):
    e[[2, 3]] = e[[3, 2]]


def _zero(e):
    e["length"] = 0


for _mode in ("padded", "packed", "packing"):
    for _name, _change in (("entries 1-5 equal to entry 0", _repeat),
                           ("entries 2 and 3 swapped", _swap), ("every LEN zeroed", _zero)):
        for _cache in ("cold", "warm with the intact count", "stale (stamp given back)"):
            def _cached(tmp, mode=_mode, change=_change, cache=_cache) -> str:
                saved = os.environ.get("NDP_COUNT_CACHE")
                try:
                    _with_counts(tmp, "counts-ref")
                    ref = batches(loader(dataset(tmp / "ref"), mode))
                    _with_counts(tmp, "counts")
                    d = dataset(tmp / "d")
                    if cache != "cold":
                        batches(loader(d, mode))  # the intact count, cached
                    idx = sorted(d.glob("*.idx"))[0]
                    st = os.stat(idx)
                    _rewrite_entries(d, change)
                    if cache.startswith("stale"):
                        os.utime(idx, ns=(st.st_atime_ns, st.st_mtime_ns))
                    with warnings.catch_warnings(record=True) as said:
                        warnings.simplefilter("always")
                        out = exact_or_refused(lambda: batches(loader(d, mode)), ref)
                    if out == "exact batches" and not any(
                            "scanning the shard instead" in str(w.message) for w in said):
                        raise NotHandled("exact batches, but no warning said the index was "
                                         "rescanned")
                    return out
                finally:
                    if saved is None:
                        os.environ.pop("NDP_COUNT_CACHE", None)
                    else:
                        os.environ["NDP_COUNT_CACHE"] = saved
            case("count cache", f"{_name}, {_mode}, cache {_cache}")(_cached)


# ------------------------------------------------------------------------ a foreign shard (6)
@case("manifest", "a same-size foreign shard with its own valid index")
def _foreign(tmp):
    d = dataset(tmp / "d")
    f = dataset(tmp / "f", ramp_packets(base=500))
    for name in ("s0-00000.ndp", "s0-00000.ndp.idx"):
        shutil.copy(f / name, d / name)
    return refused(lambda: batches(loader(d)))


# ----------------------------------------------------- options and fields of a wrong type (7, 10)
for _kw in ({"crc_drop_rate": "0.1"}, {"crc_drop_rate": None}, {"mix": {"all": math.nan}},
            {"mix": {"all": math.inf}}, {"mix": {"all": "1"}}, {"mix": {"all": None}},
            {"rank": 1.0, "world_size": 2}, {"verify": "bogus"}, {"pad_token_id": 2**63}):
    case("options", f"Loader({', '.join(f'{k}={v!r}' for k, v in _kw.items())})")(
        lambda tmp, kw=_kw: refused(lambda: loader(dataset(tmp / "d"), **kw)))


def _manifest_edit(tmp, change):
    d = dataset(tmp / "d")
    path = d / "ndp.json"
    m = json.loads(path.read_text())
    text = change(m)
    damage(path, (text if isinstance(text, str) else json.dumps(m)).encode())
    return d


for _label, _change in (
        ('"tokenizer": "gpt2"', lambda m: m.update(tokenizer="gpt2")),
        ("format_version 99", lambda m: m.update(format_version=99)),
        ("tokenizer pad_token_id 2**63", lambda m: m.update(
            tokenizer={"vocab_size": 100000, "pad_token_id": 2**63})),
        ("nested 100,000 deep", lambda m: json.dumps(m)[:-1] + ', "x": ' + "[" * 100_000
         + "]" * 100_000 + "}")):
    case("manifest", f"a manifest with {_label}")(
        lambda tmp, change=_change: refused(lambda: loader(_manifest_edit(tmp, change))))
    case("manifest", f"ndp verify of a manifest with {_label}")(
        lambda tmp, change=_change: command(["verify", str(_manifest_edit(tmp, change))]))


# ------------------------------------------------------------------- an epoch of no batch (12)
@case("epochs", "batch_size x seq_len larger than the data, packed")
def _too_big(tmp):
    ld = loader(dataset(tmp / "d"), "packed", batch_size=64)
    return refused(lambda: [b for _ in range(3) for b in ld])


@case("epochs", "a world_size larger than the packet count")
def _too_many_ranks(tmp):
    return refused(lambda: loader(dataset(tmp / "d"), world_size=40, rank=0))


# ------------------------------------------------------------------- tokenizers mixed (13)
@case("manifest", "datasets of two tokenizers mixed (vocab 8,000 and 4,096)")
def _tokenizers(tmp):
    a = dataset(tmp / "a", extra={"tokenizer": {"vocab_size": 8000, "eos_token_id": 0}})
    b = dataset(tmp / "b", extra={"tokenizer": {"vocab_size": 4096, "eos_token_id": 0}})
    refused(lambda: loader({"a": a, "b": b}, mix={"a": 1.0, "b": 1.0}))
    return refused(lambda: loader([a, b]))


# --------------------------------------------------------- split documents in packed mode (11)
@case("documents", "split documents shuffled in packed mode, 2 ranks")
def _split(tmp):
    rng = np.random.default_rng(3)
    with ShardWriter(tmp / "d", max_shard_bytes=66_000) as writer:
        for d in range(40):
            doc = np.concatenate([1000 * (d + 1) + np.arange(1, int(rng.integers(5, 60))), [0]])
            for j, lo in enumerate(range(0, len(doc), 8)):
                writer.write(encode_tokens(doc[lo:lo + 8], continues=j > 0))
    bad = 0
    for r in range(2):
        x = [b["x"].ravel() for b in loader(tmp / "d", "packed", world_size=2, rank=r)]
        s = np.concatenate(x)
        a, b = s[:-1], s[1:]
        both = (a != 0) & (b != 0)
        bad += int((both & ((a // 1000 != b // 1000) | (b != a + 1))).sum())
    if bad:
        raise NotHandled(f"{bad} places where a piece follows another document's")
    return "every document whole and in order on its rank"


# ------------------------------------------------------------ threads and processes (8)
@case("threads", "close() from another thread while a loop waits")
def _close_elsewhere(tmp):
    ld = Loader(dataset(tmp / "d"), batch_size=2, seq_len=16, backend="cpu", output="arrays",
                chunk_batches=1, prefetch=1)
    it = iter(ld)
    next(it)
    threading.Thread(target=ld.close).start()
    try:
        for _ in it:
            pass
    except NDPError as exc:
        return f"{type(exc).__name__}: {str(exc)[:100]}"
    return "the loop ended"


@case("threads", "a Loader used in a process forked while it ran")
def _forked(tmp):
    d = dataset(tmp / "d")
    return child(f"""
        import os, sys
        from ndp.loader.loader import Loader
        from ndp.errors import LoaderUsageError
        ld = Loader({str(d)!r}, batch_size=2, seq_len=16, backend="cpu", output="arrays")
        it = iter(ld)
        next(it)
        pid = os.fork()
        if pid == 0:
            try:
                list(ld)
                os._exit(3)
            except LoaderUsageError:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("refused in the child by name" if os.waitstatus_to_exitcode(status) == 0
              else "child exit " + str(os.waitstatus_to_exitcode(status)))
        sys.exit(0 if os.waitstatus_to_exitcode(status) == 0 else 1)
    """)


@case("threads", "a Loader made before a fork, first run in the child")
def _fork_fresh(tmp):
    d = dataset(tmp / "d")
    want = batches(loader(d))
    got = child(f"""
        import os, sys, pickle
        import numpy as np
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        from inputs.cases import loader, batches
        ld = loader({str(d)!r})
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, pickle.dumps(batches(ld)))
            os._exit(0)
        os.close(w)
        data = b""
        while True:
            piece = os.read(r, 1 << 20)
            if not piece:
                break
            data += piece
        os.waitpid(pid, 0)
        open({str(tmp / 'out.pkl')!r}, "wb").write(data)
        print("done")
    """)
    import pickle

    if not same(pickle.loads((tmp / "out.pkl").read_bytes()), want):
        raise NotHandled("the child's batches differ from the parent's")
    return f"the child's batches are the parent's ({got})"


# ------------------------------------------- the tools' and writers' cases (3, 4, 5, 9, 14)
from inputs import bad_inputs_round3b  # noqa: E402,F401
