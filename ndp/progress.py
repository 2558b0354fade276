"""Progress bars for long work (tqdm on stderr), or a silent stand-in when disabled.

tqdm draws a bar as soon as it is made, so make one in the ``with`` that uses it, after any
step that may fail: a bar made and then abandoned by an error stays on the terminal line, and
the error message is printed after it on that same line.
"""

from __future__ import annotations

import functools
from typing import Any


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@functools.cache
def _bar_type() -> type:
    from tqdm.auto import tqdm

    class Bar(tqdm):
        """A tqdm bar whose context, left by an error, clears the bar from the terminal (the
        error message comes next, on a clean line); left normally, or by a loop's ``break``
        (``GeneratorExit``), it stays as tqdm leaves it."""

        def __exit__(self, exc_type, exc, tb):
            if exc_type is not None and issubclass(exc_type, Exception):
                self.leave = False
            return super().__exit__(exc_type, exc, tb)

    return Bar


def progress_bar(*, total: int | None, desc: str, enabled: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar (context manager with ``update``), or one that prints nothing."""
    if not enabled:
        return _Silent()
    return _bar_type()(total=total, desc=desc, dynamic_ncols=True, **kwargs)
