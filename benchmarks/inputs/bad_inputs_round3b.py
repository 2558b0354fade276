"""Issue 39's tools' and writers' cases, as cases of ``bad_inputs.py`` (``bad_inputs_round3.py``
imports this module: run them with it): a shard cut while ``ndp verify``, ``index`` or
``export`` reads it (finding 3), four ranks on a cache of two shards without
``LOCAL_WORLD_SIZE`` (4), an S3 endpoint that answers a shard's GET with a proxy's HTML page
(5), ``ndp export --overwrite`` onto a device or the dataset's own shard (9), two ``ndp
convert`` into one output at once and a SIGTERMed one (9), and the documents an export
``--shard-tokens`` keeps whole (14). The mechanics are those of the tests that cover them
(named at each group): hooks and hand-shakes in the child processes, no sleeps.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

from inputs.cases import (NotHandled, batches, case, command, damage, dataset, loader,
                        ramp_packets)
from inputs.bad_inputs_more import s3, s3fs
from ndp.cli.main import main as cli
from ndp.errors import RemoteError
from ndp.wire.packet import encode_tokens

# ------------------------------------- a shard cut while a tool reads it (3; test_cut_while_read)
#: the shard is cut to half right after the first whole block (8 MiB) is read through
#: ``Shard.read_into``, so the next block's read comes up short; a tool that still mapped the
#: shard would be cut just before its first scan or validation of the mapping (its first touch)
_CUT_HOOK = """
import os, sys
shard, argv = sys.argv[1], sys.argv[2:]
size = os.path.getsize(shard)
done = []

