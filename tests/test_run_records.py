"""The records a run appends to (learner.jsonl, metrics.jsonl, TensorBoard's event file, train.log)
on a disk that fills up: whole rows or none, one line saying why, no hang, and a run that then
stops in order. The kernel's own errors stand in for a full disk: /dev/full (ENOSPC on every
write) and a file-size limit (a write that crosses it is cut short, then EFBIG)."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastrl.rundir.records import JsonLinesRecord, ScalarEventsRecord
from helpers import ROOT, RunProcess


def read_frames(path: Path) -> list[bytes]:
    """The records of a TFRecord file, each checked against its length and CRCs."""
    from tensorboardX.record_writer import masked_crc32c

    raw, frames, at = path.read_bytes(), [], 0
    while at < len(raw):
        header = raw[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", raw[at + 8:at + 12])[0] == masked_crc32c(header)
        data = raw[at + 12:at + 12 + length]
        assert len(data) == length, "a partial record at the end of the file"
        assert struct.unpack("<I", raw[at + 12 + length:at + 16 + length])[0] == masked_crc32c(data)
        frames.append(data)
        at += 16 + length
    return frames


def test_scalars_are_written_as_tensorboardx_frames_them(tmp_path):
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import RecordWriter

    events = ScalarEventsRecord(tmp_path)
    events.add_scalars({"perf/env_steps_per_s": 1234.5, "loss/policy": -0.25}, step=4096)
    events.add_scalars({"perf/env_steps_per_s": 2000.0}, step=8192)
    events.close()
    assert events.error is None and events.path.name.startswith("events.out.tfevents.")
    frames = read_frames(events.path)
    parsed = [Event.FromString(f) for f in frames]
    assert parsed[0].file_version == "brain.Event:2"
    assert [e.step for e in parsed[1:]] == [4096, 8192]
    assert {v.tag: v.simple_value for v in parsed[1].summary.value} == {"perf/env_steps_per_s": 1234.5,
                                                                        "loss/policy": -0.25}
    assert parsed[2].summary.value[0].simple_value == 2000.0
    # byte for byte what tensorboardX's own writer (which TensorBoard reads) makes of the same events
    reference = RecordWriter(str(tmp_path / "reference"))
    for data in frames:
        reference.write(data)
    reference.close()
    assert (tmp_path / "reference").read_bytes() == events.path.read_bytes()


def test_a_full_disk_is_one_error_and_later_rows_are_dropped(tmp_path):
    full = tmp_path / "full.jsonl"
    full.symlink_to("/dev/full")
    record = JsonLinesRecord(full)
    record.append({"env_steps": 1})
    assert record.error == f"could not write {full}: [Errno 28] No space left on device"
    record.append({"env_steps": 2})  # dropped, no raise
    record.close()


def test_a_record_that_cannot_even_be_made_is_the_same_error(tmp_path):
    record = JsonLinesRecord(tmp_path / "gone" / "metrics.jsonl")  # its directory was removed under the run
    assert record.error.startswith(f"could not write {tmp_path / 'gone' / 'metrics.jsonl'}: [Errno 2]")
    record.append({"env_steps": 1})
    record.close()


def test_a_row_is_appended_whole_to_what_the_file_held(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"env_steps": 1}\n')  # a resumed run's file
    record = JsonLinesRecord(path)
    record.append({"env_steps": 2})
    record.close()
    assert [json.loads(line)["env_steps"] for line in path.read_text().splitlines()] == [1, 2]


CUT_SHORT = """
import resource, sys
from pathlib import Path
from fastrl.rundir.records import JsonLinesRecord, ScalarEventsRecord
run_dir = Path(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))  # Python ignores SIGXFSZ: writes past it fail
rows, events = JsonLinesRecord(run_dir / "learner.jsonl"), ScalarEventsRecord(run_dir)
for step in range(10_000):  # a row crosses the limit: the kernel writes part of it, then EFBIG
    rows.append({"step": step, "padding": "x" * 37})
    events.add_scalars({"a": float(step), "b": 2.0, "c": 3.0}, step)
