"""``benchmarks.tools.suite_time``, the instrument of #65 item 5: it runs pytest with itself as a plugin, records
each test's wall and CPU time and outcome, and summarises them with the floor the CPU work sets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.tools.suite_time import ROOT, main

TESTS = '''
import time

import pytest


def test_sleeps():
    time.sleep(0.3)


def test_spins():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass


def test_fails():
    assert False


@pytest.mark.skip(reason="skipped on purpose")
def test_skipped():
    pass
'''


def test_a_run_records_each_test_and_prints_the_floor(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    record = tmp_path / "record.jsonl"
    result = subprocess.run([sys.executable, "-m", "benchmarks.tools.suite_time", "--record", str(record), "--",
                             "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sample.py")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr  # pytest's code: a test failed
    head, *tests, end = [json.loads(line) for line in record.read_text().splitlines()]
    assert head["cpus"] >= 1 and "family" in head["machine"]
    rows = {row["test"].split("::")[1]: row for row in tests}
    assert {name: row["outcome"] for name, row in rows.items()} == {
        "test_sleeps": "passed", "test_spins": "passed", "test_fails": "failed", "test_skipped": "skipped"}
    assert rows["test_sleeps"]["wall_s"] >= 0.3
    assert rows["test_spins"]["cpu_s"] >= 0.25  # the machine was busy at least while this test spun
    assert end["exit"] == 1 and end["session_wall_s"] >= 0.6 and end["session_cpu_s"] >= rows["test_spins"]["cpu_s"]
    out = result.stdout
    assert "4 tests (1 failed, 2 passed, 1 skipped), pytest exit 1" in out
    floor = end["session_cpu_s"] / head["cpus"]
    assert f"floor: {int(floor // 60)} min {floor % 60:04.1f} s (this CPU work with all {head['cpus']} CPUs" in out
    assert out.index("test_sample.py::test_sleeps") > out.index("slowest tests")


def test_a_stopped_or_foreign_record_is_a_clear_error(tmp_path: Path, capsys) -> None:
    stopped = tmp_path / "stopped.jsonl"
    stopped.write_text(json.dumps({"machine": "m", "cpus": 2}) + "\n"
                       + json.dumps({"test": "t.py::a", "wall_s": 1.0, "cpu_s": 1.0, "outcome": "passed"}) + "\n")
    assert main(["--summary", str(stopped)]) == 2
    assert "not a whole record (was the run stopped?): 1 tests in it" in capsys.readouterr().err
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text("not json\n")
    assert main(["--summary", str(foreign)]) == 2
    assert "not a record of this tool" in capsys.readouterr().err