def cut():
    if not done:
        done.append(True)
        os.truncate(shard, size // 2)

import ndp.store.shard as shards
read_into = getattr(shards.Shard, "read_into", None)
if read_into is not None:
    def read_then_cut(self, offset, out, _read=read_into):
        _read(self, offset, out)
        if str(self.path) == shard and out.shape[0] >= 1 << 20:  # a block, not a header
            cut()
    shards.Shard.read_into = read_then_cut

import ndp.engine.reference as reference
import ndp.store.index as index
for module, name in ((index, "scan_frames"), (reference, "validate")):
    def cut_then_call(*args, _call=getattr(module, name), **kw):
        cut()
        return _call(*args, **kw)
    setattr(module, name, cut_then_call)

from ndp.cli.main import main
sys.exit(main(argv))
"""


def _big(tmp: Path) -> Path:
    """A copy of a one-shard dataset larger than two blocks' reads (built once per run, beside
    the cases' directories)."""
    from ndp.store.shard import BLOCK_BYTES

    source = tmp.parent / "round3b-big"
    if not source.exists():
        packets = [encode_tokens(k * 1000 + np.arange(1000), width=4)
                   for k in range(BLOCK_BYTES // 4000 + 300)]
        dataset(source.with_suffix(".part"), packets, shards=1).rename(source)
    return Path(shutil.copytree(source, tmp / "d"))


for _argv in (["verify", "{dir}"], ["verify", "--no-manifest", "{dir}"], ["index", "{shard}"],
              ["export", "{dir}", "-o", "{out}", "--no-progress"]):
    def _cut_under_tool(tmp, argv=_argv) -> str:
        from ndp.store.shard import BLOCK_BYTES

        d = _big(tmp)
        shard = next(d.glob("*.ndp"))
        args = [a.format(dir=d, shard=shard, out=tmp / "out.bin") for a in argv]
        r = subprocess.run([sys.executable, "-c", _CUT_HOOK, str(shard), *args],
                           capture_output=True, text=True, timeout=120)
        said = r.stdout + r.stderr
        if shard.stat().st_size >= BLOCK_BYTES:
            raise RuntimeError(f"the hook never cut the shard (exit {r.returncode})")
        named = [line for line in said.splitlines() if "while ndp read it" in line]
        left = [p.name for p in (*tmp.glob("out*"), *d.glob("*.tmp"))]
        if (r.returncode not in (1, 2) or "Traceback" in said or not named
                or str(shard) not in named[0] or left):
            raise NotHandled(f"exit {r.returncode}{' (SIGBUS)' if r.returncode == -7 else ''}"
                             f", left {left}: {said[-240:]}")
        msg = named[0].split(f"{shard}: ", 1)[-1]
        return f"exit {r.returncode}: {shard.name}: {msg[msg.find('(the shard'):][:110]}"
    case("files", f"a shard cut between two block reads of ndp {' '.join(_argv[:2])}".replace(
        " {dir}", "").replace(" {shard}", ""))(_cut_under_tool)


# ---------------------------- 4 ranks on a cache of two shards, no LOCAL_WORLD_SIZE (4; readers)
_LAUNCHER = ("LOCAL_WORLD_SIZE", "WORLD_SIZE", "RANK", "LOCAL_RANK")
_RANK = """
    import json, sys
    import numpy as np
    from ndp.errors import CacheFullError
    from ndp.loader.loader import Loader
    from ndp.store.remote import RemoteDataset

    url, options, cache, limit, rank, checked = sys.argv[1:7]
    if checked == "unchecked":  # as if every rank had opened before the others registered
        RemoteDataset._check_limit = lambda self: None
    try:
        loader = Loader(url, mode="packed", batch_size=2, seq_len=16, output="arrays",
                        shuffle=False, rank=int(rank), world_size=4,
                        storage_options=json.loads(options), cache_dir=cache,
                        cache_limit=int(limit))
    except CacheFullError as exc:  # refused when opened
        loader = exc
    print("ready", flush=True)
    sys.stdin.readline()  # every rank opened: read at once, as ranks in step do
    if isinstance(loader, CacheFullError):
        print(json.dumps({"error": str(loader)}))
        sys.exit(0)
    try:
        with loader:
            rows = [np.asarray(b["x"]).tolist() for b in loader]
        print(json.dumps({"rows": rows}))
    except CacheFullError as exc:
        print(json.dumps({"error": str(exc)}))
"""
_BOUND_S = 90.0  # every rank's end, all together: the cache's own wait is 600 s


def _line(proc: subprocess.Popen, timeout: float = 60) -> str:
    """The child's next line on stdout, or "" if none comes in ``timeout`` seconds."""
    return proc.stdout.readline().strip() if select.select([proc.stdout], [], [], timeout)[0] \
        else ""


def _four_ranks(tmp, checked: str) -> str:
    lengths = [int(x) for x in np.random.default_rng(3).integers(1, 40, 60)]
    local = dataset(tmp / "d", ramp_packets(lengths), shards=6)  # a rank's share spans two
    url, opts, _ = s3(tmp, local)
    limit = 2 * max(p.stat().st_size for p in local.glob("*.ndp"))
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_RANK), url,
                               json.dumps(opts), str(tmp / "c"), str(limit), str(rank), checked],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for rank in range(4)]
    try:
        for p in procs:
            if _line(p) != "ready":
                p.kill()
                raise NotHandled(f"a rank did not open in 60 s: {p.communicate()[1][-300:]}")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        deadline, outs = time.monotonic() + _BOUND_S, []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise NotHandled(f"hung: {sum(q.poll() is None for q in procs)} rank(s) still "
                                 f"waiting after {_BOUND_S:g} s") from None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    said = []
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            raise NotHandled(f"rank {rank} exit {p.returncode}: {err[-300:]}")
        got = json.loads(out.strip().splitlines()[-1])
        if "error" in got:
            if f"cache_limit={limit:,}" not in got["error"]:
                raise NotHandled(f"rank {rank}: a CacheFullError not naming the limit: "
                                 f"{got['error'][:200]}")
            said.append("CacheFullError")
            continue
        want = [b["x"].tolist() for b in batches(loader(
            local, "packed", shuffle=False, rank=rank, world_size=4, batch_size=2))]
        if got["rows"] != want:
            raise NotHandled(f"rank {rank}: other rows than a local read's")
        said.append(f"{len(want)} batches")
    return f"every rank ended: {', '.join(said)}"


