"""ndp.store.cache: a shard lands under its name only whole and checked; eviction takes the least
recently used shard that no live process pins; a cache its pins fill, or a full disk, is a
``CacheFullError`` that names the limit, and leaves no temporary file behind; a wait given up
ends the other waits on the same cache at once."""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
import zlib

import pytest

from ndp.store.cache import FULL, PINS, VERIFIED, ShardCache
from ndp.errors import CacheFullError, ConfigError


def writer(data: bytes):
    def download(out):
        out.seek(0)
        out.write(data)
        out.truncate()
    return download


def test_a_download_lands_whole_and_a_second_get_is_a_hit(tmp_path):
    cache = ShardCache(tmp_path)
    path = cache.get("a.ndp", 5, writer(b"12345"))
    assert path.read_bytes() == b"12345"
    assert cache.get("a.ndp", 5, writer(b"XXXXX")).read_bytes() == b"12345"
    assert (cache.stats.downloads, cache.stats.hits) == (1, 1)


def test_a_failed_download_leaves_nothing(tmp_path):
    cache = ShardCache(tmp_path)

    def broken(out):
        out.write(b"12")
        raise ConnectionResetError("dropped")

    with pytest.raises(ConnectionResetError):
        cache.get("a.ndp", 5, broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == [PINS, "a.ndp.lock"]


def test_a_full_disk_is_a_cache_full_error_naming_the_fix(tmp_path):
    cache = ShardCache(tmp_path)

    def no_space(out):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(CacheFullError, match="disk is full.*cache_limit="):
        cache.get("a.ndp", 5, no_space)
    assert not list(tmp_path.glob("a.ndp*.tmp")) and not (tmp_path / "a.ndp").exists()


def test_eviction_takes_the_least_recently_used_unpinned_shard(tmp_path):
    cache = ShardCache(tmp_path, limit=10)
    for name in ("a.ndp", "b.ndp"):
        cache.get(name, 5, writer(b"x" * 5))
        time.sleep(0.01)
    cache.touch("a.ndp")  # b is now the least recently used
    cache.get("c.ndp", 5, writer(b"y" * 5))
    assert sorted(p.name for p in tmp_path.glob("*.ndp")) == ["a.ndp", "c.ndp"]
    cache.pin({"a.ndp"})
    cache.touch("c.ndp")
    cache.get("d.ndp", 5, writer(b"z" * 5))  # a is older, but pinned
    assert sorted(p.name for p in tmp_path.glob("*.ndp")) == ["a.ndp", "d.ndp"]


def test_pins_of_a_live_process_hold_and_of_a_dead_one_do_not(tmp_path):
    cache = ShardCache(tmp_path, limit=10, wait=0.3)
    for name in ("a.ndp", "b.ndp"):
        cache.get(name, 5, writer(b"x" * 5))
    other = tmp_path / PINS / f"{os.getppid()}-1"  # a live process (the parent)
    other.write_text(json.dumps(["a.ndp", "b.ndp"]))
    with pytest.raises(CacheFullError, match="cache_limit=10 .*waited 0 s"):
        cache.get("c.ndp", 5, writer(b"y" * 5))
    assert not list(tmp_path.glob("*.tmp"))
    dead = 2 ** 22 + 12345  # above pid_max's default: no such process
    other.rename(tmp_path / PINS / f"{dead}-1")
    cache.get("c.ndp", 5, writer(b"y" * 5))
    assert not (tmp_path / PINS / f"{dead}-1").exists()  # its pins were dropped


def test_a_shard_larger_than_the_limit_is_refused(tmp_path):
    with pytest.raises(CacheFullError, match="more than cache_limit=4"):
        ShardCache(tmp_path, limit=4).get("a.ndp", 5, writer(b"12345"))


def test_a_temporary_file_left_by_a_killed_download_holds_no_room(tmp_path):
    cache = ShardCache(tmp_path, limit=10)
    (tmp_path / "a.ndp.tmp").write_bytes(b"x" * 8)  # a download killed half way
    cache.get("b.ndp", 5, writer(b"y" * 5))
    assert not (tmp_path / "a.ndp.tmp").exists() and (tmp_path / "b.ndp").exists()


def test_a_cache_dir_that_is_a_regular_file_is_a_config_error_naming_it(tmp_path):
    """Checked for real: the cache is made under a file, as a path to a cache_dir would be."""
    taken = tmp_path / "cache"
    taken.write_bytes(b"not a directory")
    for where in (taken, taken / "key"):
        with pytest.raises(ConfigError, match=rf"{taken}.* not a directory.*`cache_dir`"):
            ShardCache(where)
    assert taken.read_bytes() == b"not a directory"


def test_an_unwritable_cache_dir_is_a_config_error_naming_it(tmp_path, monkeypatch):
    """Monkeypatched: as root, permissions do not stop a write, so the refusal is made up at the
    one place ShardCache writes when it is made (its probe file)."""
    real_open = os.open

    def refuse(path, flags, *args, **kw):
        if str(path).startswith(str(tmp_path)) and flags & os.O_CREAT:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kw)

    (tmp_path / "key" / PINS).mkdir(parents=True)  # there already, as from another user's run
    monkeypatch.setattr(os, "open", refuse)
    with pytest.raises(ConfigError, match=rf"{tmp_path / 'key'}: .*cannot write.*Permission "
                                          rf"denied.*`cache_dir`"):
        ShardCache(tmp_path / "key")


