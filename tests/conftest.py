"""Runs a test started and left running, which a failed assertion does, are killed when it ends:
a run of 100M env steps left to train took both cores from every test after it, and made them fail."""

import pytest

from helpers import RunProcess


@pytest.fixture(autouse=True)
def kill_runs_left_running():
    yield
    started, RunProcess.started = RunProcess.started, []
    for run in started:
        if run.proc.poll() is None:
            run.proc.kill()  # its children die with it (PR_SET_PDEATHSIG), its janitor removes its segments
            run.proc.wait(10)
