"""Loading a Hugging Face tokenizer without touching the network, and tokenizing examples.

``transformers`` is imported only here, and only when a tokenizer is loaded.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ndp.convert.records import Example
from ndp.errors import TokenizerError


def is_path_like(name: str) -> bool:
    """Whether ``name`` means a local directory rather than a Hugging Face name (``gpt2``,
    ``org/model``): it starts with ``.``, ``/`` or ``~``, has a separator other than a repo id's
    one ``/``, or names a path that exists (its first part, for ``dir/tok``)."""
    if name.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(name)):
        return True
    seps = [s for s in (os.sep, os.altsep) if s and s != "/"]  # "\\" on Windows
    parts = name.split("/")
    return any(s in name for s in seps) or len(parts) > 2 or os.path.isdir(parts[0])


def transformers_name(name: str) -> Any:
    """``transformers.<name>``, imported without its advice that PyTorch was not found: the
    converter needs tokenizers only, and an install without torch (``[tokenize]``) is meant."""
    if "transformers" not in sys.modules:
        before = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
        try:
            import transformers  # noqa: F401 - its import is what says it
        finally:
            if before is None:
                del os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"]
            else:
                os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = before
    return getattr(sys.modules["transformers"], name)


def load_tokenizer(name_or_path: str) -> Any:
    """A fast tokenizer from a local directory or the local Hugging Face cache; never downloads.
    A path (``is_path_like``) that is not a directory is a ``TokenizerError`` naming it."""
    if is_path_like(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.is_dir():
            found = "a file, not a directory" if path.exists() else "nothing there"
            raise TokenizerError(
                f"no such tokenizer directory: {name_or_path} ({path.absolute()}: {found}). "
                "Pass the directory that holds the tokenizer (tokenizer.json), or the name of "
                "one in the local Hugging Face cache (HF_HOME); ndp never downloads.")
        name_or_path = str(path)
    try:
        AutoTokenizer = transformers_name("AutoTokenizer")
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise TokenizerError("the converter needs transformers: "
                             "pip install 'neural-datagram[tokenize]'") from err
    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception as err:
        raise TokenizerError(
            f"cannot load tokenizer {name_or_path!r} from local files ({type(err).__name__}: "
            f"{err}). ndp never downloads: pass a tokenizer directory, or a name already in the "
            "Hugging Face cache (HF_HOME)."
        ) from None
    if not getattr(tok, "is_fast", False):
        raise TokenizerError(
            f"{name_or_path!r} loaded a slow (Python) tokenizer; ndp needs a fast one "
            "(tokenizer.json) for character offsets and batched parallel encoding"
        )
    return tok


@dataclass(frozen=True)
class TokenizerInfo:
    """What the converter needs to know about a tokenizer."""

    name: str
    vocab_size: int
    eos_token_id: int
    pad_token_id: int | None
    has_chat_template: bool
    #: a digest of the vocabulary (``vocabulary_fingerprint``): what tells two tokenizers
    #: apart whatever their names (a path, a hub name), so that datasets made with different
    #: ones are not mixed (``ndp.store.manifest_fields.check_tokenizers``)
    fingerprint: str | None = None


def tokenizer_info(tok: Any, name: str, *, eos_token_id: int | None = None) -> TokenizerInfo:
    """Facts about ``tok``; ``TokenizerError`` if it has no EOS token and none was given."""
    eos = tok.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise TokenizerError(
            f"tokenizer {name!r} has no EOS token; pass its id as `eos_token_id` (ndp appends "
            "EOS to every document)"
        )
    return TokenizerInfo(
        name=name,
        vocab_size=len(tok),
        eos_token_id=int(eos),
        pad_token_id=tok.pad_token_id,
        has_chat_template=bool(getattr(tok, "chat_template", None)),
        fingerprint=vocabulary_fingerprint(tok),
    )


def vocabulary_fingerprint(tok: Any) -> str:
    """The first 16 hex digits of a sha256 over ``tok``'s vocabulary (every token string and
    its id, added tokens included, in id order): equal for one tokenizer wherever it is
    loaded from, different once an id means another token (~0.1 s for 150K tokens)."""
    import hashlib
    import json

    vocab = sorted(tok.get_vocab().items(), key=lambda item: (item[1], item[0]))
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def chat_renderer(tok: Any):
    """A (messages, add_generation_prompt) -> text function, or None without a chat template."""
    if not getattr(tok, "chat_template", None):
        return None

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    return render


#: who owns a token that straddles a prompt/answer boundary (``tokenize_examples``)
STRADDLE = ("prompt", "answer")


def tokenize_examples(
    tok: Any, examples: list[Example], eos_token_id: int, *, straddle: str = "prompt"
) -> list[tuple[np.ndarray, np.ndarray | None, int]]:
    """(token ids, target mask or None, tokens straddling a boundary) per example, EOS
    appended and counted as a target.

    A token is a target when its first character lies in a target span (an answer); a token
    the tokenizer merged across a span's edge (a prompt's last characters with an answer's
    first, often the answer's leading space or newline) then belongs to the side it starts on,
    so an answer's first characters are never trained when they share a token with the
    prompt. ``straddle="answer"`` makes every token with a character in a span a target
    instead. Either way such tokens are counted.

    One batched call: the Rust tokenizer encodes the batch on every core. Special tokens are
    not added (ndp appends EOS itself), so ids equal ``tok(text, add_special_tokens=False)``.
    """
    if not examples:
        return []
    enc = tok(
        [e.text for e in examples],
        add_special_tokens=False,
        return_offsets_mapping=any(e.masked for e in examples),
        return_attention_mask=False,
    )
    out = []
    for i, example in enumerate(examples):
        ids = np.empty(len(enc["input_ids"][i]) + 1, dtype=np.int64)
        ids[:-1] = enc["input_ids"][i]
        ids[-1] = eos_token_id
        if not example.masked:
            out.append((ids, None, 0))
            continue
        offsets = np.array(enc["offset_mapping"][i], dtype=np.int64).reshape(-1, 2)
        starts, ends = offsets[:, 0], offsets[:, 1]
        mask = np.zeros(ids.shape[0], dtype=bool)
        across = np.zeros(starts.shape[0], dtype=bool)
        for lo, hi in example.targets:
            across |= ((starts < lo) & (ends > lo)) | ((starts < hi) & (ends > hi))
            mask[:-1] |= ((ends > lo) & (starts < hi) if straddle == "answer"
                          else (starts >= lo) & (starts < hi))
        mask[-1] = True
        out.append((ids, mask, int(across.sum())))
    return out
