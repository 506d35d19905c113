"""The test process ends with pytest's own exit status once its reports are written (tests/conftest.py's
`pytest_unconfigure`), never with a crash of the interpreter's teardown in its place."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pytest_argv(*args: str) -> list[str]:
    """pytest in a child process with tests/conftest.py loaded as a plugin, on test files outside tests/."""
    return [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", *args]


def pytest_with_our_hooks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(pytest_argv(*args), cwd=REPO, capture_output=True, text=True, timeout=120)


def test_a_failing_run_exits_1_after_its_summary_and_junit_report(tmp_path: Path):
    tests = tmp_path / "test_two.py"
    tests.write_text("def test_passes():\n    pass\n\n\ndef test_fails():\n    assert 1 == 2\n")
    junit = tmp_path / "junit.xml"
    done = pytest_with_our_hooks(str(tests), f"--junitxml={junit}")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 failed, 1 passed" in done.stdout.splitlines()[-1]
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")


def test_a_run_that_collects_nothing_exits_5_and_help_exits_0(tmp_path: Path):
    (tmp_path / "test_one.py").write_text("def test_passes():\n    pass\n")
    done = pytest_with_our_hooks(str(tmp_path), "-k", "no_such_test")
    assert done.returncode == 5 and "1 deselected" in done.stdout, done.stdout[-2000:]
    help_text = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=REPO, capture_output=True,
                               text=True, timeout=120)  # fmt: skip  # tests/conftest.py loaded as a conftest
    assert help_text.returncode == 0 and "usage:" in help_text.stdout


def test_a_sigterm_stops_the_run_through_its_session_finish(tmp_path: Path):
    """`timeout` or a cancelled CI job sends SIGTERM: pytest ends as after Ctrl-C (status 2, its summary), and
    session finish runs, which is where the shared cluster and the session's servers are stopped."""
    finished = tmp_path / "session-finished"
    (tmp_path / "conftest.py").write_text(
        "def pytest_sessionfinish(session, exitstatus):\n"
        f"    open({str(finished)!r}, 'w').write(str(int(exitstatus)))\n"
    )
    started = tmp_path / "started"
    (tmp_path / "test_slow.py").write_text(
        f"import time\n\n\ndef test_waits():\n    open({str(started)!r}, 'w').close()\n    time.sleep(120)\n"
    )
    child = subprocess.Popen(
        pytest_argv(str(tmp_path)), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.1)
    assert started.exists(), child.communicate()[0][-2000:]
    child.send_signal(signal.SIGTERM)
    output = child.communicate(timeout=60)[0]
    assert child.returncode == 2, output[-2000:]
    assert "KeyboardInterrupt" in output and "stopped by signal" in output
    assert finished.read_text() == "2"
