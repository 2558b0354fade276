"""Record schemas: which fields make which example, and the errors for everything else."""

from __future__ import annotations

import pytest

from ndp.convert.records import ALPACA_PROMPT, ALPACA_PROMPT_WITH_INPUT, to_example
from ndp.errors import RecordError


def render(messages, add_generation_prompt):
    text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
    return text + ("<assistant>" if add_generation_prompt else "")


def test_text_is_all_target():
    ex = to_example({"text": "hello", "id": 3}, "f:1")
    assert ex.text == "hello" and ex.targets == ((0, 5),) and not ex.masked


def test_prompt_completion_masks_the_prompt():
    ex = to_example({"prompt": "Q: 1+1?", "completion": " 2"}, "f:1")
    assert ex.text == "Q: 1+1? 2"
    assert ex.targets == ((7, 9),) and ex.masked


@pytest.mark.parametrize("extra", ["", "some input"])
def test_alpaca_template(extra):
    rec = {"instruction": "Add.", "output": "Done."}
    if extra:
        rec["input"] = extra
    ex = to_example(rec, "f:1")
    template = ALPACA_PROMPT_WITH_INPUT if extra else ALPACA_PROMPT
    prompt = template.format(instruction="Add.", input=extra)
    assert ex.text == prompt + "Done."
    assert ex.targets == ((len(prompt), len(prompt) + 5),)


def test_chat_targets_are_the_rendered_assistant_turns():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "and?"}, {"role": "assistant", "content": "done"}]
    ex = to_example({"messages": msgs}, "f:1", render_chat=render)
    spans = [ex.text[lo:hi] for lo, hi in ex.targets]
    assert spans == ["yo</>", "done</>"]


@pytest.mark.parametrize(
    ("record", "kind", "words"),
    [
        ({"prompt": "x"}, "no_schema", "match no single schema"),
        ({"text": "x", "prompt": "p", "completion": "c"}, "no_schema", "match no single schema"),
        ({"content": "x", "url": "u"}, "no_schema", "(ignored: content, url)"),
        ({"text": 5}, "bad_record", "must be a string"),
        ({"text": ""}, "empty", "is empty"),
        ([1, 2], "bad_record", "JSON object"),
        ({"messages": [{"role": "user", "content": "q"}]}, "empty", "no assistant message"),
        ({"messages": [{"role": "robot", "content": "q"}]}, "bad_record", "role 'robot'"),
        ({"messages": []}, "bad_record", "non-empty list"),
    ],
)
def test_bad_records_name_the_place_and_problem(record, kind, words):
    with pytest.raises(RecordError) as info:
        to_example(record, "data.jsonl:7", render_chat=render)
    assert info.value.kind == kind
    assert str(info.value).startswith("data.jsonl:7: ") and words in str(info.value)


def test_chat_without_template_is_an_error():
    with pytest.raises(RecordError, match="no chat template"):
        to_example({"messages": [{"role": "assistant", "content": "a"}]}, "f:1")


def test_chat_template_that_is_not_prefix_stable_is_refused():
    def unstable(messages, add_generation_prompt):
        return f"[{len(messages)}]" + render(messages, add_generation_prompt)

    with pytest.raises(RecordError) as info:
        to_example({"messages": [{"role": "user", "content": "q"},
                                 {"role": "assistant", "content": "a"}]}, "f:1",
                   render_chat=unstable)
    assert info.value.kind == "template"


def test_columns_no_schema_reads_are_ignored_unless_strict():
    """FineWeb-style rows: text plus id, dump, url, ... columns."""
    row = {"text": "doc", "id": "<urn>", "dump": "CC-MAIN", "url": "http://x", "score": 3.1}
    assert to_example(row, "f:1").text == "doc"
    with pytest.raises(RecordError) as info:
        to_example(row, "f:1", strict=True)
    assert info.value.kind == "unknown_field" and "'dump'" in str(info.value)


def test_named_columns_play_the_schema_fields():
    ex = to_example({"content": "body", "text": "a summary"}, "f:1", fields={"text": "content"})
    assert ex.text == "body"  # the named column, not the one called text
    ex = to_example({"question": "Q?", "answer": " A"}, "f:1",
                    fields={"prompt": "question", "completion": "answer"})
    assert ex.text == "Q? A" and ex.targets == ((2, 4),)
    with pytest.raises(RecordError) as info:
        to_example({"body": "x"}, "f:9", fields={"text": "content"})
    assert info.value.kind == "missing_field" and "'content'" in str(info.value)
