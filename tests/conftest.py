"""Shared helpers for the ndp core tests.

Test modules import the helpers as ``from ndp_test_helpers import ...``: this conftest registers
itself under that name, because the bare module name ``conftest`` is ambiguous once a
subdirectory (such as ``tests/convert``) has a ``conftest.py`` of its own (pytest drops
``sys.modules["conftest"]`` before importing each one).

Test data is RAMP data: packet ``k`` holds the tokens ``k * 1000 + arange(n)``, so token ``i`` of
packet ``k`` has a value that names its own position; an off-by-one anywhere (a token from the
wrong packet, a shifted window, a byte-swapped id) shows up as a wrong value.

Where the CUDA kernels run: on a machine without an NVIDIA driver the whole run uses Numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, which must be set before Numba is imported, hence
here, first), so every kernel is checked against its CPU reference anyway; tests marked ``gpu``
are skipped. Where a driver is present the same tests run on the device and the ``gpu`` tests
run too. Set ``NUMBA_ENABLE_CUDASIM`` yourself to force either.
"""

from __future__ import annotations

import os
import sys

if "NUMBA_ENABLE_CUDASIM" not in os.environ:
    import shutil

    _HAS_DRIVER = os.path.exists("/proc/driver/nvidia/version") or bool(shutil.which("nvidia-smi"))
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0" if _HAS_DRIVER else "1"
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from ndp.wire.format import FRAME_BYTES, Typ
from ndp.wire.packet import encode_packet, encode_tokens
from ndp.store.shard import encode_shard_header
from ndp.store.writer import ShardWriter

