"""The cases of ``bad_inputs.py`` and what they share: ``CASES`` (registered in order by
``@case``, run by ``bad_inputs.py``), ``NotHandled``, and the helpers every case module uses (a
small ramp dataset, damage done to it, a Loader and its batches, a refusal or exact delivery
checked, the command line and a child process). The case modules (``bad_inputs.py``'s own,
``bad_inputs_more.py``, ``bad_inputs_round3.py``, ``bad_inputs_round3b.py``,
``bad_inputs_schedules.py``) import from here, never from each other's runner."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ndp.cli.main import main as cli
from ndp.errors import NDPError
from ndp.loader.loader import Loader
from ndp.store.writer import ShardWriter
from ndp.wire.packet import encode_tokens

CASES: list[tuple[str, str, Callable[[Path], str]]] = []
LENGTHS = [int(x) for x in np.random.default_rng(1).integers(1, 40, 31)]


class NotHandled(Exception):
    """What ndp did instead of refusing or delivering the intact batches."""


def case(group: str, name: str):
    def register(fn: Callable[[Path], str]) -> Callable[[Path], str]:
        CASES.append((group, name, fn))
        return fn
    return register


# ----------------------------------------------------------------------------------- helpers
def ramp_packets(lengths=LENGTHS, base: int = 0) -> list[bytes]:
    return [encode_tokens(k * 1000 + base + np.arange(n), mask=None if k % 4 else
                          (np.arange(n) % 3 != 0).astype(np.uint8)) for k, n in enumerate(lengths)]


def dataset(d: Path, packets: list[bytes] | None = None, shards: int = 2,
            extra: dict | None = None) -> Path:
    packets = ramp_packets() if packets is None else packets
    cut = np.array_split(np.arange(len(packets)), shards)
    d.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(cut):
        with ShardWriter(d, prefix=f"s{i}") as w:
            for k in part:
                w.write(packets[k])
            w.commit(extra)
    return d


def damage(path: Path, data: bytes) -> None:
    """``data`` written over ``path`` in place: damaged test data, not a result (no atomic write:
    tests/store/test_atomic.py lets this file alone write so)."""
    path.write_bytes(data)


def loader(d: Path, mode: str = "padded", **kw) -> Loader:
    kw.setdefault("batch_size", 5 if mode == "padded" else 2)
    return Loader(d, mode=mode, seq_len=16, backend="cpu", output="arrays", seed=3,
                  prefetch=0, **kw)


def batches(ld: Loader, epochs: int = 1) -> list[dict]:
    out = []
    for _ in range(epochs):
        out += [{k: np.array(v) for k, v in b.items()} for b in ld]
    ld.close()
    return out


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def refused(fn: Callable[[], object]) -> str:
    """Handled if ``fn`` raises a named ndp error; its first words are the detail."""
    try:
        fn()
    except NDPError as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    raise NotHandled("accepted")


def exact_or_refused(fn: Callable[[], list[dict]], reference: list[dict]) -> str:
    try:
        got = fn()
    except NDPError as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    if not same(got, reference):
        raise NotHandled("delivered other batches than the intact dataset's")
    return "exact batches"


def command(argv: list[str], codes=(1, 2)) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli(argv)
        except SystemExit as exc:
            code = exc.code
    text = out.getvalue() + err.getvalue()
    if code not in codes or "Traceback" in text:
        raise NotHandled(f"exit {code}: {text[-200:]}")
    return f"exit {code}: {(err.getvalue() or out.getvalue()).strip().splitlines()[-1][:120]}"


def child(code: str, *args: str, timeout: float = 300) -> str:
    try:
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NotHandled(f"hung: the child process was killed after {timeout:g} s") from None
    if r.returncode != 0:
        raise NotHandled(f"child exit {r.returncode}: {r.stderr[-300:]}")
    return r.stdout.strip().splitlines()[-1][:160]


def flip_index_field(d: Path, field: str, entry: int, value=None, xor: int = 1) -> None:
    from ndp.wire.format import INDEX_ENTRY_DTYPE, INDEX_HEADER_BYTES

    idx = sorted(d.glob("*.idx"))[0]
    raw = bytearray(idx.read_bytes())
    entries = np.frombuffer(bytes(raw[INDEX_HEADER_BYTES:]), INDEX_ENTRY_DTYPE).copy()
    if value is None:
        entries[field][entry] ^= xor
    else:
        entries[field][entry] = value
    idx.write_bytes(bytes(raw[:INDEX_HEADER_BYTES]) + entries.tobytes())


def set_entries(d: Path, pick: Callable[[np.ndarray], np.ndarray]) -> None:
    """Rewrite the first index with the entries ``pick`` chooses (its header's count too)."""
    from ndp.wire.format import INDEX_ENTRY_DTYPE, INDEX_HEADER_BYTES, INDEX_HEADER_DTYPE

    idx = sorted(d.glob("*.idx"))[0]
    raw = idx.read_bytes()
    head = np.frombuffer(raw[:INDEX_HEADER_BYTES], INDEX_HEADER_DTYPE).copy()
    chosen = pick(np.frombuffer(raw[INDEX_HEADER_BYTES:], INDEX_ENTRY_DTYPE))
    head["n_packets"] = chosen.shape[0]
    idx.write_bytes(head.tobytes() + chosen.tobytes())
