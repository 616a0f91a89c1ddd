"""A terminal's Ctrl-C (SIGINT), and its SIGHUP when it goes away, reach every process of the run's
group. Children started by the runner ignore both from their first instruction (the runner alone
orchestrates the stop), the runner's own signal in that moment is delivered rather than lost, a
Ctrl-C before a command has its own handling gives one line and exit 130, not a traceback, and a
closed terminal stops a run the way Ctrl-C does: a final checkpoint, a summary, nothing left. A
run stopped by a signal then dies of it, so that a shell loop of runs stops at one Ctrl-C."""

import multiprocessing as mp
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import time

import psutil
import pytest

from fastrl import cli
from fastrl.workers.process import TERMINAL_SIGNALS, terminal_signals_ignored_from_birth
from helpers import ROOT


def _bit(sig: signal.Signals) -> int:
    return 1 << (sig - 1)


def _status_mask(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _spawn_sleeper(ignoring: bool) -> mp.Process:
    process = mp.get_context("spawn").Process(target=time.sleep, args=(30,), daemon=True)
    if ignoring:
        with terminal_signals_ignored_from_birth():
            process.start()
        return process
    # the control starts from the default dispositions even where the test runner itself ignores the signals:
    # a background job of a shell without job control (`make test &` in a script) starts with SIGINT ignored,
    # and a child inherits an ignored signal through exec (the first CI clone of stop 61 failed so)
    previous = {sig: signal.signal(sig, signal.SIG_DFL) for sig in TERMINAL_SIGNALS}
    try:
        process.start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return process


def _wait_until_python_has_set_up_its_signals(pid: int) -> None:
    # a child that does not ignore SIGINT catches it (KeyboardInterrupt) once its interpreter is up
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (_status_mask(pid, "SigCgt") | _status_mask(pid, "SigIgn")) & _bit(signal.SIGINT):
            return
        time.sleep(0.01)
    raise AssertionError("the child never set up its SIGINT handling")


@pytest.mark.parametrize("sig", TERMINAL_SIGNALS, ids=lambda s: s.name)
def test_a_child_started_in_the_block_ignores_the_signal_from_birth_and_survives_it(sig):
    child = _spawn_sleeper(ignoring=True)
    try:
        # start() returns after the exec: the disposition seen now is the one the bootstrap runs under
        assert _status_mask(child.pid, "SigIgn") & _bit(sig)
        _wait_until_python_has_set_up_its_signals(child.pid)
        os.kill(child.pid, sig)
        child.join(0.5)
        assert child.is_alive()
    finally:
        child.kill()
        child.join()


@pytest.mark.parametrize("sig", TERMINAL_SIGNALS, ids=lambda s: s.name)
def test_a_child_started_outside_the_block_dies_of_the_signal(sig):
    # the control: without the block the same child dies of it
    child = _spawn_sleeper(ignoring=False)
    try:
        _wait_until_python_has_set_up_its_signals(child.pid)
        assert not _status_mask(child.pid, "SigIgn") & _bit(sig)
        os.kill(child.pid, sig)
        child.join(10)
        assert child.exitcode not in (None, 0)
    finally:
        child.kill()
        child.join()


@pytest.mark.parametrize("sig", TERMINAL_SIGNALS, ids=lambda s: s.name)
def test_the_parents_own_signal_in_the_block_is_delivered_after_it(sig):
    received = []
    old = signal.signal(sig, lambda signum, _frame: received.append(signum))
    try:
        with terminal_signals_ignored_from_birth():
            signal.raise_signal(sig)  # arrives while the action is SIG_IGN, but blocked
            time.sleep(0.01)
            assert received == []
            assert signal.getsignal(sig) == signal.SIG_IGN
        assert received == [sig]
        assert sig not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.signal(sig, old)


def test_a_ctrl_c_before_a_commands_own_handling_gives_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_plot", interrupted)
    assert cli.main(["plot", "some_run"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "fastrl plot: interrupted"


def _read_until(master: int, text: bytes, timeout_s: float) -> bytes:
    out, deadline = b"", time.monotonic() + timeout_s
    while text not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
    return out


@pytest.mark.integration
@pytest.mark.parametrize("hang_up", ["terminal_closed", "group_signalled"])
def test_a_closed_terminal_stops_the_run_with_a_checkpoint_and_a_summary(tmp_path, hang_up):
    # The run is the session leader on a pseudo-terminal. Closing the terminal's other end makes
    # the kernel send SIGHUP to it; a shell whose terminal goes away sends SIGHUP to each job's
    # whole process group instead, workers included, which must not die of it.
    pid, master = pty.fork()
    if pid == 0:  # the child: nothing here may return into pytest
        try:
            os.chdir(ROOT)
            os.execv(sys.executable, [sys.executable, "-m", "fastrl", "train", "--config", "configs/cartpole.yaml",
                                         "--runs-dir", str(tmp_path), "--name", "run", "--set", "run.stop_at_mean_return=null",
                                         "--set", "run.train_for_env_steps=100000000", "--set", "run.save_every_s=1000",
                                         "--set", "run.report_interval_s=1"])
        finally:
            os._exit(127)
    try:
        out = _read_until(master, b"learner busy", 90)
        assert b"learner busy" in out, out.decode(errors="replace")[-3000:]
        children = psutil.Process(pid).children(recursive=True)
        assert children
        if hang_up == "group_signalled":
            os.killpg(pid, signal.SIGHUP)
    finally:
        os.close(master)  # the terminal goes away
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError("the run did not stop within 30 s of its terminal closing")
    # stopped in order (the checkpoint and summary below), then dead of the signal that stopped it
    assert os.waitstatus_to_exitcode(status) == -signal.SIGHUP
    run_dir = tmp_path / "run"
    assert "stopping: received SIGHUP" in (run_dir / "train.log").read_text()
    assert list((run_dir / "checkpoints").glob("checkpoint_*.pt")), "no final checkpoint"
    assert (run_dir / "summary.json").exists()
    _, alive = psutil.wait_procs(children, timeout=5)
    assert alive == [], "children outlived the run"
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"fastrl.{pid}.")]


@pytest.mark.integration
def test_a_ctrl_c_stops_a_shell_loop_of_runs_not_only_the_run(tmp_path):
    """bash goes on to a loop's next command after one that handled Ctrl-C and exited, whatever its
    status; it ends the loop only after one that died of SIGINT (its "wait and cooperative exit")."""
    train = shlex.join([sys.executable, "-m", "fastrl", "train", "--config", "configs/cartpole.yaml",
                        "--runs-dir", str(tmp_path), "--set", "run.stop_at_mean_return=null",
                        "--set", "run.train_for_env_steps=100000000", "--set", "run.report_interval_s=1"])
    script = f"for seed in 1 2; do {train} --name run$seed --set run.seed=$seed; done; echo loop finished"
    out_path = tmp_path / "shell.out"
    with open(out_path, "w") as out:
        # a shell as a terminal starts it: SIGINT at its default action (not inherited as ignored),
        # in a process group of its own that the test's "terminal" signals as a whole
        shell = subprocess.Popen(["bash", "-c", script], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while "learner busy" not in out_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "learner busy" in out_path.read_text(), out_path.read_text()
        run_tree = psutil.Process(shell.pid).children(recursive=True)
        os.killpg(shell.pid, signal.SIGINT)
        assert shell.wait(30) == -signal.SIGINT, out_path.read_text()
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
    output = out_path.read_text()
    assert "stopping: received SIGINT" in output and "loop finished" not in output, output
    assert not (tmp_path / "run2").exists(), "the loop went on to its next run"
    assert list((tmp_path / "run1" / "checkpoints").glob("checkpoint_*.pt"))
    assert (tmp_path / "run1" / "summary.json").exists()
    _, alive = psutil.wait_procs(run_tree, timeout=5)
    assert alive == [], "processes outlived the run"


def test_a_press_while_a_run_stops_for_its_own_reason_still_stops_what_started_it(monkeypatch, tmp_path):
    """fastrl tune ends each trial's run by its own reason ("benchmark window complete"); a Ctrl-C
    during that run's shutdown was dropped, and the search went on to its next trial."""
    import logging

    from fastrl.config import load_config
    from fastrl.runner import runner as runner_module
    from helpers import SMALL_DISCRETE

    monkeypatch.setattr(runner_module, "setup_logging", lambda *args, **kwargs: logging.getLogger("test"))
    runner = runner_module.Runner(load_config(str(ROOT / "configs/cartpole.yaml"), []), SMALL_DISCRETE, tmp_path,
                                  echo=False)
    runner.stop_reason = "benchmark window complete"
    runner._on_signal(signal.SIGINT, None)
    assert runner.stop_signal == signal.SIGINT
    assert runner.stop_reason == "benchmark window complete"  # why the run itself ended
    runner._on_signal(signal.SIGHUP, None)
    assert runner.stop_signal == signal.SIGINT  # the first press is the one the command dies of
