"""Progress bars for long work (tqdm on stderr), or a silent stand-in when disabled."""

from __future__ import annotations

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


def progress_bar(*, total: int | None, desc: str, enabled: bool = True, **kwargs: Any) -> Any:
    """A tqdm bar (context manager with ``update``), or one that prints nothing."""
    if not enabled:
        return _Silent()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, dynamic_ncols=True, **kwargs)
