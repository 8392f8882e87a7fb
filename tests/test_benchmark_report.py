"""``run_all`` rewrites docs/benchmarks.md from results and keeps what was written by hand."""

from __future__ import annotations

from pathlib import Path

from benchmarks import report_hand

S, E = report_hand.START, report_hand.END


def test_hand_written_parts_go_back_where_they_were() -> None:
    old = "\n".join(
        [
            "# Report",
            "## A",
            "",
            S,
            "top of A, by hand",
            E,
            "",
            "old table of A",
            S,
            "end of A, by hand",
            "## B (a whole section by hand)",
            "text",
            E,
            "## C",
            "old C",
            S,
            "note on a section no longer generated",
            E,
        ]
    )
    new = ["# Report", "## A", "", "new table of A", "", "## D", "new D"]
    got = report_hand.keep(old, new)
    text = "\n".join(got)
    assert text.index("top of A") < text.index("new table of A") < text.index("end of A")
    assert text.index("## B (a whole") < text.index("## D")
    assert text.index("note on a section") > text.index("new D")  # kept, at the end
    assert "old table of A" not in text and "old C" not in text
    # keeping twice changes nothing more (but blank lines)
    again = report_hand.keep(text, new)
    assert [x for x in again if x.strip()] == [x for x in got if x.strip()]


def test_the_report_marks_its_hand_written_parts() -> None:
    report = (Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md").read_text()
    found = report_hand.parts(report)
    assert len(found) >= 4 and all(p.lines[-1].strip() == E for p in found)
