"""The embedded default job, on a slice of the standard library."""

from __future__ import annotations

from ndp.demo import run_demo, sft_pairs


def test_sft_pairs_split_docstring_from_body():
    src = 'def f(a):\n    """Add one."""\n    return a + 1\n\ndef g():\n    pass\n'
    assert sft_pairs(src) == [{"prompt": 'def f(a):\n    """Add one."""\n',
                               "completion": "    return a + 1\n"}]


def test_demo_runs_end_to_end(tmp_path):
    lines = []
    report = run_demo(tmp_path, max_files=12, vocab_size=600, progress=False, say=lines.append)
    assert report.files == 12
    assert report.roundtrip_packets == sum(s["packets"] for s in report.convert.values())
    assert report.convert["sft"]["examples"] > 0 and report.convert["code"]["tokens"] > 0
    assert report.decode["padded"]["tokens"] == report.convert["sft"]["tokens"]
    assert report.decode["packed"]["tokens"] > 0
    assert any("round trip OK" in line for line in lines)
    assert (tmp_path / "tokenizer" / "tokenizer.json").exists()
    # it ends saying where it wrote how much, and what to do next
    assert lines[-1].startswith("done: ") and f"under {tmp_path.resolve()}" in lines[-1]
    assert "ndp inspect" in lines[-1] and "ndp.Loader(" in lines[-1]
