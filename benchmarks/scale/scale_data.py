"""The synthetic datasets ``bench_scale.py`` measures: their spec and shard layout, the
generator, the marker that lets a later run reuse a dataset, and ``ndp index`` / ``ndp verify``
run on them, timed in a process of their own.

``N`` documents of ``--doc-tokens`` (16) uint16 tokens each (TYP ``TOKEN_IDS_U16``), document
``d`` holding the ramp ``(16 d + j) % vocab``: small documents keep 1e8 of them to 4 GB of
shards. The generator writes shards of about ``--shard-mb`` (64) MB with the 32-byte shard
header ``ndp.store.writer`` writes (``encode_shard_header``) and no index or manifest, each
through ``ndp.store.atomic`` (streamed to ``<shard>.tmp``, fsynced, renamed);
``ndp index --write-manifest`` (the command line, timed: the "ndp index" cost) then writes the
indexes and ``ndp.json``. The ramp repeats every ``vocab / gcd(vocab, 16)`` documents, so one
period of packets is encoded by ``ndp.wire.packet.encode_tokens`` (CRC included) and the shards
are that period tiled: writing 1e8 documents is bound by the disk, not by a CRC per packet. A
dataset lives in ``--data`` (default ``/tmp/ndp-scale-data``), one folder per size, with a
marker file (size, generator version, layout); a later run reuses it when the marker and the
shards' sizes match, and regenerates it otherwise. Up to ``--verify-max`` documents (1e7)
``ndp verify`` checks the dataset whole; every size is read by the Loader runs, which validate
every packet they decode and report the packets dropped (0 expected).

ndp is imported inside the functions, never at import: the measured worker process imports
this module (through ``bench_scale.py``) before it times ``import ndp``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

#: the generator's layout; a dataset made by another version is regenerated
GENERATOR_VERSION = 1
MARKER = ".bench-scale.json"


def parse_size(text: str) -> int:
    value = float(text)
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"a size is a whole number of documents, got {text!r}")
    return int(value)


def size_name(n: int) -> str:
    """``1e6`` for 1,000,000; ``25000`` for a size that is no power of ten."""
    exp = round(math.log10(n))
    return f"1e{exp}" if 10 ** exp == n else str(n)


def add_dataset_arguments(parser: argparse.ArgumentParser) -> None:
    """The options that name a synthetic dataset (``dataset_spec``) and where it lives, shared
    by every script that measures one (``bench_scale.py``, ``plan/bench_explain.py``,
    ``plan/bench_plan_change.py``): generated once, reused across runs."""
    parser.add_argument("--doc-tokens", type=int, default=16, help="tokens per document")
    parser.add_argument("--vocab", type=int, default=50304,
                        help="the ramp's modulus (token ids 0..vocab-1, uint16)")
    parser.add_argument("--shard-mb", type=float, default=64, help="shard size, MiB")
    parser.add_argument("--data", type=Path, default=Path("/tmp/ndp-scale-data"),
                        help="where the generated datasets live (reused across runs)")


def dataset_spec(n: int, args: argparse.Namespace) -> dict:
    return {"documents": n, "generator": GENERATOR_VERSION, "doc_tokens": args.doc_tokens,
            "vocab": args.vocab, "shard_bytes": int(args.shard_mb * (1 << 20)),
            "token_width": 2}


def shard_layout(spec: dict) -> tuple[int, list[int]]:
    """Packet bytes and packets per shard for ``spec``."""
    from ndp.wire.format import FRAME_BYTES, SHARD_HEADER_BYTES

    packet = FRAME_BYTES + 2 * spec["doc_tokens"]
    per_shard = max(1, (spec["shard_bytes"] - SHARD_HEADER_BYTES) // packet)
    n = spec["documents"]
    return packet, [min(per_shard, n - a) for a in range(0, n, per_shard)]


def dataset_matches(folder: Path, spec: dict) -> bool:
    """Whether ``folder`` holds the generated shards of ``spec`` (marker and shard sizes)."""
    from ndp.wire.format import SHARD_HEADER_BYTES

    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if {k: marker.get(k) for k in spec} != spec:
        return False
    packet, counts = shard_layout(spec)
    for i, count in enumerate(counts):
        path = folder / shard_name(i)
        if not path.is_file() or path.stat().st_size != SHARD_HEADER_BYTES + count * packet:
            return False
    return len(list(folder.glob("*.ndp"))) == len(counts)


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.ndp"


def generate(folder: Path, spec: dict) -> dict:
    """Write ``spec``'s shards into ``folder`` (emptied of ndp files first), each streamed
    through ``atomic_file``; no index, no manifest. Returns what was written and how long it
    took."""
    from ndp.store.atomic import atomic_file, atomic_write
    from ndp.store.shard import encode_shard_header
    from ndp.wire.packet import encode_tokens

    t0 = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    for pattern in ("*.ndp", "*.idx", "*.tmp", "ndp.json", MARKER):
        for path in folder.glob(pattern):
            path.unlink()
    width, k, vocab = spec["token_width"], spec["doc_tokens"], spec["vocab"]
    period = vocab // math.gcd(vocab, k)  # documents after which the ramp repeats
    block = b"".join(encode_tokens(np.arange(d * k, d * k + k) % vocab, width=width)
                     for d in range(period))
    packet, counts = shard_layout(spec)
    assert len(block) == period * packet
    reps = max(1, (8 << 20) // len(block))  # write ~8 MB at a time
    tile = np.frombuffer(block * (reps + 1), np.uint8)
    header = encode_shard_header()
    doc = 0
    total = 0
    for i, count in enumerate(counts):
        with atomic_file(folder / shard_name(i)) as f:  # shard-NNNNN.ndp.tmp, then renamed
            f.write(header)
            left = count
            while left:
                phase = doc % period
                m = min(left, reps * period)
                f.write(tile[phase * packet:(phase + m) * packet].data)
                doc += m
                left -= m
        total += len(header) + count * packet
    assert doc == spec["documents"]
    seconds = time.perf_counter() - t0
    atomic_write(folder / MARKER, json.dumps({**spec, "shards": len(counts), "bytes": total,
                                              "generate_seconds": seconds}, indent=1))
    return {"shards": len(counts), "bytes": total, "seconds": seconds}


def ensure_dataset(folder: Path, spec: dict) -> dict:
    if dataset_matches(folder, spec):
        marker = json.loads((folder / MARKER).read_text())
        return {"shards": marker["shards"], "bytes": marker["bytes"], "reused": True,
                "generated_seconds": marker.get("generate_seconds")}
    made = generate(folder, spec)
    return {"shards": made["shards"], "bytes": made["bytes"], "reused": False,
            "generated_seconds": made["seconds"]}


#: run in the measured process: its own peak RSS (VmHWM) printed last on stderr at exit
_HWM_AT_EXIT = ("import atexit, sys\n"
                "def _hwm():\n"
                "    for line in open('/proc/self/status'):\n"
                "        if line.startswith('VmHWM:'):\n"
                "            sys.stderr.write('\\nbench-scale-hwm-kb ' + line.split()[1] + '\\n')\n"
                "atexit.register(_hwm)\n")


def run_measured(cmd: list[str], *, cwd: Path) -> tuple[int, float, float, str, str]:
    """Run the Python command line ``cmd`` (after the interpreter: ``-m module args``); its exit
    status, wall seconds, peak RSS in MB (its own VmHWM, which it prints at exit: the
    ``ru_maxrss`` a parent gets counts the parent's memory too, since Linux carries the
    pre-``exec`` high-water mark over) and stdout and stderr."""
    assert cmd[:2] == [sys.executable, "-m"]
    code = (_HWM_AT_EXIT + "import runpy\n"
            f"sys.argv = {[cmd[2], *cmd[3:]]!r}\n"
            f"runpy.run_module({cmd[2]!r}, run_name='__main__', alter_sys=True)\n")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    err, _, hwm = proc.stderr.rpartition("\nbench-scale-hwm-kb ")
    if not hwm:
        raise SystemExit(f"{' '.join(cmd[2:])}: no peak RSS reported:\n{proc.stderr[-3000:]}")
    return proc.returncode, seconds, int(hwm.split()[0]) / 1024, proc.stdout, err


def ndp_cli(*words: str) -> list[str]:
    """The ``ndp`` command as this interpreter runs it: ``python -m ndp.cli`` (the ``ndp``
    script may import another copy of ndp than ``PYTHONPATH`` names)."""
    return [sys.executable, "-m", "ndp.cli", *words]


def index_dataset(folder: Path) -> dict:
    """``ndp index --write-manifest`` on ``folder``, timed."""
    rc, seconds, rss, out, err = run_measured(ndp_cli("index", "--write-manifest", "--json",
                                                      str(folder)), cwd=folder.parent)
    if rc != 0:
        raise SystemExit(f"ndp index failed ({rc}) on {folder}:\n{err[-3000:]}")
    report = json.loads(out)
    packets = sum(s["packets"] for s in report["shards"])
    corrupt = sum(len(s["corrupt"]) for s in report["shards"])
    return {"seconds": seconds, "peak_rss_mb": rss, "packets": packets, "corrupt": corrupt,
            "command": "ndp index --write-manifest DIR"}


def verify_dataset(folder: Path) -> dict:
    rc, seconds, rss, out, err = run_measured(ndp_cli("verify", str(folder)), cwd=folder.parent)
    if rc != 0:
        raise SystemExit(f"ndp verify refused {folder} ({rc}):\n{out[-2000:]}{err[-2000:]}")
    return {"seconds": seconds, "peak_rss_mb": rss, "ok": True}
