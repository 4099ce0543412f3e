"""The proof lanes' quiet timing (scripts/quiet_lanes.py): inside ``quiet()`` every process of
the other lanes is stopped, after it (or a timeout's SIGTERM) they run again; outside a lane
nothing is stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import quiet_lanes  # noqa: E402


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _settled(pid: int, wanted: str) -> str:
    for _ in range(500):
        state = _state(pid)
        if (state == "T") == (wanted == "T"):
            return state
        time.sleep(0.01)
    return _state(pid)


@pytest.fixture
def other_lane(tmp_path):
    """Lane 1: a shell whose child spins (the tree, not just the root, must stop)."""
    lane = subprocess.Popen(["bash", "-c", "sleep 60 & wait"])
    (tmp_path / "lane-1.pid").write_text(str(lane.pid))
    for _ in range(100):
        children = quiet_lanes.tree([lane.pid])[1:]
        if children:
            break
        time.sleep(0.01)
    yield tmp_path, lane.pid, children[0]
    os.kill(lane.pid, signal.SIGCONT)
    lane.kill()
    lane.wait()
    os.kill(children[0], signal.SIGKILL)


def test_the_other_lane_and_its_children_stop_inside_quiet_and_go_on_after(other_lane, monkeypatch):
    folder, root, child = other_lane
    monkeypatch.setenv(quiet_lanes.FOLDER, str(folder))
    monkeypatch.setenv(quiet_lanes.LANE, "0")
    with quiet_lanes.quiet("test"):
        assert _settled(root, "T") == "T" and _settled(child, "T") == "T"
    assert _settled(root, "S") != "T" and _settled(child, "S") != "T"
    assert (folder / "quiet.log").read_text().split()[0] == "0"  # the pause logged by lane


def test_outside_a_lane_nothing_is_stopped(other_lane, monkeypatch):
    folder, root, _ = other_lane
    monkeypatch.delenv(quiet_lanes.FOLDER, raising=False)
    with quiet_lanes.quiet("test"):
        assert _settled(root, "S") != "T"
    assert not (folder / "quiet.log").exists()


def test_a_lane_terminated_while_quiet_lets_the_other_go_on(other_lane):
    folder, root, _ = other_lane
    env = {**os.environ, quiet_lanes.FOLDER: str(folder), quiet_lanes.LANE: "0"}
    code = "import quiet_lanes, time\nwith quiet_lanes.quiet('t'):\n    time.sleep(60)"
    quiet = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=SCRIPTS)
    assert _settled(root, "T") == "T"
    quiet.terminate()  # what timeout(1) sends
    assert quiet.wait(timeout=10) == 143
    assert _settled(root, "S") != "T"
