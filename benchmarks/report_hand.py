"""Hand-written parts of ``docs/benchmarks.md`` that ``run_all`` keeps when it rewrites it.

A part is marked in the report with two HTML comments, ``<!-- hand-written -->`` and
``<!-- /hand-written -->``, each alone on its line. It belongs to the generated section it
sits in (the last ``## `` heading above it outside any such part) and goes back where it was:
right under that heading if nothing but blank lines came between them, else at the section's
end, before the next ``## `` heading. A part whose section is no longer generated goes to the
end of the report, so nothing written by hand is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

START = "<!-- hand-written -->"
END = "<!-- /hand-written -->"


@dataclass
class Part:
    heading: str | None
    top: bool
    lines: list[str]


def parts(old: str) -> list[Part]:
    """The hand-written parts of a report, with where each belongs."""
    found: list[Part] = []
    heading: str | None = None
    since_heading: list[str] = []
    current: list[str] | None = None
    for line in old.splitlines():
        if current is not None:
            current.append(line)
            if line.strip() == END:
                top = all(not s.strip() for s in since_heading)
                found.append(Part(heading, top, current))
                current = None
                since_heading.append("(part)")
            continue
        if line.strip() == START:
            current = [line]
        elif line.startswith("## "):
            heading, since_heading = line, []
        else:
            since_heading.append(line)
    if current is not None:  # an unclosed part: keep it whole
        found.append(Part(heading, False, current))
    return found


def keep(old: str, new: list[str]) -> list[str]:
    """``new`` report lines with the hand-written parts of the ``old`` report put back."""
    out = list(new)
    for part in parts(old):
        block = [*part.lines, ""]
        at = out.index(part.heading) if part.heading in out else None
        if at is None:
            out += ["", *block]
        elif part.top:
            at += 1
            while at < len(out) and not out[at].strip():
                at += 1
            out[at:at] = block
        else:
            nxt = next((i for i in range(at + 1, len(out)) if out[i].startswith("## ")), len(out))
            out[nxt:nxt] = block
    return out
