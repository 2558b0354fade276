"""Named exceptions. Each message says what was expected, what was found, and what to do.

A message names a Python API parameter in single backticks, alone or with the value to pass
(`max_skipped`, `overwrite=True`, `version=2`): the command line shows the option that sets it
instead (``--max-skipped``, ``--overwrite``, ``--version 2``: ``ndp.cli.main.OPTIONS``).

A keyword renamed keeps its old name for a while through ``renamed`` (below): the old name warns,
both at once are a ``ConfigError``. Its wrapper is one more frame between the user and the
function: a warning raised beneath it counts its ``stacklevel`` with ``past_aliases`` (below).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class NDPError(Exception):
    """Base class of every error ndp raises on purpose."""


class PacketError(NDPError, ValueError):
    """A packet cannot be encoded or decoded (bad field value, length, CRC)."""


class ShardFormatError(NDPError):
    """A shard's header is damaged, the file is not an NDP shard, or it holds no valid
    packet."""


class UnsupportedVersionError(ShardFormatError):
    """The shard (or index) was written by a newer format version than this ndp reads."""


class ShardChangedError(NDPError, OSError):
    """A shard was cut, replaced or deleted while ndp read it (``ndp.store.files``): the message
    names the file, what was asked of it and what it is now."""


class IndexMismatchError(NDPError):
    """A sidecar index does not describe its shard (stale, damaged or for another file)."""


class CountCacheError(NDPError):
    """A batch count cached for a dataset (``ndp.loader.planning.shared_count``) was made from other
    index entries than the dataset's indexes hold now: the count file is removed, and the
    message says to start again (the epoch is counted afresh)."""


class DataError(NDPError):
    """The data cannot give what was asked of it (for example, too few valid packets left for
    the batches every rank must deliver); the message names the data and what to check."""


class ConvertError(DataError):
    """A conversion that would write nothing, or skip more of its records than allowed; nothing
    is committed (the output is left as it was) and the message says what to change."""


class RecordError(NDPError, ValueError):
    """An input record cannot be converted.

    ``where`` is ``file:line`` (or ``file:row N``); ``kind`` is the short reason the converter
    counts skipped records under (``bad_json``, ``unknown_field``, ``bad_record``, ...).
    """

    def __init__(self, where: str, problem: str, *, kind: str = "bad_record") -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem
        self.kind = kind


class TokenizerError(NDPError):
    """The tokenizer cannot be loaded or lacks what conversion needs (such as an EOS token)."""


class ConfigError(NDPError, ValueError):
    """An option has a value that cannot work; the message names the allowed range."""


class ManifestError(ConfigError):
    """A directory of shards is not the whole dataset its manifest ``ndp.json`` lists (no
    manifest, a listed shard missing or of another size, a shard it does not list): see
    ``ndp.store.manifest``."""


class LoaderStateError(ConfigError):
    """A resume state (``Loader.load_state_dict``) does not belong to this loader: another
    dataset or configuration, or positions outside the epoch it names."""


class LoaderUsageError(NDPError, RuntimeError):
    """A ``Loader`` used in a way it cannot serve: iterated by two loops at once, or used after
    ``close()``."""


class StepError(LoaderUsageError):
    """A step no batch of the run has (``Loader.explain``, skip ranges): past the run's end or
    its epoch, or before the epoch the run resumed in."""


class TokenFileError(NDPError):
    """A token file (llm.c, llm.q or raw uint16) is malformed or not what its format says.

    ``path`` is the file; the message says what was expected, what was found and what to do.
    """

    def __init__(self, path: object, expected: str, found: str, hint: str) -> None:
        super().__init__(f"{path}: expected {expected}, found {found}. {hint}")
        self.path = str(path)
        self.expected = expected
        self.found = found
        self.hint = hint


class RemoteError(NDPError, OSError):
    """Object storage refused or failed a request for good (an object missing, access denied,
    an object that is not what the dataset's manifest says, or transient errors past the
    retries): the message names the URL and what to do (``ndp.store.remote``)."""


class CacheFullError(ConfigError):
    """The shard cache (``cache_dir``/``cache_limit``, ``ndp.store.cache``) cannot hold the shards
    the loaders using it need at once: the message names the limit and the size needed."""


class InputError(ConvertError):
    """An input file cannot be read as what its name says it is (a compressed stream cut short,
    a Parquet or Arrow file cut or empty, a CSV row the reader refuses, a JSON array that does
    not parse): the message names the file, where reading stopped, and what to do. A damaged
    JSON Lines file is no such error: each bad line is a skipped ``RecordError``
    (``ndp.convert.datafiles``)."""


def renamed(**old_to_new: str) -> Callable[[F], F]:
    """Decorator: keyword ``old`` still works as the deprecated name of parameter ``new``.

    ``@renamed(max_seq_length="seq_len")``: a call passing ``max_seq_length=`` gets a
    ``DeprecationWarning`` that names ``seq_len``, at the caller's line, and the result of
    passing ``seq_len=`` itself; passing both (by keyword, or ``seq_len`` by position) is a
    ``ConfigError``. The signature shown (``help``, ``inspect``) is the function's own, with
    the new name only. Costs about 0.3 us a call (one more Python frame).
    """

    def wrap(func: F) -> F:
        name = func.__qualname__.removesuffix(".__init__")  # NDPDataset, not NDPDataset.__init__
        params = inspect.signature(func).parameters
        # the index of each new name among the positional arguments (None: keyword-only)
        position = {new: None if params[new].kind is inspect.Parameter.KEYWORD_ONLY
                    else list(params).index(new) for new in old_to_new.values()}

        @functools.wraps(func)
        def call(*args, **kwargs):
            for old, new in old_to_new.items():
                if old not in kwargs:
                    continue
                at = position[new]
                if new in kwargs or (at is not None and len(args) > at):
                    raise ConfigError(f"{name}: got `{new}` and `{old}`, its old name; "
                                      f"pass `{new}` only")
                warnings.warn(f"{name}: `{old}` is deprecated, pass `{new}` (the same value)",
                              DeprecationWarning, stacklevel=2)
                kwargs[new] = kwargs.pop(old)
            return func(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


#: the code of every wrapper ``renamed`` makes (its closures share one code object)
_WRAPPER_CODE = renamed(old="new")(lambda new: new).__code__


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_level() -> int:
    """``stacklevel`` for a ``warnings.warn`` in the calling function that names the first
    frame outside ndp (the user's line), however deep in ndp the warning is raised."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level


def past_aliases(level: int) -> int:
    """``stacklevel`` for a ``warnings.warn`` in the calling function: ``level`` frames up, not
    counting the wrappers of ``renamed`` on the way, so that a warning meant for the user's
    line (a ``Corpus`` made by ``NDPDataset(...)``) stays there."""
    frame, found = sys._getframe(1), 1
    for _ in range(level - 1):
        if frame is None:
            break
        frame, found = frame.f_back, found + 1
        while frame is not None and frame.f_code is _WRAPPER_CODE:
            frame, found = frame.f_back, found + 1
    return found


class ItemIndexError(NDPError, IndexError):
    """An index outside a map-style dataset (``ndp.adapters.dataset.NDPDataset``): still an
    ``IndexError``, so iteration stops at the end as a sequence's does; the message says when
    the index belongs to another epoch (``set_epoch`` after a sampler was made)."""