def _crc(data: bytes) -> int:
    return zlib.crc32(data)


def test_a_cached_shard_rewritten_after_its_check_is_checked_again_and_downloaded(tmp_path):
    """Its identity is not the one recorded: its crc32 is counted, and a file that is not the
    manifest's is downloaded again with a warning naming it; a touch keeps the identity."""
    cache = ShardCache(tmp_path)
    cache.get("a.ndp", 5, writer(b"12345"), crc32=_crc(b"12345"))
    cache.touch("a.ndp")
    assert cache.get("a.ndp", 5, writer(b"XXXXX"), crc32=_crc(b"12345")).read_bytes() == b"12345"
    assert cache.stats.rechecked == 0
    time.sleep(0.05)  # past the granularity of the filesystem's modification times
    with open(tmp_path / "a.ndp", "r+b") as f:  # the same size, the same inode
        f.write(b"54321")
    where = re.escape(str(tmp_path / "a.ndp"))
    with pytest.warns(UserWarning, match=rf"{where}: 5 bytes with crc32 .*downloaded again"):
        path = cache.get("a.ndp", 5, writer(b"12345"), crc32=_crc(b"12345"))
    assert path.read_bytes() == b"12345"
    assert (cache.stats.downloads, cache.stats.rechecked) == (2, 1)
    fresh = ShardCache(tmp_path)  # another process: the new file's record is there
    fresh.get("a.ndp", 5, writer(b"XXXXX"), crc32=_crc(b"12345"))
    assert (fresh.stats.hits, fresh.stats.rechecked) == (1, 0)


def test_a_cached_shard_without_a_record_is_checked_once_and_kept(tmp_path, recwarn):
    """As a cache an older ndp made: the crc32 is the manifest's, so it is kept, recorded."""
    (tmp_path / "a.ndp").write_bytes(b"12345")
    cache = ShardCache(tmp_path)
    for _ in range(2):
        assert cache.get("a.ndp", 5, writer(b"XXXXX"), crc32=_crc(b"12345")).read_bytes() \
            == b"12345"
    assert (cache.stats.downloads, cache.stats.hits, cache.stats.rechecked) == (0, 2, 1)
    assert not [w for w in recwarn if "a.ndp" in str(w.message)]


def test_an_evicted_shard_takes_its_record_with_it(tmp_path):
    cache = ShardCache(tmp_path, limit=5)
    cache.get("a.ndp", 5, writer(b"x" * 5))
    cache.get("b.ndp", 5, writer(b"y" * 5))
    assert sorted(p.name for p in (tmp_path / VERIFIED).iterdir()) == ["b.ndp.json"]


