"""Smoke test of `fastrl eval` and `fastrl plot` on a tiny real run, and the GIF writer."""

import json
import re

import numpy as np
import pytest

from fastrl.cli import main
from fastrl.eval import play
from fastrl.eval.video import VideoError, write_video
from helpers import ROOT, RunProcess


@pytest.mark.integration
def test_eval_and_plot_a_short_run(tmp_path, capsys, monkeypatch):
    run = RunProcess("--config", str(ROOT / "configs/cartpole.yaml"), "--set", "run.train_for_env_steps=30000",
                     "--set", "run.stop_at_mean_return=null", "--set", "run.report_interval_s=0.5",
                     runs_dir=tmp_path)
    assert run.wait(120) == 0, run.output
    assert main(["eval", str(run.run_dir), "--episodes", "4", "--deterministic"]) == 0
    out = capsys.readouterr().out
    assert "4 episodes of" in out and "return" in out
    assert [f"episode {i}/4: return" in out for i in (1, 2, 3, 4)] == [True] * 4  # progress as each ends
    trained = re.search(r"trained ([\d,]+) env steps", out)  # the checkpoint's env steps are named
    assert trained and int(trained.group(1).replace(",", "")) >= 30000, out
    # a sampled policy, from an explicit checkpoint, is fine too
    ckpt = sorted((run.run_dir / "checkpoints").glob("checkpoint_*.pt"))[0]
    assert main(["eval", str(run.run_dir), "--episodes", "2", "--checkpoint", str(ckpt)]) == 0
    # a run trained in bf16 plays in fp32 on a CPU that would only emulate bf16
    config = json.loads((run.run_dir / "config.json").read_text())
    (run.run_dir / "config.json").write_text(json.dumps(dict(config, model=dict(config["model"], precision="bf16"))))
    for native, plays_bf16 in ((False, False), (True, True)):
        monkeypatch.setattr(play, "native_bf16", lambda device, native=native: native)
        assert play.load_policy(run.run_dir, None)[2].bf16 is plays_bf16
    # CartPole's observations are not pictures: a clear one-line refusal
    assert main(["eval", str(run.run_dir), "--episodes", "1", "--video", str(tmp_path / "x.gif")]) == 2
    assert "not images" in capsys.readouterr().err
    png = tmp_path / "curves.png"
    assert main(["plot", str(run.run_dir), str(run.run_dir), "--out", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and {"env_steps", "wall_s", "frames"} <= set(rows[-1])


def test_eval_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "not a fastrl run directory" in capsys.readouterr().err
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "c.png")]) == 2


def test_gif_of_image_observations(tmp_path):
    frames = [np.full((4, 84, 84), i * 20, dtype=np.uint8) for i in range(5)]
    path = write_video(frames, tmp_path / "e.gif")
    from PIL import Image

    with Image.open(path) as im:
        assert im.size == (252, 252) and im.n_frames == 5
    with pytest.raises(VideoError):
        write_video(frames, tmp_path / "e.mp4")


def _write_metrics(run_dir, rows):
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_plot_prints_returns_at_marks_and_the_steps_to_reach_a_return(tmp_path, capsys):
    """`fastrl plot --at/--reach`: the first report at or past each mark (not the nearest), blank where a
    run stopped short or never got there; a resumed run's minutes count on from its first segment."""
    def row(steps, wall, ret=None):
        return {"env_steps": steps, "frames": 4 * steps, "wall_s": wall,
                **({} if ret is None else {"episode/return_mean": ret})}

    a = _write_metrics(tmp_path / "a", [row(500, 60, -20.0), row(900, 120, -5.0), row(1100, 180, 3.0),
                                        row(2000, 240, 9.5)])
    # resumed at 120 s: its clock restarts, so 60 s after the resume is minute 3
    b = _write_metrics(tmp_path / "b", [row(400, 60), row(1000, 120, -12.0), row(1200, 60, -0.5)])
    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "c.png"), "--at", "1e3,2_000",
                 "--reach=-6,0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| run | 1,000 | 2,000 | to -6 | to +0 |"
    assert lines[2] == "| a | +3.0 | +9.5 | 900 (2 min) | 1,100 (3 min) |"
    assert lines[3] == "| b | -12.0 |  | 1,200 (3 min) |  |"
    assert lines[4].startswith("wrote ")
    for bad in ("-5", "1.5", "x"):
        with pytest.raises(SystemExit):
            main(["plot", str(a), f"--at={bad}"])  # with =, so that "-5" reaches the check
        assert "expected comma-separated" in capsys.readouterr().err


def test_a_return_is_reached_only_over_a_full_window_of_games(tmp_path, capsys):
    """A run's first reports are means of a few games: one lucky game must not count as reaching a
    return (rows written before the count was recorded still count, as the test above holds)."""
    def row(steps, ret, games):
        return {"env_steps": steps, "frames": steps, "wall_s": steps / 10, "episode/return_mean": ret,
                "episode/episodes_in_mean": games}

    run = _write_metrics(tmp_path / "r", [row(100, 30.0, 1), row(200, 12.0, 60), row(300, 22.0, 100),
                                          row(400, 25.0, 100)])
    assert main(["plot", str(run), "--out", str(tmp_path / "c.png"), "--at", "100", "--reach", "20,24"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| r | +30.0 | 300 (0 min) | 400 (1 min) |"


def test_plot_reads_a_run_that_is_writing_and_names_a_bad_line(tmp_path, capsys):
    rows = [{"env_steps": 512 * i, "frames": 512 * i, "wall_s": float(i), "episode/return_mean": float(i)}
            for i in range(1, 4)]
    writing = _write_metrics(tmp_path / "writing", rows)
    with open(writing / "metrics.jsonl", "a") as f:
        f.write('{"env_steps": 2048, "fra')  # the row a running run is writing as plot reads
    assert main(["plot", str(writing), "--out", str(tmp_path / "w.png"), "--at", "1536"]) == 0
    assert "| writing | +3.0 |" in capsys.readouterr().out
    broken = _write_metrics(tmp_path / "broken", rows)
    (broken / "metrics.jsonl").write_text('{"env_steps": 512, "wall_s": 1.0}\nnot json\n')
    assert main(["plot", str(broken), "--out", str(tmp_path / "b.png")]) == 2
    assert capsys.readouterr().err.strip() == f"fastrl: {broken / 'metrics.jsonl'}, line 2: not a JSON row ('not json')"
