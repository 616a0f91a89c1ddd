"""Checkpoints a user (or an attacker) might hand fastrl: truncated, from another model, a pickle
that carries code. Each is refused with one line and exit 2, and nothing on disk changes.
Also: a checkpoint write killed at any instant never leaves a partial file under a final name, and
one the disk refuses (full) leaves no partial file at all and says why in one line."""

import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fastrl.cli import main
from fastrl.config import config_to_dict, load_config
from fastrl.envs import resolve_env
from fastrl.models import ActorCritic
from fastrl.rundir import latest_checkpoint, load_checkpoint, remove_partial_files, save_checkpoint, write_run_config

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = ROOT / "configs/cartpole.yaml"


@pytest.fixture
def run_dir(tmp_path):
    """A finished CartPole run directory holding one real checkpoint."""
    cfg = load_config(CARTPOLE)
    model = ActorCritic(resolve_env(cfg.env), cfg.model)
    run = tmp_path / "r"
    write_run_config(run, config_to_dict(cfg))
    optimizer = torch.optim.Adam(model.parameters())
    save_checkpoint(run / "checkpoints", {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                          "policy_version": 7, "train_steps": 3, "env_steps": 3072}, keep=3)
    return run


def snapshot(path: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def resume(capsys, run: Path, *extra: str) -> tuple[int, str]:
    code = main(["train", "--runs-dir", str(run.parent), "--name", run.name, "--resume", *extra])
    return code, capsys.readouterr().err


def assert_refused(code: int, err: str, expected: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], err


def test_truncated_checkpoint_is_refused(capsys, run_dir):
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    ckpt.write_bytes(ckpt.read_bytes()[:500])
    before = snapshot(run_dir)
    assert_refused(*resume(capsys, run_dir), "is truncated or corrupt")
    assert snapshot(run_dir) == before


def test_checkpoint_from_another_model_is_refused(capsys, run_dir):
    before = snapshot(run_dir)
    assert_refused(*resume(capsys, run_dir, "--set", "model.hidden_sizes=[32, 32]"), "does not fit this model")
    assert snapshot(run_dir) == before


class _Payload:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


MARKER = Path("/tmp/fastrl-test-pickle-payload-ran")


def test_pickle_carrying_code_is_refused_and_never_runs(capsys, run_dir, tmp_path):
    MARKER.unlink(missing_ok=True)
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "optimizer": {}, "policy_version": 0, "train_steps": 0, "env_steps": 0,
                "x": _Payload()}, evil)
    before = snapshot(run_dir)
    assert_refused(*resume(capsys, run_dir, "--checkpoint", str(evil)), "refusing")
    assert not MARKER.exists(), "loading the checkpoint ran its code"
    assert snapshot(run_dir) == before


def test_not_a_checkpoint_and_misused_flag(capsys, run_dir, tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    assert_refused(*resume(capsys, run_dir, "--checkpoint", str(other)), "not a fastrl checkpoint")
    code = main(["train", "--runs-dir", str(tmp_path), "--config", str(CARTPOLE), "--checkpoint", str(other)])
    assert_refused(code, capsys.readouterr().err, "--checkpoint is for --resume")


def _save_forever(directory: str, state: dict, first_saved) -> None:
    step = 0
    while True:
        step += 1
        save_checkpoint(Path(directory), dict(state, train_steps=step), keep=2)
        first_saved.set()


def test_a_save_killed_at_any_moment_leaves_only_complete_checkpoints(tmp_path):
    # The kill is timed from the child's first complete save, not from its start: a child can start
    # slowly on a loaded box, and a fixed sleep then killed it before it had saved anything (CI, stop
    # 12). Each save takes ~10-50 ms, so a random delay of up to 0.4 s lands anywhere inside one of
    # several saves, including mid-write and mid-rename. The children are forked, not spawned as the
    # product's processes are: each spawn spent ~2 s importing torch again, 16 s of the suite, to run
    # only torch.save, which starts no threads (the tensor is made here, before the fork).
    ctx = mp.get_context("fork")
    state = {"model": {"w": torch.randn(1_000_000)}, "optimizer": {}, "policy_version": 0, "env_steps": 0}
    rng = random.Random(0)
    for _ in range(8):
        first_saved = ctx.Event()
        p = ctx.Process(target=_save_forever, args=(str(tmp_path), state, first_saved))
        p.start()
        assert first_saved.wait(120), "the saving child never completed a first checkpoint"
        time.sleep(rng.random() * 0.4)
        os.kill(p.pid, signal.SIGKILL)
        p.join(5)
        finals = sorted(tmp_path.glob("checkpoint_*.pt"))
        assert finals
        for f in finals:  # every file under a final name is whole
            assert load_checkpoint(f)["model"]["w"].numel() == 1_000_000
    remove_partial_files(tmp_path)
    assert not list(tmp_path.glob(".checkpoint_*"))


FULL_DISK = """
import resource, sys
from pathlib import Path
import torch
from fastrl.rundir import save_checkpoint
from fastrl.rundir.checkpoints import CheckpointWriteError
ckpt_dir = Path(sys.argv[1])
state = {"model": {"w": torch.zeros(1000)}, "train_steps": 1}
save_checkpoint(ckpt_dir, state, keep=3)  # a small one fits
# a file-size limit makes the kernel refuse writes past 200 kB (EFBIG), as a full disk would (ENOSPC)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
try:
    save_checkpoint(ckpt_dir, {"model": {"w": torch.zeros(1_000_000)}, "train_steps": 2}, keep=3)
except CheckpointWriteError as e:
    print(e)
"""


def test_a_checkpoint_that_cannot_be_written_is_removed_and_named_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    # the OSError behind torch's own error, and the checkpoint a resume would use
    assert "could not write" in line and "checkpoint_000000000002.pt" in line and "File too large" in line, line
    assert "the newest complete checkpoint is" in line and "checkpoint_000000000001.pt" in line, line
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_000000000001.pt"]


def test_a_json_write_that_fails_leaves_no_temp_file(tmp_path, monkeypatch):
    from fastrl.rundir import write_json

    def full_disk(self, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_json(tmp_path / "summary.json", {"env_steps": 1})
    assert list(tmp_path.iterdir()) == []