print(rows.error)
print(events.error)
"""


def test_a_row_cut_short_by_the_disk_is_removed_and_nothing_hangs(tmp_path):
    """tensorboardX's SummaryWriter hung here: its writer thread died of the error, and the next
    add_scalar blocked for ever on the dead thread's full queue."""
    out = subprocess.run([sys.executable, "-c", CUT_SHORT, str(tmp_path)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows_error, events_error = out.stdout.splitlines()
    assert rows_error.startswith(f"could not write {tmp_path / 'learner.jsonl'}: [Errno 27] File too large")
    assert events_error.startswith("could not write ") and "events.out.tfevents." in events_error
    assert "File too large" in events_error
    lines = (tmp_path / "learner.jsonl").read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)
    assert [json.loads(line)["step"] for line in lines] == list(range(len(lines)))
    assert 0 < (tmp_path / "learner.jsonl").stat().st_size < 50_000
    (events_file,) = tmp_path.glob("events.out.tfevents.*")
    assert len(read_frames(events_file)) > 100  # whole frames only: read_frames checks each one


LOG_TO_FULL_DISK = """
import sys
from fastrl.workers.process import setup_logging
log = setup_logging("/dev/full", "fastrl-test", echo=False)
for i in range(100):
    log.info("line %d", i)
print("went on")
"""


def test_a_log_line_that_cannot_be_written_is_said_once(tmp_path):
    out = subprocess.run([sys.executable, "-c", LOG_TO_FULL_DISK], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert out.returncode == 0 and out.stdout == "went on\n", out.stderr
    # logging's default: "--- Logging error ---" and a traceback for each of the 100 lines
    assert out.stderr.splitlines() == ["fastrl-test: could not write /dev/full: [Errno 28] No space left on "
                                       "device; its further lines are dropped"]


CARTPOLE_ARGS = ["--config", str(ROOT / "configs/cartpole.yaml"), "--set", "run.stop_at_mean_return=null",
                 "--set", "run.report_interval_s=1"]


@pytest.mark.integration
def test_a_run_whose_records_fill_the_disk_stops_in_order(tmp_path):
    first = RunProcess(*CARTPOLE_ARGS, "--set", "run.train_for_env_steps=20000", runs_dir=tmp_path)
    assert first.wait(120) == 0, first.output
    metrics = first.run_dir / "metrics.jsonl"
    metrics.unlink()
    metrics.symlink_to("/dev/full")  # the resumed run's first report meets a full disk
    run = RunProcess("--resume", "--set", "run.train_for_env_steps=100000000", runs_dir=tmp_path)
    assert run.wait(120) == 1, run.output
    reason = f"could not write {metrics}: [Errno 28] No space left on device"
    assert f"stopping: {reason}\n" in run.output
    assert "Traceback" not in run.output
    summary = run.summary()
    assert summary["failure"] == reason
    state = torch.load(sorted((run.run_dir / "checkpoints").glob("checkpoint_*.pt"))[-1], weights_only=True)
    assert state["train_steps"] == summary["train_steps"]  # the final checkpoint, as at any orderly stop
    assert run.leftover_children() == [] and run.leftover_segments() == []


@pytest.mark.integration
def test_a_checkpoint_the_disk_refuses_stops_the_run_with_one_line(tmp_path):
    first = RunProcess(*CARTPOLE_ARGS, "--set", "run.train_for_env_steps=20000", runs_dir=tmp_path)
    assert first.wait(120) == 0, first.output
    (start,) = (first.run_dir / "checkpoints").glob("checkpoint_*.pt")
    start = start.rename(tmp_path / "start.pt")
    train_steps = first.summary()["train_steps"]
    # a directory under every name the resumed run's checkpoints can take: the kernel refuses the rename
    for steps in range(train_steps, 3 * train_steps + 100):
        (first.run_dir / "checkpoints" / f"checkpoint_{steps:012d}.pt").mkdir()
    run = RunProcess("--resume", "--checkpoint", str(start), "--set",
                     f"run.train_for_env_steps={first.summary()['env_steps'] + 20000}", runs_dir=tmp_path)
    assert run.wait(120) == 1, run.output
    line = next(ln for ln in run.output.splitlines() if ln.startswith("ERROR: fastrl-learner: could not write "))
    assert "[Errno 21] Is a directory" in line and "there is no complete checkpoint yet" in line, run.output
    assert "Traceback" not in run.output  # train.log has it
    assert "Traceback" in (run.run_dir / "train.log").read_text()
    assert run.summary()["failure"] == line.removeprefix("ERROR: ")
    assert run.leftover_children() == [] and run.leftover_segments() == []
