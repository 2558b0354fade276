"""ndp.store.remote against a server that answers, but not with the shard: a proxy between the
client and the storage that answers a shard's GET with ``200 OK`` and its own 57-byte HTML page.
Every read of it ends, after a fixed number of requests (counted at the server), with a
``RemoteError`` naming the URL, what came back and what to do; nothing enters the cache.

The server is moto's S3 (``S3Server``) on 127.0.0.1, read through s3fs, with the proxy's answer
put in front of one key. RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from ndp.errors import RemoteError
from ndp.loader.loader import Loader
from ndp.store.remote import RETRIES, RemoteDataset

from ndp_test_helpers import S3Server, ramp_specs, upload, write_shards

#: a proxy's error page, as one answered in the trial (57 bytes, sent with 200 OK)
PAGE = b"<html><body><h1>502 Bad Gateway</h1>proxy.</body></html>\n"
NAMES = ["p0-00000.ndp", "p1-00000.ndp"]


class ProxiedS3(S3Server):
    """``S3Server`` behind a proxy that answers every GET of a key ending with ``garbled``
    with ``200 OK`` and ``PAGE`` (whatever range was asked); every request is still counted."""

    garbled: str | None = None

    def _wsgi(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if (self.garbled is not None and environ["REQUEST_METHOD"] == "GET"
                and path.endswith(self.garbled)):
            with self._lock:
                self.requests.append(("GET", path))
                self.queries.append(environ.get("QUERY_STRING", ""))
            start_response("200 OK", [("Content-Type", "text/html"),
                                      ("Content-Length", str(len(PAGE)))])
            return [PAGE]
        return super()._wsgi(environ, start_response)


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    proxied = ProxiedS3()
    yield proxied
    proxied.stop()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """Retries 100x sooner than by default: the same number of them, less waiting."""
    monkeypatch.setattr("ndp.store.remote.BACKOFF_S", 0.002)


_n = 0


@pytest.fixture
def remote(server, tmp_path_factory) -> tuple[str, Path]:
    """Two shards of 30 ramp packets each (some of ~6 KiB: a shard is ~100 times the page),
    uploaded under a bucket of their own; (URL, local copy)."""
    global _n
    _n += 1
    local = tmp_path_factory.mktemp("local")
    lengths = [int(x) for x in np.random.default_rng(7).integers(1, 1500, 60)]
    packets = [s.encode() for s in ramp_specs(lengths)]
    for i in range(2):
        write_shards(local, packets[30 * i: 30 * (i + 1)], prefix=f"p{i}")
    bucket = server.bucket(f"ndp-proxied-{_n}")
    upload(local, server.fs(), f"{bucket}/data")
    server.garbled = None
    return f"s3://{bucket}/data", local


def _ends(call, limit_s: float = 120.0):
    """``call()`` on a thread; what it returned or raised, or a failure if it is still running
    after ``limit_s`` (a hang, not a slow run: the bounded run takes well under a second)."""
    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"still reading after {limit_s:.0f} s"
    return out


def test_a_page_in_place_of_a_shard_ends_the_download_after_a_fixed_number_of_requests(
        server, remote, tmp_path):
    url, local = remote
    assert len(PAGE) == 57 and (local / NAMES[1]).stat().st_size > 50 * len(PAGE)
    dataset = RemoteDataset(url, storage_options=server.options, cache_dir=tmp_path)
    try:
        server.garbled = f"/{url[5:]}/{NAMES[1]}"
        before = server.gets(server.garbled)
        out = _ends(lambda: dataset.fetch(dataset.entries[1]))
        asked = server.gets(server.garbled) - before
    finally:
        server.garbled = None
        dataset.close()
    # one request per try: the page is not read on, 57 bytes at a time, as if it were the shard
    assert asked == RETRIES + 1, asked
    error = out.get("error")
    assert isinstance(error, RemoteError), out
    size = (local / NAMES[1]).stat().st_size
    message = str(error)
    for said in (f"{url}/{NAMES[1]}", f"{len(PAGE)} bytes", f"{size:,} bytes", "<html>",
                 "not the shard", f"{RETRIES + 1} tries", "proxy"):
        assert said in message, (said, message)
    assert not list(tmp_path.rglob(NAMES[1])) and not list(tmp_path.rglob(NAMES[1] + ".tmp"))


def test_a_page_in_place_of_a_shard_ends_the_loaders_epoch_with_a_remote_error(
        server, remote, tmp_path):
    """The Loader's prefetch and its decoder both ask for the shard: still a fixed, small number
    of requests, and the error reaches the consumer."""
    url, _ = remote
    loader = Loader(url, mode="packed", batch_size=2, seq_len=64, output="arrays",
                    shuffle=False, storage_options=server.options, cache_dir=tmp_path)
    server.garbled = f"/{url[5:]}/{NAMES[1]}"
    try:
        def epoch():
            with loader:
                return sum(1 for _ in loader)

        out = _ends(epoch)
    finally:
        server.garbled = None
    asked = server.gets(f"/{url[5:]}/{NAMES[1]}")
    assert 1 <= asked <= RETRIES + 2, asked  # the prefetch's one try, the decoder's tries
    assert isinstance(out.get("error"), RemoteError), out
    assert f"{url}/{NAMES[1]}" in str(out["error"]) and "not the shard" in str(out["error"])


def test_an_object_longer_than_the_manifests_shard_is_not_cached(server, remote, tmp_path):
    """Read in ranges up to the manifest's size, the shard's bytes would all be there: the one
    more byte asked with the last range shows the object is not the manifest's."""
    url, local = remote
    data = (local / NAMES[0]).read_bytes()
    server.fs().pipe(f"{url[5:]}/{NAMES[0]}", data + b"<html></html>")
    dataset = RemoteDataset(url, storage_options=server.options, cache_dir=tmp_path)
    try:
        with pytest.raises(RemoteError, match=rf"{url}/{NAMES[0]}: .* longer than the "
                                              rf"manifest's shard .*not the shard"):
            dataset.fetch(dataset.entries[0])
    finally:
        dataset.close()
    assert not list(tmp_path.rglob(NAMES[0])) and not list(tmp_path.rglob(NAMES[0] + ".tmp"))
