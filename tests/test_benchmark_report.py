"""``run_all`` rewrites docs/benchmarks.md from results and keeps what was written by hand."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import report_hand, report_runs

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


REPORT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
VERDICT = re.compile(
    r"\*\*(met|behind|missed)\*\*|\|\s*(met|behind|missed)\s*\||[(:]\s*(met|behind|missed)\b"
)
WHEN = re.compile(r"\b(20\d\d-\d\d-\d\d)(?:,? (\d\d:\d\d))?")
LOAD = re.compile(r"\bload(?: average)? (\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")


def _when(text: str) -> tuple[str, str] | None:
    """The latest date (and time, if given) that ``text`` names."""
    found = [(m.group(1), m.group(2) or "") for m in WHEN.finditer(text)]
    return max(found) if found else None


def _newer(record: tuple[str, str], shown: tuple[str, str] | None) -> bool:
    if shown is None:
        return True
    if record[1] and shown[1]:
        return record > shown
    return record[0] > shown[0]


def _quiet_runs_shown(report: str) -> dict[str, tuple[str, str]]:
    """Each benchmark section whose run is quiet (heading without "Loaded run: ") -> when."""
    runs, heading = {}, None
    for line in report.splitlines():
        if line.startswith("## "):
            heading = line.removeprefix("## ").removeprefix("Loaded run: ")
        elif line.startswith("Run: ") and heading and "(quiet)" in line:
            when = _when(line)
            if when:
                runs[heading] = when
    return runs


def test_hand_written_parts_never_contradict_the_summary() -> None:
    """The summary (generated from each benchmark's most recent quiet run) is the one source
    of the project's figures. So a hand-written part may state a verdict only beside a run it
    names (its date and load); none sits in the summary; and no paragraph records a quiet run
    (every load it names within ``QUIET_LOAD``) of a benchmark newer than the one the summary
    shows: the summary would not be the most recent quiet run (store that run, and
    ``run_all`` puts it in the summary)."""
    report = REPORT.read_text()
    shown = _quiet_runs_shown(report)
    problems = []
    for part in report_hand.parts(report):
        text = "\n".join(part.lines)
        heading = (part.heading or "").removeprefix("## ").removeprefix("Loaded run: ")
        says = [m.group() for m in VERDICT.finditer(text)]
        if says and heading.startswith("Summary"):
            problems.append(f"a hand-written part in the summary states verdicts {says}")
        if says and not (_when(text) and LOAD.search(text)):
            problems.append(
                f"under {heading!r}: verdicts {says[:3]} without the run's date and load"
            )
        for paragraph in text.split("\n\n"):
            when = _when(paragraph)
            loads = [float(x) for m in LOAD.finditer(paragraph) for x in m.groups() if x]
            quiet = bool(loads) and max(loads) <= report_runs.QUIET_LOAD
            if quiet and when and _newer(when, shown.get(heading)):
                problems.append(
                    f"under {heading!r}: a quiet run of {' '.join(when)} newer than the "
                    f"summary's ({' '.join(shown.get(heading, ('none',)))}): {paragraph[:160]!r}"
                )
    assert not problems, "\n".join(problems)


def test_a_loaded_run_never_replaces_the_quiet_one_in_the_summary(tmp_path: Path) -> None:
    from benchmarks import run_all

    def service_run(best: float, load: float) -> dict[str, object]:
        run = {"started": f"2026-11-2{int(load)} 10:00 UTC", "load_start": load, "load_end": load}
        return {"runs": {}, "best_vs_flight": best, "run": run}

    report_runs.store(tmp_path, "service", service_run(0.91, 1.2))
    report_runs.store(tmp_path, "service", service_run(0.42, 9.5))  # later, on a busy machine
    quiet, other = report_runs.stored(tmp_path, ["service"])
    summary = "\n".join(run_all.summary(quiet, other))
    assert "| 0.91x | >= 0.80x | met | 2026-11-21 10:00 UTC, load 1.2 |" in summary
    assert "0.42x" not in summary
    loaded = "\n".join(run_all.loaded(other))
    assert "| 0.42x | >= 0.80x | **behind** | 2026-11-29 10:00 UTC, load 9.5 |" in loaded
    report_runs.store(tmp_path, "service", service_run(0.95, 2.5))  # a newer quiet run
    quiet, other = report_runs.stored(tmp_path, ["service"])
    assert quiet["service"]["best_vs_flight"] == 0.95 and not other
