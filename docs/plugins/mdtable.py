"""A Markdown table (``table``), for every page the docs' plugins write. Standard library only."""

from __future__ import annotations


def table(headers: list[str], rows: list[list[str]], *, numbers: bool = True) -> str:
    """A Markdown table; the first column left-aligned, the others right-aligned (figures) or,
    with ``numbers=False``, left-aligned too."""
    rule = ":---" if not numbers else "---:"
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join([":---"] + [rule] * (len(headers) - 1)) + "|"]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)