# one profile for the whole suite: small, deterministic, no deadline (the first call of a Numba
# kernel may load compiled code from the cache)
settings.register_profile(
    "ndp",
    max_examples=75,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# HYPOTHESIS_PROFILE=stress runs many more random examples (minutes), for hunting rare cases
settings.register_profile(
    "stress",
    max_examples=3000,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ndp"))

sys.modules.setdefault("ndp_test_helpers", sys.modules[__name__])


@pytest.fixture(autouse=True)
def _own_count_cache(tmp_path_factory, monkeypatch):
    """Each test's shared epoch counts (``ndp.loader.planning.shared_count``) in a folder of its own:
    none is written to ~/.cache, and none made by one test is found by another."""
    monkeypatch.setenv("NDP_COUNT_CACHE", str(tmp_path_factory.mktemp("counts")))


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests, saying why, unless a real CUDA device can be used; and ``simulator``
    tests (they spy on the simulator's classes) unless the simulator runs."""
    from ndp.engine.backend import cuda_unavailable_reason, simulated

    if not simulated():
        skip = pytest.mark.skip(reason="spies on Numba's CUDA simulator, which is not running")
        for item in items:
            if "simulator" in item.keywords:
                item.add_marker(skip)
    reason = "running under the Numba CUDA simulator" if simulated() else cuda_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)

RAMP_STRIDE = 1000


def ramp(k: int, n: int, *, stride: int = RAMP_STRIDE) -> np.ndarray:
    """Tokens of ramp packet ``k``: ``k * stride + arange(n)`` (int64)."""
    return k * stride + np.arange(n, dtype=np.int64)


def ramp_mask(n: int, k: int = 0) -> np.ndarray:
    """A deterministic loss mask for ``n`` tokens: a prompt of ``(k % 3) + 1`` tokens (not in
    the loss) followed by targets, with every 5th target excluded too."""
    mask = np.ones(n, dtype=bool)
    mask[: (k % 3) + 1] = False
    mask[np.arange(n) % 5 == 4] = False
    return mask


@dataclass
class Spec:
    """What one packet of a test shard should decode to."""

    tokens: np.ndarray
    width: int = 4
    mask: np.ndarray | None = None
    src: int = 0x01
    dst: int = 0x01

    def encode(self) -> bytes:
        return encode_tokens(self.tokens, width=self.width, mask=self.mask,
                             src=self.src, dst=self.dst)

    def labels(self) -> np.ndarray:
        if self.mask is None:
            return self.tokens.copy()
        return np.where(self.mask, self.tokens, -100)


def ramp_specs(
    lengths: list[int] | tuple[int, ...],
    *,
    width: int | list[int] = 4,
    masked: bool | list[bool] = False,
    stride: int = RAMP_STRIDE,
) -> list[Spec]:
    """One ramp packet spec per entry of ``lengths`` (widths/masks per packet or for all)."""
    specs = []
    for k, n in enumerate(lengths):
        w = width[k] if isinstance(width, list) else width
        m = masked[k] if isinstance(masked, list) else masked
        specs.append(Spec(ramp(k, n, stride=stride), w, ramp_mask(n, k) if m else None))
    return specs


@dataclass
class Stream:
    """Packets concatenated into one byte string, with each packet's offset and bytes."""

    data: bytes
    offsets: list[int]
    packets: list[bytes]
    specs: list = field(default_factory=list)

    @property
    def array(self) -> np.ndarray:
        return np.frombuffer(self.data, dtype=np.uint8)

    def span(self, k: int) -> tuple[int, int]:
        """[start, end) bytes of packet ``k``."""
        return self.offsets[k], self.offsets[k] + len(self.packets[k])


def build_stream(packets: list[bytes], *, header: bool = False, specs=None) -> Stream:
    """Concatenate framed packets into a shard's bytes (optionally behind a shard header)."""
    out = bytearray(encode_shard_header() if header else b"")
    offsets = []
    for p in packets:
        offsets.append(len(out))
        out += p
    return Stream(bytes(out), offsets, list(packets), list(specs or []))


def ramp_stream(lengths, *, header: bool = False, **kw) -> Stream:
    """A stream of ramp packets (see ``ramp_specs``)."""
    specs = ramp_specs(lengths, **kw)
    return build_stream([s.encode() for s in specs], header=header, specs=specs)


def write_shards(directory: Path, packets: list[bytes], **writer_kw) -> list:
    """Write ``packets`` with ``ShardWriter`` into ``directory``; return its ``ShardInfo`` list."""
    with ShardWriter(directory, **writer_kw) as writer:
        for p in packets:
            writer.write(p)
    return writer.finished


def packet_len(packet: bytes) -> int:
    return FRAME_BYTES + ((packet[4] << 8) | packet[5])


@pytest.fixture
def ramp_shard(tmp_path):
    """A one-shard directory of 12 ramp packets (mixed widths/masks); returns (ShardInfo, Stream)
    where the stream holds the same bytes as the file."""
    lengths = [5, 0, 17, 1, 64, 33, 8, 9, 100, 2, 40, 7]
    widths = [4, 2] * 6
    masked = [False, False, True, True, False, True, False, False, True, False, False, True]
    specs = ramp_specs(lengths, width=widths, masked=masked)
    stream = build_stream([s.encode() for s in specs], header=True, specs=specs)
    (info,) = write_shards(tmp_path, stream.packets)
    assert info.path.read_bytes() == stream.data
    return info, stream


@dataclass
class GappyStream:
    """Packets with garbage blobs between them: ``gaps[i]`` precedes packet ``i`` and
    ``gaps[len(packets)]`` trails the last one."""

    data: bytes
    start: int  # where the packets (or the first gap) begin: after the header, if any
    offsets: list[int]
    packets: list[bytes]
    gap_regions: list[tuple[int, int]]  # (offset, length) of every non-empty gap


def build_gappy_stream(packets: list[bytes], gaps: list[bytes], *, header: bool = False):
    assert len(gaps) == len(packets) + 1
    out = bytearray(encode_shard_header() if header else b"")
    start = len(out)
    offsets, regions = [], []
    for i, gap in enumerate(gaps):
        if gap:
            regions.append((len(out), len(gap)))
            out += gap
        if i < len(packets):
            offsets.append(len(out))
            out += packets[i]
    return GappyStream(bytes(out), start, offsets, list(packets), regions)


def flip_bit(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# --- shared corruption cases (CPU decode and GPU decode are checked on the same ones) ------
def drop_case():
    """A stream with one packet of each kind, and offsets (some hostile) with expected codes."""
    good = [encode_tokens(ramp(k, 4 + k), width=(2 if k % 2 else 4),
                          mask=([k % 3 != 0] * (4 + k) if k > 1 else None)) for k in range(4)]
    bad_crc = bytearray(encode_tokens(ramp(10, 6)))
    bad_crc[9] ^= 0x04
    masked = encode_tokens([1, 2, 3], mask=[1, 0, 1])
    wrong_n = bytearray(masked[6:-2])
    wrong_n[1] = 2  # N says 2, LEN holds 3
    pieces = [
        ("ok", good[0]),
        ("BAD_CRC", bytes(bad_crc)),
        ("ok", good[1]),
        ("BAD_LENGTH", encode_packet(b"\x00" * 7, typ=Typ.TOKEN_IDS)),
        ("BAD_LENGTH", encode_packet(b"\x00" * 5, typ=Typ.TOKEN_IDS_U16)),
        ("BAD_LENGTH", encode_packet(bytes(wrong_n), typ=Typ.TOKEN_IDS_MASKED)),
        ("BAD_LENGTH", encode_packet(b"\x00", typ=Typ.TOKEN_IDS_U16_MASKED)),
        ("NOT_TOKENS", encode_packet(np.ones(4, ">f2").tobytes(), typ=Typ.FLOAT16)),
        ("NOT_TOKENS", encode_packet(b"\x3f\x80\x3f\x80", typ=Typ.BFLOAT16)),
        ("ok", good[2]),
        ("UNKNOWN_TYPE", encode_packet(b"\x00\x00\x00\x01", typ=0x7E)),
        ("UNKNOWN_TYPE", encode_packet(b"", typ=0x00)),
        ("ok", good[3]),
    ]
    stream = build_stream([p for _, p in pieces], header=True)
    data = stream.data
    offsets = list(stream.offsets)
    expected = [name for name, _ in pieces]
    # a packet at the end whose LEN runs past the end of the shard
    tail = bytearray(encode_tokens(ramp(20, 5)))
    tail[4:6] = b"\x01\x00"
    tail_at = len(data)
    data += bytes(tail)
    # hostile offsets
    extra = [
        (stream.offsets[0] + 2, "BAD_SYNC"),  # DST byte of the first packet (0x01)
        (3, "BAD_SYNC"),  # inside the shard header
        (tail_at, "TRUNCATED"),
        (len(data) - 3, "TRUNCATED"),  # too close to the end for a frame
        (len(data), "TRUNCATED"),
        (10**12, "TRUNCATED"),
        (-1, "TRUNCATED"),
        (-(10**12), "TRUNCATED"),
        (2**63 - 1, "TRUNCATED"),  # off + 8 would overflow int64
        (2**63 - 8, "TRUNCATED"),
        (stream.offsets[2], "ok"),  # a repeated good packet
    ]
    for off, name in extra:
        offsets.append(off)
        expected.append(name)
    return data, offsets, expected



_BASE = None


def base_stream():
    """12 ramp packets of mixed widths and masks behind a shard header (built once)."""
    global _BASE
    if _BASE is None:
        specs = ramp_specs([6, 0, 11, 3, 40, 1, 7, 2, 25, 9, 14, 5],
                           width=[4, 2, 4, 4, 2, 2, 4, 4, 2, 4, 2, 4],
                           masked=[False, False, True, False, True, False, False, True, False,
                                   False, True, True])
        _BASE = build_stream([s.encode() for s in specs], header=True, specs=specs)
    return _BASE


corruption = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6)),
    st.tuples(st.just("overwrite"), st.integers(0, 10**6), st.binary(min_size=1, max_size=6)),
)


