"""A terminal's Ctrl-C reaches every process of the run's group. Children started by the runner
ignore it from their first instruction (the runner alone orchestrates the stop), the runner's
own press in that moment is delivered rather than lost, and a press before a command has its
own handling gives one line and exit 130, not a traceback."""

import multiprocessing as mp
import os
import signal
import time

from fastrl import cli
from fastrl.workers.process import sigint_ignored_from_birth

SIGINT_BIT = 1 << (signal.SIGINT - 1)


def _status_mask(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _spawn_sleeper(ignoring: bool) -> mp.Process:
    process = mp.get_context("spawn").Process(target=time.sleep, args=(30,), daemon=True)
    if ignoring:
        with sigint_ignored_from_birth():
            process.start()
    else:
        process.start()
    return process


def _wait_until_python_has_set_up_its_signals(pid: int) -> None:
    # a child that does not ignore SIGINT catches it (KeyboardInterrupt) once its interpreter is up
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if (_status_mask(pid, "SigCgt") | _status_mask(pid, "SigIgn")) & SIGINT_BIT:
            return
        time.sleep(0.01)
    raise AssertionError("the child never set up its SIGINT handling")


def test_a_child_started_in_the_block_ignores_sigint_from_birth_and_survives_it():
    child = _spawn_sleeper(ignoring=True)
    try:
        # start() returns after the exec: the disposition seen now is the one the bootstrap runs under
        assert _status_mask(child.pid, "SigIgn") & SIGINT_BIT
        _wait_until_python_has_set_up_its_signals(child.pid)
        os.kill(child.pid, signal.SIGINT)
        child.join(0.5)
        assert child.is_alive()
    finally:
        child.kill()
        child.join()


def test_a_child_started_outside_the_block_dies_of_sigint():
    # the control: without the block the same child takes Ctrl-C as a KeyboardInterrupt
    child = _spawn_sleeper(ignoring=False)
    try:
        _wait_until_python_has_set_up_its_signals(child.pid)
        assert not _status_mask(child.pid, "SigIgn") & SIGINT_BIT
        os.kill(child.pid, signal.SIGINT)
        child.join(10)
        assert child.exitcode not in (None, 0)
    finally:
        child.kill()
        child.join()


def test_the_parents_own_sigint_in_the_block_is_delivered_after_it():
    received = []
    old = signal.signal(signal.SIGINT, lambda signum, _frame: received.append(signum))
    try:
        with sigint_ignored_from_birth():
            signal.raise_signal(signal.SIGINT)  # arrives while the action is SIG_IGN, but blocked
            time.sleep(0.01)
            assert received == []
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert received == [signal.SIGINT]
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.signal(signal.SIGINT, old)


def test_a_ctrl_c_before_a_commands_own_handling_gives_one_line_and_exit_130(monkeypatch, capsys):
    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "cmd_plot", interrupted)
    assert cli.main(["plot", "some_run"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "fastrl plot: interrupted"

