"""ndp.store.manifest: a manifest that is not UTF-8 text is a ManifestError naming the file and
the byte, whether read from a directory (Loader, NDPDataset) or from object storage (bytes)."""

from __future__ import annotations

import pytest

from ndp.adapters.dataset import NDPDataset
from ndp.errors import ManifestError
from ndp.loader.loader import Loader
from ndp.store.manifest import MANIFEST, parse_manifest, read_manifest
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards


@pytest.fixture
def latin1_manifest(tmp_path):
    """A dataset whose ndp.json holds one byte (0xff) that no UTF-8 text holds; its offset."""
    write_shards(tmp_path, [encode_tokens(ramp(k, 5)) for k in range(4)])
    path = tmp_path / MANIFEST
    text = path.read_bytes()
    at = text.index(b'"shards"') + 2  # inside a key: the JSON around it stays whole
    path.write_bytes(text[:at] + b"\xff" + text[at:])
    return tmp_path, at


def test_a_manifest_with_a_non_utf8_byte_is_a_manifest_error_naming_the_byte(latin1_manifest):
    d, at = latin1_manifest
    with pytest.raises(ManifestError, match=rf"{MANIFEST}: .*not UTF-8.* 0xff at offset {at}"):
        read_manifest(d)
    with pytest.raises(ManifestError, match=rf"{MANIFEST}: .*offset {at}"):
        Loader(d, batch_size=1, seq_len=4, backend="cpu", output="arrays")
    with pytest.raises(ManifestError, match=rf"{MANIFEST}: .*offset {at}"):
        NDPDataset(d, seq_len=4)


def test_remote_manifest_bytes_that_are_not_utf8_name_the_byte():
    with pytest.raises(ManifestError, match=r"s3://b/d/ndp.json: .*not UTF-8.* 0xfe at offset 3"):
        parse_manifest(b'{"s\xfe": []}', "s3://b/d/ndp.json", "s3://b/d")