def corrupt(data: bytes, ops) -> bytes:
    """Apply ``corruption`` operations (bit flip, truncation, overwrite) to ``data``."""
    for op in ops:
        if not data:
            break
        if op[0] == "flip":
            data = flip_bit(data, op[1] % (8 * len(data)))
        elif op[0] == "truncate":
            data = data[: op[1] % (len(data) + 1)]
        else:
            at = op[1] % len(data)
            data = data[:at] + op[2] + data[at + len(op[2]):]
    return data




# ------------------------------------------------------------------ object storage (moto's S3)
class S3Server:
    """moto's S3 server on a free port of 127.0.0.1 (a real HTTP endpoint that s3fs talks to),
    recording every request as (method, path) and failing the ones ``fail`` names."""

    def __init__(self) -> None:
        import logging
        import threading

        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._app = DomainDispatcherApplication(create_backend_app)
        self.requests: list[tuple[str, str]] = []
        self.queries: list[str] = []
        self._faults: list[list] = []
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def options(self) -> dict:
        """``storage_options`` for s3fs: this endpoint, test credentials, few retries."""
        return {"key": "testing", "secret": "testing", "skip_instance_cache": True,
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"},
                "config_kwargs": {"retries": {"max_attempts": 1}}}

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(**self.options)

    def bucket(self, name: str) -> str:
        self.fs().call_s3("create_bucket", Bucket=name)
        return name

    def gets(self, suffix: str = "", method: str = "GET") -> int:
        """GET (``method``) requests so far for objects whose path ends with ``suffix``."""
        return sum(1 for m, p in self.requests if m == method and p.endswith(suffix))

    def fail(self, suffix: str, kind: str, times: int = 1, method: str = "GET") -> None:
        """The next ``times`` requests (``method``) of an object whose path ends with ``suffix``
        fail: "cut"
        (the connection drops half way through the body), "stop" (so does the server, for
        good), "503" or "403"."""
        with self._lock:
            self._faults.append([suffix, kind, times, method])

    def _fault(self, environ) -> str | None:
        path = environ.get("PATH_INFO", "")
        with self._lock:
            for f in self._faults:
                if environ["REQUEST_METHOD"] == f[3] and path.endswith(f[0]) and f[2] > 0:
                    f[2] -= 1
                    return f[1]
        return None

    def _wsgi(self, environ, start_response):
        with self._lock:
            self.requests.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")))
            self.queries.append(environ.get("QUERY_STRING", ""))
        fault = self._fault(environ)
        if fault in ("503", "403"):
            status = {"503": "503 Slow Down", "403": "403 Forbidden"}[fault]
            code = {"503": "SlowDown", "403": "AccessDenied"}[fault]
            body = f"<Error><Code>{code}</Code><Message>{fault}</Message></Error>".encode()
            start_response(status, [("Content-Type", "application/xml"),
                                    ("Content-Length", str(len(body)))])
            return [body]
        result = self._app(environ, start_response)
        if fault not in ("cut", "stop"):
            return result
        body = b"".join(result)

        def cut():
            yield body[: len(body) // 2]
            if fault == "stop":  # the server goes away in the middle of the body
                import threading

                threading.Thread(target=self._server.shutdown, daemon=True).start()
            raise ConnectionResetError("fault injected by the test: connection dropped")

        return cut()

    def stop(self) -> None:
        self._server.shutdown()
        self._thread.join()
        self._server.server_close()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 endpoint on 127.0.0.1 for the session (moto's server), stopped after."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    server = S3Server()
    yield server
    server.stop()


def upload(directory: Path, fs, prefix: str) -> None:
    """Every file of ``directory`` under ``prefix`` (``bucket/path``), the manifest last."""
    files = sorted(directory.iterdir(), key=lambda p: p.name == "ndp.json")
    for f in files:
        if f.is_file():
            fs.pipe(f"{prefix}/{f.name}", f.read_bytes())


# --- documentation that runs as written (tests/test_readme.py, tests/test_docs.py) ------------

def markdown_blocks(text: str, heading: str | None = None) -> list[tuple[str, str]]:
    """The fenced ``python`` and ``bash`` blocks of ``text`` (of its section under ``heading``,
    such as ``"## Quick start"``, up to the next heading of that level), in order, as
    (language, code)."""
    import re

    if heading is not None:
        level = heading.split(" ", 1)[0] + " "
        text = text[text.index("\n" + heading + "\n"):]
        end = text.find("\n" + level, 1)
        text = text if end < 0 else text[:end]
    return re.findall(r"```(python|bash)\n(.*?)```", text, re.S)


def run_markdown(blocks: list[tuple[str, str]], namespace: dict, name: str) -> None:
    """Run ``blocks`` as a reader would, in the working directory: each python block in
    ``namespace``, each ``ndp ...`` line of a bash block through ndp's own entry point (exit
    status 0). A ``pip install`` line is what the test set-up already did; any other shell line
    fails, so that nothing a page asks the reader to run is silently left out."""
    import shlex

    from ndp.cli.main import main

    for i, (language, code) in enumerate(blocks, 1):
        if language == "python":
            try:
                exec(compile(code, f"{name} block {i}", "exec"), namespace)
            except Exception as exc:  # say which block
                raise AssertionError(f"{name} block {i} failed: {exc!r}\n{code}") from exc
            continue
        for line in code.splitlines():
            line = line.split("  #", 1)[0].strip()
            if not line or line.startswith("pip install "):
                continue
            argv = shlex.split(line)
            assert argv[0] == "ndp", f"{name} block {i}: a shell line the test cannot run: {line}"
            assert main(argv[1:]) == 0, f"{name} block {i}: {line} failed"


# ------------------------------------------------------- a small real tokenizer, once a session
@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    """Trained the way ``ndp demo`` trains its own."""
    from ndp.cli.demo import stdlib_files, train_tokenizer

    texts = [p.read_text(encoding="utf-8") for p in stdlib_files(40)]
    return str(train_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=1024))


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir):
    from ndp.convert import load_tokenizer

    return load_tokenizer(tokenizer_dir)

