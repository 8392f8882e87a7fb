"""The TypeScript client's own unit tests (vitest): its wire codec on the shared golden
vectors (docs/vectors/wire.json, the ones the Python codec's tests read), the engine
vectors both engines replay, the multiplexer of profile §7, and the channel layer over an
engine pair in memory. Its types are checked where it is built (``make ts``: ``tsc
--noEmit`` before vite), so a type error stops ``make test`` before pytest starts."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "vectors" / "wire.json"


def test_the_typescript_client_passes_its_unit_tests_and_the_shared_vectors(ts: Path) -> None:
    report = ts / "node_modules" / ".vitest-report.json"
    done = subprocess.run(
        ["node_modules/.bin/vitest", "run", "--reporter=json", f"--outputFile={report}"],
        cwd=ts,
        capture_output=True,
        text=True,
    )
    assert report.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads(report.read_text())
    failed = [
        f"{t['fullName']}: {t['failureMessages'][:1]}"
        for f in results["testResults"]
        for t in f["assertionResults"]
        if t["status"] != "passed"
    ]
    assert done.returncode == 0 and not failed, failed or done.stderr[-4000:]
    # Every golden vector is one test of vectors.test.ts: all were replayed, none left out.
    vectors = json.loads(VECTORS.read_text())
    expected = sum(len(group) for group in vectors.values() if isinstance(group, list))
    replayed = [
        t
        for f in results["testResults"]
        if f["name"].endswith("vectors.test.ts")
        and not f["name"].endswith("engine-vectors.test.ts")
        for t in f["assertionResults"]
    ]
    assert len(replayed) == expected > 90, (len(replayed), expected)
