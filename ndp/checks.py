"""One type check for every option and recorded field: the values a user passes (``Loader``,
``NDPDataset``) and those a file records (a manifest's fields, ``ndp.store.manifest``) are
checked here before anything uses them, so a mistake is a named error that says which option,
what was given and what it may be, never a ``TypeError`` or a NaN deep in the first batch.

Each function returns the value as the type the callers use (an ``int``, a ``float``), and
raises ``error`` (``ConfigError`` by default; a manifest's fields pass ``ManifestError``). A
``bool`` is never taken for a number (``True`` is an ``int`` to Python, not to a user), a float
is never taken for an integer (``rank=1.0``), and a string is never parsed (``"0.1"``): a
value of the wrong type is a mistake to say, not to guess at.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

from ndp.errors import ConfigError

#: the largest token id an int32 output holds: ids, pad ids and vocabulary sizes stay below
INT32_END = 1 << 31


def integer(name: str, value: Any, *, least: int | None = None, most: int | None = None,
            none: bool = False, error: type[Exception] = ConfigError) -> int | None:
    """``value`` as an ``int`` in ``[least, most]`` (``None`` allowed if ``none``)."""
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be an integer{' or None' if none else ''}, got "
                    f"{_shown(value)}")
    value = int(value)
    if (least is not None and value < least) or (most is not None and value > most):
        raise error(f"{name} must be {_range(least, most)}, got {value:,}")
    return value


def real(name: str, value: Any, *, least: float, below: float | None = None,
         most: float | None = None, error: type[Exception] = ConfigError) -> float:
    """``value`` as a finite ``float`` with ``least <= value`` and ``value < below`` (or
    ``<= most``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a number, got {_shown(value)}")
    value = float(value)
    if not math.isfinite(value) or value < least or (below is not None and value >= below) \
            or (most is not None and value > most):
        upper = f" and < {below:g}" if below is not None else (
            f" and <= {most:g}" if most is not None else "")
        raise error(f"{name} must be a finite number >= {least:g}{upper}, got {value!r}")
    return value


def choice(name: str, value: Any, allowed: Iterable[Any], *,
           error: type[Exception] = ConfigError) -> Any:
    """``value`` if it is one of ``allowed``."""
    allowed = tuple(allowed)
    if any(type(value) is type(a) and value == a for a in allowed):  # type first: 1 != True
        return value
    raise error(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, got "
                f"{_shown(value)}")


def flag(name: str, value: Any, *, error: type[Exception] = ConfigError) -> bool:
    """``value`` if it is a ``bool``."""
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} must be True or False, got {_shown(value)}")
    return bool(value)


def text(name: str, value: Any, *, none: bool = False,
         error: type[Exception] = ConfigError) -> str | None:
    """``value`` if it is a string (or ``None`` if ``none``)."""
    if (value is None and none) or isinstance(value, str):
        return value
    raise error(f"{name} must be a string{' or None' if none else ''}, got {_shown(value)}")


def _range(least: int | None, most: int | None) -> str:
    if least is not None and most is not None:
        return f"in [{least:,}, {most:,}]"
    return f">= {least:,}" if least is not None else f"<= {most:,}"


def _shown(value: Any) -> str:
    """``value`` for a message: its repr (cut short) and its type where the repr hides it
    (``'0.1'`` is a str, ``1.0`` a float)."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{shown} ({type(value).__name__})"
