"""One `fastrl train` per run directory: a second one (a --resume from another terminal while the
run is going) is refused before it writes anything, and the hold never outlives its holder."""

import os
import subprocess
import sys

import pytest

from fastrl.rundir import RunDirError, claim_run_dir
from fastrl.rundir.layout import LOCK_NAME

HOLDER = """
import sys, time
from pathlib import Path
from fastrl.rundir import claim_run_dir
lock = claim_run_dir(Path(sys.argv[1]), resume=True)
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_claim_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "r"
    with claim_run_dir(run, resume=False):
        assert (run / LOCK_NAME).read_text().split() == [str(os.getpid())]
        # flock holds per open file: a second open in this very process conflicts as another process would
        with pytest.raises(RunDirError, match=r"in use by another fastrl train \(pid \d+\)"):
            claim_run_dir(run, resume=True)
    with claim_run_dir(run, resume=True):  # released on close
        pass


def test_a_fresh_run_cannot_take_a_directory_that_exists(tmp_path):
    (tmp_path / "r").mkdir()
    with pytest.raises(RunDirError, match="already exists"):
        claim_run_dir(tmp_path / "r", resume=False)


def test_the_hold_ends_with_its_holder_even_on_kill_9(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match=f"pid {holder.pid}"):
            claim_run_dir(run, resume=True)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    with claim_run_dir(run, resume=True):
        assert (run / LOCK_NAME).read_text().strip() != str(holder.pid)
