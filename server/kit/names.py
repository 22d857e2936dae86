"""What a node name may hold: visible characters only (design §3.6, §8).

A name is shown on pages, in CSV cells, in log lines and in the audit's sentences; a
newline, a bidi override or a zero-width character there lets one node's name read as
another's ("gpu-x\\nnode-b"). So a name refuses every code point that draws nothing or
moves the text: controls (Cc), format characters (Cf: zero-width joiners, bidi marks),
surrogates, private-use and unassigned code points, line and paragraph separators, and
every space but U+0020.
"""

from __future__ import annotations

import unicodedata

_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"})


def invisible_code_points(text: str) -> list[str]:
    """Each refused code point of ``text`` once, in order, as ``U+000A (LINE FEED)``."""
    found: dict[str, None] = {}
    for char in text:
        if char == " " or unicodedata.category(char) not in _REFUSED_CATEGORIES:
            continue
        name = unicodedata.name(char, "") or {"\n": "LINE FEED", "\r": "CARRIAGE RETURN",
                                                "\t": "CHARACTER TABULATION"}.get(char, "")
        found.setdefault(f"U+{ord(char):04X}" + (f" ({name})" if name else ""))
    return list(found)


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot be a node name (or a pattern of names), or None."""
    refused = invisible_code_points(text)
    if not refused:
        return None
    return ("holds invisible or control characters, which would let it read as another "
            f"name: {', '.join(refused)}")
