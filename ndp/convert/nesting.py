"""How deeply a JSON file nests, found by a numpy scan before pyarrow reads the file.

pyarrow's JSON reader recurses once per level and overflows the C stack somewhere past 17,000
levels (a segfault: no message, no cleanup, the whole conversion gone), on one JSON Lines
record or on a value that spans lines. ``ndp.convert.datafiles`` scans each JSON file first
and gives pyarrow none that nests deeper than ``MAX_DEPTH``.

The scan counts the brackets outside strings. A string runs from a quote to the next quote not
escaped by an odd run of backslashes, and never past a newline (JSON strings hold none, so a
line cut inside a string does not turn the rest of the file inside out). Depth is the rise of
the bracket level above its lowest point so far: exact for valid JSON; unbalanced brackets in
damaged lines only raise it, sending the file to the line reader, which is where a damaged file
goes anyway. About 150 MB/s on one core, uncompressed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: deeper than this, a JSON file is not given to pyarrow: far deeper than real records nest (a
#: few tens of levels), far from the ~17,000 where pyarrow crashes on an 8 MiB stack
MAX_DEPTH = 256
_CHUNK = 8 << 20  # bytes read at a time: with the temporaries, ~40 MiB

_OPEN, _CLOSE, _QUOTE, _NEWLINE, _BACKSLASH = 1, 2, 3, 4, 5
_CLASS = np.zeros(256, np.uint8)
_CLASS[[ord("["), ord("{")]] = _OPEN
_CLASS[[ord("]"), ord("}")]] = _CLOSE
_CLASS[ord('"')] = _QUOTE
_CLASS[ord("\n")] = _NEWLINE
_CLASS[ord("\\")] = _BACKSLASH


class NestingScan:
    """Feed a JSON file's bytes in order (``feed``); ``deepest`` is then how deeply it nests,
    ``first`` its first byte that is not whitespace (``b"["`` for a JSON array), and ``lines``
    how many lines it holds (a JSON Lines file's records, blank lines aside: the progress
    bar's count)."""

    def __init__(self) -> None:
        self.deepest = 0
        self.first = b""
        self._newlines = 0
        self._last = b""  # the last byte fed
        self._level = self._low = 0  # bracket level at the end of what was fed, lowest so far
        self._in_string = False  # at the end of what was fed
        self._backslashes = 0  # how many ended it, escaping a quote at the next chunk's start

    def feed(self, chunk: bytes) -> None:
        if not self.first:
            self.first = chunk.removeprefix(b"\xef\xbb\xbf").lstrip()[:1]
        if chunk:
            self._newlines += chunk.count(b"\n")
            self._last = chunk[-1:]
        data = np.frombuffer(chunk, np.uint8)
        at = np.flatnonzero(_CLASS[data])  # only these bytes matter: ~5% of a text corpus
        kind = _CLASS[data[at]]
        quote = self._unescaped_quotes(at, kind)
        newline = kind == _NEWLINE
        # inside a string: an odd count of quotes since the line began (or since this chunk
        # began, counting the string left open by the chunk before)
        quotes = np.cumsum(quote)
        index = np.arange(at.size)
        last_newline = np.maximum.accumulate(np.where(newline, index, -1))
        base = np.where(last_newline >= 0, quotes[np.maximum(last_newline, 0)],
                        -int(self._in_string))
        inside = (quotes - base) % 2 == 1
        step = (kind == _OPEN).astype(np.int64) - (kind == _CLOSE)
        step[inside] = 0
        if at.size:
            levels = np.cumsum(step) + self._level
            floors = np.minimum(np.minimum.accumulate(levels), self._low)
            self.deepest = max(self.deepest, int((levels - floors).max()))
            self._level, self._low = int(levels[-1]), int(floors[-1])
            self._in_string = bool(inside[-1]) and not newline[-1]
        trailing = len(chunk) - len(chunk.rstrip(b"\\"))
        self._backslashes = trailing + (self._backslashes if trailing == len(chunk) else 0)

    @property
    def lines(self) -> int:
        """Lines fed: one ends at each newline, and at the end without one."""
        return self._newlines + (self._last not in (b"", b"\n"))

    def _unescaped_quotes(self, at: np.ndarray, kind: np.ndarray) -> np.ndarray:
        """Which of the bytes at ``at`` are quotes that open or close a string: a quote after
        an odd run of backslashes is escaped."""
        quote = kind == _QUOTE
        quoted = at[quote]
        run = np.zeros(quoted.size, np.int64)  # the backslashes just before each quote
        slashes = at[kind == _BACKSLASH]
        if slashes.size:
            # a run of backslashes starts where their positions stop being consecutive
            starts = np.ones(slashes.size, bool)
            starts[1:] = np.diff(slashes) != 1
            run_start = slashes[np.maximum.accumulate(
                np.where(starts, np.arange(slashes.size), 0))]
            k = np.searchsorted(slashes, quoted - 1).clip(max=slashes.size - 1)
            run = np.where(slashes[k] == quoted - 1, quoted - run_start[k], 0)
        # a run that reaches back to the chunk's first byte goes on in the chunk before
        run += np.where(quoted - run == 0, self._backslashes, 0)
        quote[np.flatnonzero(quote)[run % 2 == 1]] = False
        return quote


def scan_json(path: Path, *, stop_past: int = MAX_DEPTH,
              errors: tuple[type[BaseException], ...] = ()) -> NestingScan:
    """The nesting of a JSON file, compressed or not; the scan stops once it is deeper than
    ``stop_past``, or at one of ``errors`` (a compressed stream cut short: the reader that
    follows names the file and where)."""
    import fsspec

    scan = NestingScan()
    with fsspec.open(str(path), "rb", compression="infer") as f:
        try:
            while scan.deepest <= stop_past and (chunk := f.read(_CHUNK)):
                scan.feed(chunk)
        except errors:
            pass
    return scan
