"""Input records: which schema a record follows, and the text it becomes.

Every record becomes one ``Example``: a text plus the character spans of it that are training
targets. Tokenizing the whole text once (with offsets) keeps the tokens exactly the tokenizer's
output for that text; a token is a target when its first character lies in a target span.

Schemas (one per record; any other field, such as a dataset's ``id``, ``url`` or ``dump``
columns, is ignored, or refused with ``strict``):

* ``{"text": str}``: pretraining text, every token a target.
* ``{"messages": [{"role": ..., "content": str}, ...]}``: a chat, rendered by the tokenizer's
  chat template; the assistant messages (as rendered) are targets, everything else is masked.
* ``{"prompt": str, "completion": str}``: the prompt is masked, the completion is the target.
* ``{"instruction": str, "input": str (optional), "output": str}``: rendered with the Alpaca
  template (``ALPACA_PROMPT``); the output is the target.

``fields`` names the columns that play a schema's fields when a dataset calls them otherwise,
e.g. ``{"text": "content"}``: that column is read as the text, and a column of the schema's own
name is then ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ndp.errors import RecordError

METADATA_FIELDS = frozenset({"id", "meta", "metadata", "source"})
SCHEMAS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    # name: (required fields, optional fields)
    "text": (frozenset({"text"}), frozenset()),
    "chat": (frozenset({"messages"}), frozenset()),
    "prompt": (frozenset({"prompt", "completion"}), frozenset()),
    "alpaca": (frozenset({"instruction", "output"}), frozenset({"input"})),
}
KNOWN_FIELDS = frozenset().union(*(req | opt for req, opt in SCHEMAS.values())) | METADATA_FIELDS
CHAT_ROLES = frozenset({"system", "user", "assistant", "tool"})

ALPACA_PROMPT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
ALPACA_PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further "
    "context. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)

#: renders a chat: (messages, add_generation_prompt) -> text
ChatRenderer = Callable[[list[dict[str, str]], bool], str]


@dataclass(frozen=True)
class Example:
    """One record ready to tokenize: ``text`` and its target character spans [start, end), and
    the schema it was read by (a key of ``SCHEMAS``: the overflow rule depends on it)."""

    where: str
    text: str
    targets: tuple[tuple[int, int], ...]
    schema: str

    @property
    def masked(self) -> bool:
        """Whether some of the text is excluded from the loss."""
        return self.targets != ((0, len(self.text)),)


def _string(record: dict[str, Any], key: str, where: str, *, allow_empty: bool = False) -> str:
    value = record[key]
    if not isinstance(value, str):
        raise RecordError(where, f"field {key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value:
        raise RecordError(where, f"field {key!r} is empty", kind="empty")
    return value


def schema_of(record: dict[str, Any], where: str, *, strict: bool = False) -> str:
    """The schema a record follows (fields that are no schema's are ignored, or refused with
    ``strict``); ``RecordError`` naming the offending field if none fits."""
    present = {k for k, v in record.items() if v is not None}
    unknown = sorted(present - KNOWN_FIELDS)
    present -= set(unknown)
    if unknown and strict:
        raise RecordError(
            where,
            f"unknown field {unknown[0]!r}; records take one of: "
            + "; ".join("+".join(sorted(req)) for req, _ in SCHEMAS.values())
            + f" (and optionally {', '.join(sorted(METADATA_FIELDS))})",
            kind="unknown_field",
        )
    fields = present - METADATA_FIELDS
    matches = [name for name, (req, opt) in SCHEMAS.items() if req <= fields <= req | opt]
    if len(matches) != 1:
        others = f" (ignored: {', '.join(unknown)})" if unknown else ""
        raise RecordError(
            where,
            f"fields {sorted(fields)}{others} match no single schema; expected exactly one of: "
            + "; ".join("+".join(sorted(req)) for req, _ in SCHEMAS.values())
            + "; name the columns that hold them with --text-field, --messages-field, "
            "--prompt-field, --completion-field",
            kind="no_schema",
        )
    return matches[0]


def rename_fields(record: dict[str, Any], fields: dict[str, str], where: str) -> dict[str, Any]:
    """``record`` with each column ``fields[f]`` read as schema field ``f`` (see the module
    docstring); ``RecordError`` if a named column is missing."""
    out = dict(record)
    for field, column in fields.items():
        if column not in record:
            raise RecordError(where, f"no column {column!r} (named for {field!r}); the record "
                              f"has {sorted(record)}", kind="missing_field")
        out.pop(field, None)
        out[field] = out.pop(column)
    return out


def _chat_example(
    messages: Any, where: str, render: ChatRenderer | None
) -> Example:
    if render is None:
        raise RecordError(where, "chat record, but the tokenizer has no chat template")
    if not isinstance(messages, list) or not messages:
        raise RecordError(where, "field 'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise RecordError(where, f"messages[{i}] must be an object with a string 'content'")
        if m.get("role") not in CHAT_ROLES:
            raise RecordError(
                where, f"messages[{i}] has role {m.get('role')!r}; allowed: {sorted(CHAT_ROLES)}"
            )
    if not any(m["role"] == "assistant" for m in messages):
        raise RecordError(where, "chat has no assistant message: nothing to train on", kind="empty")
    try:
        full = render(messages, False)
        targets = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = render(messages[:i], True)
            upto = render(messages[: i + 1], False)
            if not (full.startswith(upto) and upto.startswith(before)):
                raise RecordError(
                    where,
                    "the chat template does not render conversations prefix by prefix, so the "
                    "assistant turns cannot be located; use prompt/completion records instead",
                    kind="template",
                )
            targets.append((len(before), len(upto)))
    except RecordError:
        raise
    except Exception as err:  # jinja errors, template-raised exceptions
        raise RecordError(where, f"chat template failed: {err}", kind="template") from None
    return Example(where, full, tuple(targets), "chat")


def to_example(record: Any, where: str, *, render_chat: ChatRenderer | None = None,
               fields: dict[str, str] | None = None, strict: bool = False) -> Example:
    """Turn one parsed record into an ``Example`` (``fields``: columns renamed to schema
    fields; ``strict``: refuse fields no schema has); ``RecordError`` if it is malformed."""
    if not isinstance(record, dict):
        raise RecordError(where, f"a record must be a JSON object, got {type(record).__name__}")
    if fields:
        record = rename_fields(record, fields, where)
    schema = schema_of(record, where, strict=strict)
    if schema == "text":
        text = _string(record, "text", where)
        return Example(where, text, ((0, len(text)),), "text")
    if schema == "chat":
        return _chat_example(record["messages"], where, render_chat)
    if schema == "prompt":
        prompt = _string(record, "prompt", where, allow_empty=True)
        completion = _string(record, "completion", where)
    else:
        instruction = _string(record, "instruction", where)
        extra = _string(record, "input", where, allow_empty=True) if record.get("input") else ""
        template = ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT
        prompt = template.format(instruction=instruction, input=extra)
        completion = _string(record, "output", where)
    span = ((len(prompt), len(prompt) + len(completion)),)
    return Example(where, prompt + completion, span, schema)