# --------------------------- a proxy's HTML page in place of a shard (5; test_remote_answers)
_PAGE = b"<html><body><h1>502 Bad Gateway</h1>proxy.</body></html>\n"
_PROXY: dict = {}


def _proxy() -> dict:
    """moto's S3 on 127.0.0.1 behind a proxy that answers every GET of the key ending with
    ``_PROXY["garbled"]`` with ``200 OK`` and ``_PAGE``, counting them (started once; moto's
    backends are this process' own, so the buckets ``s3()`` makes are seen here too)."""
    if not _PROXY:
        from moto.moto_server.werkzeug_app import (DomainDispatcherApplication,
                                                   create_backend_app)
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)

        def wsgi(environ, start_response):
            garbled = _PROXY["garbled"]
            if (garbled and environ["REQUEST_METHOD"] == "GET"
                    and environ.get("PATH_INFO", "").endswith(garbled)):
                _PROXY["asked"] += 1
                start_response("200 OK", [("Content-Type", "text/html"),
                                          ("Content-Length", str(len(_PAGE)))])
                return [_PAGE]
            return app(environ, start_response)

        server = make_server("127.0.0.1", 0, wsgi, threaded=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        _PROXY.update(endpoint=f"http://127.0.0.1:{server.server_port}", garbled=None, asked=0)
    return _PROXY


def _html_page(tmp):
    import ndp.store.remote as remote

    lengths = [int(x) for x in np.random.default_rng(7).integers(1, 1500, 60)]
    local = dataset(tmp / "d", ramp_packets(lengths))  # a shard is ~100 times the page
    url, opts, _ = s3(tmp, local)
    proxy = _proxy()
    opts = dict(opts, client_kwargs=dict(opts["client_kwargs"], endpoint_url=proxy["endpoint"]))
    name = sorted(local.glob("*.ndp"))[1].name
    ld = loader(url, "packed", batch_size=2, shuffle=False, storage_options=opts,
                cache_dir=tmp / "c")
    out: dict = {}

    def epoch():
        try:
            out["batches"] = len(batches(ld))
        except BaseException as exc:  # noqa: BLE001 - judged below
            out["error"] = exc

    backoff, remote.BACKOFF_S = remote.BACKOFF_S, 0.002  # the same tries, less waiting
    proxy.update(garbled=f"/{url[5:]}/{name}", asked=0)
    try:
        thread = threading.Thread(target=epoch, daemon=True)
        thread.start()
        thread.join(60)
        asked = proxy["asked"]
    finally:
        proxy["garbled"], remote.BACKOFF_S = None, backoff
    if thread.is_alive():
        raise NotHandled(f"hung: still reading after 60 s, {asked} GETs of the page")
    error = out.get("error")
    cached = [p.name for p in (tmp / "c").rglob(f"{name}*") if p.name in (name, f"{name}.tmp")]
    if not isinstance(error, RemoteError) or asked > remote.RETRIES + 2 or cached:
        raise NotHandled(f"{asked} GETs, cached {cached}, then "
                         f"{out.get('batches', 'no')} batches, error {error!r:.200}")
    return f"{asked} GETs, then RemoteError: ...{str(error)[len(url):][:100]}"


if s3fs is not None:
    for _checked, _how in (("checked", "opened one after another"),
                           ("unchecked", "all opened before any registered")):
        case("remote", f"4 ranks (processes, no LOCAL_WORLD_SIZE) on a cache_limit of two "
             f"shards, {_how}")(lambda tmp, checked=_checked: _four_ranks(tmp, checked))
    case("remote", "an endpoint that answers one shard's GET with 200 and a 57-byte HTML page")(
        _html_page)


# ------------------------------------ ndp export --overwrite onto what it must not replace (9)
def _export_onto(tmp, what: str) -> str:
    d = dataset(tmp / "d")
    shard = sorted(d.glob("*.ndp"))[0]
    data = shard.read_bytes()
    target = {"device": tmp / "null", "shard": shard, "symlink": tmp / "link.bin"}[what]
    if what == "device":
        if os.geteuid() != 0:
            return "skipped: not root, no device node of our own can be made (/dev/null spared)"
        os.mknod(target, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    elif what == "symlink":
        target.symlink_to(shard)
    before = os.lstat(target)
    said = command(["export", str(d), "-o", str(target), "--overwrite", "--no-progress"],
                   codes=(2,))
    after = os.lstat(target)  # the same file (inode), of the same kind (a device, a link)
    if (after.st_ino, after.st_mode, after.st_rdev) != (
            before.st_ino, before.st_mode, before.st_rdev) or shard.read_bytes() != data:
        raise NotHandled(f"{said}; but the {what} changed")
    return said


for _what, _onto in (("device", "a device node of /dev/null's numbers"),
                     ("shard", "one of the dataset's own shards"),
                     ("symlink", "a symlink to one of the dataset's own shards")):
    case("command line", f"ndp export --overwrite onto {_onto}")(
        lambda tmp, what=_what: _export_onto(tmp, what))


# ------------------------------------------- two conversions into one output, SIGTERM (9; writers)
#: ``ndp convert`` that holds once its staging directory is made (when the writer is made in it),
#: says so, and goes on at a line on stdin: a writer caught mid-conversion, at no chosen time
_HELD = """
import sys
import ndp.convert.token_import as token_import

class Held(token_import.ShardWriter):
    def __init__(self, stage, *args, **kw):
        super().__init__(stage, *args, **kw)
        print("staged", stage, flush=True)
        sys.stdin.readline()

token_import.ShardWriter = Held
from ndp.cli.main import main
sys.exit(main(sys.argv[1:]))
"""
_CLI = "import sys; from ndp.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _llmc(path: Path, n_docs: int, seed: int = 5) -> Path:
    """An llm.c (version 1) token file of ramp documents, each after GPT-2's EOT."""
    rng = np.random.default_rng(seed)
    docs = [np.concatenate([[50256], 1000 * (k + 1) + np.arange(int(rng.integers(1, 200)))])
            for k in range(n_docs)]
    tokens = np.concatenate(docs)
    head = np.zeros(256, "<i4")
    head[:3] = (20240520, 1, tokens.shape[0])
    damage(path, head.tobytes() + tokens.astype("<u2").tobytes())
    return path


def _leftovers(parent: Path) -> list[str]:  # what writers left beside the output (not locks)
    return sorted(p.name for p in parent.iterdir()
                  if ".ndp-" in p.name and not p.name.endswith(".ndp-lock"))


def _files(d: Path) -> dict:  # what a directory holds, byte for byte
    return {p.name: p.read_bytes() for p in d.iterdir()} if d.exists() else {}


def _held(src: Path, out: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """A conversion of ``src`` into ``out`` held in its staging directory (which it names)."""
    proc = subprocess.Popen([sys.executable, "-c", _HELD, "convert", str(src), str(out),
                             "--no-progress", *extra], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = _line(proc).split()
    if line[:1] != ["staged"]:
        proc.kill()
        raise NotHandled(f"the held conversion never staged: {proc.communicate()[1][-300:]}")
    return proc, Path(line[1])


@case("command line", "two ndp convert into one new output at once")
def _two_converts(tmp):
    src, out = _llmc(tmp / "in.bin", 300), tmp / "out"
    first, stage = _held(src, out)
    second = None
    try:
        second = subprocess.Popen([sys.executable, "-c", _CLI, "convert", str(src), str(out),
                                   "--no-progress", "--overwrite"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        try:
            _, err = second.communicate(timeout=30)
            how = "refused"
        except subprocess.TimeoutExpired:  # it waits for the first: serialised, perhaps
            err, how = "", "serialised"
        if how == "refused":
            left = _leftovers(tmp)
            if (second.returncode != 2 or f"pid {first.pid}" not in err or "Traceback" in err
                    or left != [stage.name] or out.exists()):
                raise NotHandled(f"the second: exit {second.returncode}, left {left}, output "
                                 f"made {out.exists()}: {err[-240:]}")
        first.stdin.write("go\n")
        first.stdin.flush()
        first_err = first.communicate(timeout=60)[1]
        if how == "serialised" and second.wait(60) != 0:
            raise NotHandled(f"waited for the first, then exit {second.returncode}: "
                             f"{second.communicate()[1][-240:]}")
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    if first.returncode != 0 or _leftovers(tmp) or not (out / "ndp.json").exists():
        raise NotHandled(f"the first: exit {first.returncode}, left {_leftovers(tmp)}: "
                         f"{first_err[-240:]}")
    return (f"the second refused, exit 2: ...{err[err.find('another'):][:110]}"
            if how == "refused" else "the second waited for the first, then wrote")


for _overwrite in (False, True):
    def _sigterm(tmp, overwrite=_overwrite) -> str:
        src, out = _llmc(tmp / "in.bin", 300), tmp / "out"
        if overwrite:
            command(["convert", str(_llmc(tmp / "old.bin", 20, seed=6)), str(out),
                     "--no-progress"], codes=(0,))
        before = _files(out)
        proc, stage = _held(src, out, *(["--overwrite"] if overwrite else []))
        try:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = err.strip().splitlines()
        left = _leftovers(tmp)
        if (proc.returncode in (0, -signal.SIGTERM) or "Traceback" in err or len(lines) != 1
                or left or _files(out) != before):
            raise NotHandled(f"exit {proc.returncode}, left {left}, output as it was "
                             f"{_files(out) == before}: {err[-240:]}")
        return f"exit {proc.returncode}, nothing left: ...{lines[0][-110:]}"
    case("command line", f"ndp convert{' --overwrite' if _overwrite else ''} stopped by "
         f"SIGTERM mid-conversion")(_sigterm)


# ------------------------------------- documents kept whole by --shard-tokens (14; export_docs)
def _cli_out(argv: list[str]) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli(argv)
        except SystemExit as exc:  # argparse's: a finding, not the end of the benchmark
            code = exc.code
    if code != 0:
        raise NotHandled(f"ndp {argv[0]}: exit {code}: {err.getvalue()[-200:]}")
    return out.getvalue()


@case("command line", "ndp export --shard-tokens 500, converted back: the same documents")
def _shard_tokens(tmp):
    from ndp.store.corpus import Corpus
    from ndp.wire.packet import decode_packet

    eos, rng = 65000, np.random.default_rng(14)
    lengths = rng.integers(1, 80, 1001)
    lengths[[10, 500, 990]] = (700, 1300, 1001)  # longer than a file asked for
    ends = np.cumsum(lengths)
    stream = np.arange(int(ends[-1]), dtype=np.int64)  # token i: position i, documents' last: EOS
    stream[ends - 1] = eos
    head = np.zeros(256, "<i4")
    head[:3] = (20240520, 1, stream.shape[0])
    damage(tmp / "in.bin", head.tobytes() + stream.astype("<u2").tobytes())
    _cli_out(["convert", str(tmp / "in.bin"), str(tmp / "ds"), "--eos-id", str(eos), "--split",
              "after", "--shard-size-mb", "0.07", "--no-progress"])  # two shards: a boundary
    _cli_out(["export", str(tmp / "ds"), "-o", str(tmp / "x" / "y.bin"), "--shard-tokens", "500",
              "--no-progress"])
    files = sorted(str(p) for p in (tmp / "x").glob("y_*.bin"))
    back = json.loads(_cli_out(["convert", *files, str(tmp / "back"), "--json"]))["documents"]
    corpus = Corpus(tmp / "back")
    docs = [decode_packet(s.data, int(o)).tokens.tolist()
            for s, i in zip(corpus.shards, corpus.indexes) for o in i.offsets]
    if back != 1001 or docs != [d.tolist() for d in np.split(stream, ends[:-1])]:
        raise NotHandled(f"{back} documents back for 1001 from {len(files)} files"
                         if back != 1001 else "1001 documents back, but other tokens in them")
    return f"1001 documents back, token for token, from {len(files)} files"