def test_a_wait_given_up_ends_the_others_waiting_on_the_cache(tmp_path):
    """Two ranks (threads here: the record is a file, as for processes) wait for room that a
    live process (the parent) pins. The one that waits 1 s gives up and says so in ``FULL``;
    the other, which would wait 10 s, stops at its next poll naming it, and records nothing.
    A give-up older than a wait does not end it, a download without waiting (the prefetcher's)
    gives nothing up, and a download that succeeds removes the record."""
    ShardCache(tmp_path, limit=10).get("a.ndp", 5, writer(b"x" * 5))
    ShardCache(tmp_path, limit=10).get("b.ndp", 5, writer(b"x" * 5))
    other = tmp_path / PINS / f"{os.getppid()}-1"
    other.write_text(json.dumps(["a.ndp", "b.ndp"]))
    with pytest.raises(CacheFullError, match="waited 0 s"):
        ShardCache(tmp_path, limit=10, wait=5.0).get("e.ndp", 5, writer(b"y" * 5), wait=False)
    assert not (tmp_path / FULL).exists()

    ended: dict[str, tuple[float, str]] = {}

    def wait(cache: ShardCache, name: str) -> None:
        start = time.monotonic()
        try:
            cache.get(name, 5, writer(b"y" * 5))
        except CacheFullError as exc:
            ended[name] = (time.monotonic() - start, str(exc))

    patient = threading.Thread(target=wait, args=(ShardCache(tmp_path, limit=10, wait=10.0),
                                                  "d.ndp"))
    patient.start()
    time.sleep(0.3)  # waiting before the other gives up
    quick = threading.Thread(target=wait, args=(ShardCache(tmp_path, limit=10, wait=1.0),
                                                "c.ndp"))
    quick.start()
    quick.join(timeout=30)
    patient.join(timeout=30)
    assert "c.ndp" in ended and ended["c.ndp"][0] < 3 and "waited 1 s" in ended["c.ndp"][1]
    record = json.loads((tmp_path / FULL).read_text())
    assert (record["pid"], record["shard"], record["limit"]) == (os.getpid(), "c.ndp", 10)
    took, message = ended["d.ndp"]
    assert took < 3.5, f"the other wait outlived the give-up by {took - 1.3:.1f} s"
    assert re.search(rf"cache_limit=10 \(process {os.getpid()} on .*gave up at .*caching "
                     rf"c\.ndp: stopped waiting after \d+\.\d s of 10 s", message), message

    start = time.monotonic()  # a give-up before this wait began: it waits its own time
    with pytest.raises(CacheFullError, match=r"\(waited 1 s\)"):
        ShardCache(tmp_path, limit=10, wait=0.6).get("e.ndp", 5, writer(b"y" * 5))
    assert time.monotonic() - start >= 0.6
    other.unlink()
    ShardCache(tmp_path, limit=10).get("c.ndp", 5, writer(b"y" * 5))
    assert not (tmp_path / FULL).exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_a_prefetch_never_waits_behind_another_download_of_the_same_shard(tmp_path):
    """A fetch that does not wait (the prefetcher's) finds the shard's lock held by another
    download: ``ShardBusy`` at once, nothing downloaded, nothing left (a prefetch that waited
    would download the shard again after that download failed, behind the consumer's error)."""
    from filelock import FileLock

    from ndp.store.cache import LOCK_SUFFIX
    from ndp.store.readers import ShardBusy

    cache = ShardCache(tmp_path)
    held = FileLock(str(tmp_path / "a.ndp") + LOCK_SUFFIX)
    held.acquire()
    called = []
    try:
        with pytest.raises(ShardBusy):
            cache.get("a.ndp", 5, lambda out: called.append(out), wait=False)
    finally:
        held.release()
    assert called == [] and not (tmp_path / "a.ndp").exists()
    assert cache.get("a.ndp", 5, writer(b"12345"), wait=False).read_bytes() == b"12345"
