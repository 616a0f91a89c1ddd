"""One `fastrl train` per run directory: a second one (a --resume from another terminal while the
run is going) is refused before it writes anything, and the hold never outlives its holder. A
run directory that cannot be made or written (--runs-dir is a file, a full disk) is one line,
and leaves nothing that would make the next try fail with "already exists"."""

import os
import subprocess
import sys

import pytest

from fastrl.rundir import RunDirError, claim_run_dir
from fastrl.rundir.layout import LOCK_NAME
from helpers import ROOT

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


FULL_DISK = """
import resource, sys
from pathlib import Path
from fastrl.rundir import RunDirError, claim_run_dir, write_run_config
runs = Path(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # every write fails (EFBIG), as on a full disk (ENOSPC)
try:
    claim_run_dir(runs / "fresh", resume=False)
except RunDirError as e:
    print(e)
try:
    write_run_config(runs / "resumed", {"a": 1})
except RunDirError as e:
    print(e)
"""


def test_a_run_directory_the_disk_refuses_is_one_line_and_no_leftover(tmp_path):
    (tmp_path / "resumed").mkdir()
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    claim_error, config_error = out.stdout.splitlines()
    assert claim_error == f"cannot write in run directory {tmp_path / 'fresh'}: [Errno 27] File too large"
    assert not (tmp_path / "fresh").exists()  # the same command, once there is room, must not meet "already exists"
    assert config_error.startswith(f"cannot write the run's config into {tmp_path / 'resumed'}: [Errno 27]")
    assert not list((tmp_path / "resumed").glob("config.json*"))


def test_runs_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "runs").write_text("not a directory")
    out = subprocess.run([sys.executable, "-m", "fastrl", "train", "--config", "configs/cartpole.yaml",
                          "--runs-dir", str(tmp_path / "runs"), "--name", "r"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == (f"fastrl: cannot make run directory {tmp_path / 'runs' / 'r'}: [Errno 20] Not a "
                                  f"directory: '{tmp_path / 'runs' / 'r'}'"), out.stderr
