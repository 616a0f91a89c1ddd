"""Command line: `fastrl train --config configs/<preset>.yaml [--set section.key=value ...]`.

Every configuration problem is found before a process starts and reported together, with
exit code 2. A run that fails after starting exits 1; a finished or interrupted run exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

EXIT_CONFIG = 2
STAGES = ("env", "infer", "learn", "sample", "train")  # fastrl.bench.report.STAGES, without importing torch


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastrl", description="High-throughput asynchronous APPO/V-trace trainer.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train an agent")
    train.add_argument("--config", action="append",
                       help="YAML preset (e.g. configs/cartpole.yaml); repeat to layer an overlay on it; "
                            "defaults apply to anything unset")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override one setting; repeatable (e.g. --set algo.lr=3e-4)")
    train.add_argument("--name", help="run name (default: <env>_<date>_<time>)")
    train.add_argument("--runs-dir", default="runs", help="where run directories go (default: ./runs)")
    train.add_argument("--resume", action="store_true", help="continue run --name from its latest checkpoint")
    train.add_argument("--checkpoint", help="with --resume: continue from this checkpoint instead of the newest")
    train.add_argument("--help-config", action="store_true", help="list every setting with its type, default and help")

    bench = sub.add_parser("bench", help="measure throughput stage by stage against the machine bound")
    _config_args(bench)
    bench.add_argument("--seconds", type=float, default=60.0, help="measuring time per stage (default 60)")
    bench.add_argument("--stage", dest="stages", action="append", choices=list(STAGES),
                       help="run only this stage; repeatable (default: all five)")
    bench.add_argument("--rounds", type=_positive_int, default=1,
                       help="run the stages this many times in turn; rates, bound and efficiency are then "
                            "medians over rounds, each round's efficiency its own ratio (default 1)")
    bench.add_argument("--json", help="also write the result document here")

    tune = sub.add_parser("tune", help="search worker/env/thread counts for the fastest training on this box")
    _config_args(tune)
    tune.add_argument("--budget-s", type=float, default=600.0, help="total time for the search (default 600)")
    tune.add_argument("--trial-s", type=float, default=20.0, help="measuring time of one trial (default 20)")
    tune.add_argument("--max-trials", type=int, default=None,
                      help="end the search after this many trials, the preset's included, then confirm the best "
                           "(default: as many as the budget allows)")
    tune.add_argument("--out", default="tune_out", help="folder for the overlay YAML, table and chart")

    ev = sub.add_parser("eval", help="play episodes with a run's checkpoint and report the return")
    ev.add_argument("run_dir", help="a run directory (runs/<name>), finished or interrupted")
    ev.add_argument("--checkpoint", help="this checkpoint instead of the run's newest")
    ev.add_argument("--episodes", type=int, default=10, help="episodes to play, one env each (default 10)")
    ev.add_argument("--deterministic", action="store_true", help="most likely action instead of sampling")
    ev.add_argument("--seed", type=int, default=12345, help="env and sampling seed (default 12345)")
    ev.add_argument("--video", help="record the first episode here (.gif; image observations only)")

    plot = sub.add_parser("plot", help="draw return against env steps and wall time for one or more runs")
    plot.add_argument("run_dirs", nargs="+", help="run directories to compare")
    plot.add_argument("--out", default="curves.png", help="PNG to write (default curves.png)")
    plot.add_argument("--title", help="figure title (default: the run names)")
    plot.add_argument("--at", type=_int_list, default=[], metavar="STEPS",
                      help="also print each run's mean return at these env steps, comma-separated (e.g. 500000,1e6)")
    plot.add_argument("--reach", type=_float_list, default=[], metavar="RETURNS",
                      help="also print the env steps and minutes each run took to first reach these mean returns "
                           "(over a full window of 100 games), "
                           "comma-separated; with an = where the first is negative (e.g. --reach=-10,0,18)")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _float_list(text: str) -> list[float]:
    try:
        return [float(piece) for piece in text.split(",") if piece.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _int_list(text: str) -> list[int]:
    """Env-step marks: whole numbers, which may be written 1e6 or 1_000_000."""
    values = _float_list(text)
    if any(v < 0 or v != int(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers of env steps, got {text!r}")
    return [int(v) for v in values]


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", action="append",
                   help="YAML preset (e.g. configs/atari_pong.yaml); repeat to layer an overlay on it")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one setting; repeatable")


def _one_line_error(text: str) -> int:
    print(f"fastrl: {text}", file=sys.stderr)
    return EXIT_CONFIG


def _config_error(problems: list[str]) -> int:
    print("fastrl: invalid configuration:", file=sys.stderr)
    for p in problems:
        print(f"  - {p}", file=sys.stderr)
    return EXIT_CONFIG


def _load(config_path: str | None, overrides: list[str], saved: dict | None = None, on_checked=None):
    """(config, env spec), or the exit code after reporting every problem found. `on_checked(cfg)`
    runs once the config has passed its own checks, before the env is probed (~0.5 s for Atari)."""
    from fastrl.config import ConfigError, check_config, load_config
    from fastrl.envs import EnvError, resolve_env

    try:
        cfg = load_config(config_path, overrides, saved=saved)
    except ConfigError as e:
        return _config_error(e.problems)
    problems = check_config(cfg)
    if not problems and on_checked is not None:
        on_checked(cfg)
    spec = None
    try:
        spec = resolve_env(cfg.env)
    except EnvError as e:
        problems.append(str(e))
    if spec is not None:
        from fastrl.config.checks import encoder_problem

        problem = encoder_problem(cfg.model, spec)
        if problem:
            problems.append(problem)
        from fastrl.envs.atari_frames import envpool_kwargs

        try:
            atari_frames = "fastrl" if envpool_kwargs(cfg.env, spec)[1] is not None else "envpool"
        except ValueError as e:
            problems.append(str(e))
    if spec is not None and cfg.sampler.acting_backend == "numpy":
        from fastrl.models.numpy_policy import unsupported_reason

        reason = unsupported_reason(cfg, spec)
        if reason:
            problems.append(f"sampler.acting_backend=numpy: {reason} (use auto or torch)")
    if problems:
        return _config_error(problems)
    from fastrl.config.checks import resolve_encoder
    from fastrl.config.hardware import precision_warning, resolve_auto, weight_grads_split_blockers

    warning = precision_warning(cfg)
    if warning:
        print(f"fastrl: warning: {warning}", file=sys.stderr)
    encoder = resolve_encoder(cfg.model, spec)
    resolved = resolve_auto(cfg, encoder=encoder)
    # what the rollout workers will do with Atari frames, recorded as such in the saved config
    resolved = dataclasses.replace(resolved, env=dataclasses.replace(resolved.env, atari_frames=atari_frames))
    if resolved.system.learner_split == "weight_grads":
        blockers = weight_grads_split_blockers(resolved, encoder)
        if blockers:
            return _config_error([f"system.learner_split=weight_grads needs {', '.join(blockers)}"])
    return resolved, spec


def cmd_train(args: argparse.Namespace) -> int:
    from fastrl.config.loader import describe_config

    if args.help_config:
        print(describe_config())
        return 0
    runs_dir = Path(args.runs_dir)
    saved = None
    saved_path = runs_dir / (args.name or "") / "config.json"
    if args.resume and args.name and not args.config and saved_path.exists():
        saved = json.loads(saved_path.read_text())  # continue with the run's own resolved config
    # the workers are spawned as soon as the config is checked: their imports (torch: ~3 s of a core
    # on the 2-core boxes) then overlap the env probe and the runner's setup
    from fastrl.runner.warm_start import WarmChildren

    warm = WarmChildren(resuming=args.resume)
    try:
        return _train(args, saved, warm)
    finally:
        warm.close()  # any the runner did not start (an error before it spawned them)


def _train(args: argparse.Namespace, saved: dict | None, warm) -> int:
    from fastrl.config import config_to_dict

    runs_dir = Path(args.runs_dir)
    loaded = _load(args.config, args.overrides, saved, on_checked=warm.spawn)
    if isinstance(loaded, int):
        return loaded
    cfg, spec = loaded

    from fastrl.rundir import (CheckpointError, RunDirError, abandon_fresh_run_dir, claim_run_dir, latest_checkpoint,
                               remove_partial_files, resolve_run_dir, validate_checkpoint, write_run_config)

    if args.checkpoint and not args.resume:
        return _one_line_error("--checkpoint is for --resume (continue a run from that checkpoint)")
    try:
        run_dir = resolve_run_dir(runs_dir, args.name, cfg.env.id, args.resume)
    except RunDirError as e:
        return _one_line_error(str(e))
    resume_ckpt = None
    if args.resume:
        resume_ckpt = Path(args.checkpoint) if args.checkpoint else latest_checkpoint(run_dir / "checkpoints")
        if resume_ckpt is not None:
            # checked before anything is written: a bad checkpoint leaves the run directory as it was
            from fastrl.models import ActorCritic

            try:
                validate_checkpoint(resume_ckpt, ActorCritic(spec, cfg.model))
            except CheckpointError as e:
                return _one_line_error(str(e))
    try:
        lock = claim_run_dir(run_dir, args.resume)  # before the first write into it
    except RunDirError as e:
        return _one_line_error(str(e))
    with lock:
        try:
            write_run_config(run_dir, config_to_dict(cfg))
        except RunDirError as e:
            if not args.resume:
                abandon_fresh_run_dir(run_dir)
            return _one_line_error(str(e))
        if args.resume:
            for partial in remove_partial_files(run_dir / "checkpoints"):
                print(f"fastrl: removed {partial.name}, a checkpoint write that was interrupted")
            if resume_ckpt is None:
                print(f"fastrl: --resume: no checkpoint in {run_dir / 'checkpoints'}; starting from scratch")

        from fastrl.runner.runner import Runner

        return Runner(cfg, spec, run_dir, resume_ckpt, warm=warm).run()


def cmd_bench(args: argparse.Namespace) -> int:
    loaded = _load(args.config, args.overrides)
    if isinstance(loaded, int):
        return loaded
    cfg, spec = loaded
    from fastrl.bench.report import Progress, format_table
    from fastrl.bench.stages import run_bench
    from fastrl.bench.system import BenchInterrupted

    try:
        result = run_bench(cfg, spec, " + ".join(args.config or ["defaults"]), args.overrides, args.seconds,
                           args.stages or list(STAGES),
                           Progress(), rounds=args.rounds)
    except (BenchInterrupted, KeyboardInterrupt) as e:
        print("fastrl bench: interrupted", file=sys.stderr)
        return 128 + _interrupting_signal(e)
    print(format_table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _interrupting_signal(error: BaseException) -> int:
    """The signal behind a bench's or tune's interruption: the run's own (BenchInterrupted), or SIGINT
    for a KeyboardInterrupt between runs."""
    return getattr(error, "signum", signal.SIGINT)


def cmd_tune(args: argparse.Namespace) -> int:
    if args.max_trials is not None and args.max_trials < 1:
        return _one_line_error("--max-trials must be >= 1")
    loaded = _load(args.config, args.overrides)
    if isinstance(loaded, int):
        return loaded
    cfg, spec = loaded
    from fastrl.bench.report import Progress
    from fastrl.bench.system import BenchInterrupted
    from fastrl.bench.tune import Tuner

    tuner = Tuner(cfg, spec, args.config or [], args.overrides, args.budget_s, args.trial_s, Path(args.out), Progress(),
                  args.max_trials)
    interrupted_by = None
    try:
        tuner.run()
    except (BenchInterrupted, KeyboardInterrupt) as e:
        interrupted_by = _interrupting_signal(e)
        print("fastrl tune: interrupted; writing what was measured", file=sys.stderr)
    print(tuner.finish())
    return 0 if interrupted_by is None else 128 + interrupted_by


def cmd_eval(args: argparse.Namespace) -> int:
    from fastrl.envs import EnvError
    from fastrl.eval.play import EvalError, play
    from fastrl.eval.video import VideoError, write_video
    from fastrl.rundir import CheckpointError

    if args.episodes < 1:
        return _one_line_error("--episodes must be >= 1")
    try:
        started = time.monotonic()

        def progress(finished: int, episode_return: float, length: int) -> None:
            print(f"  episode {finished}/{args.episodes}: return {episode_return:.2f}, length {length:,} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)

        result = play(Path(args.run_dir), Path(args.checkpoint) if args.checkpoint else None, args.episodes,
                      args.deterministic, args.seed, record=bool(args.video), on_episode=progress)
        print(result.text())
        if args.video:
            print(f"wrote {write_video(result.frames, Path(args.video), channels_last=result.frames_channels_last)}")
    except (EvalError, CheckpointError, EnvError, VideoError) as e:
        return _one_line_error(str(e))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from fastrl.eval.curves import PlotError, load_curve, plot_curves, return_table

    try:
        curves = [load_curve(Path(d)) for d in args.run_dirs]  # read once, for the table and the chart
        if args.at or args.reach:
            print(return_table(curves, args.at, args.reach))
        print(f"wrote {plot_curves(curves, Path(args.out), args.title)}")
    except PlotError as e:
        return _one_line_error(str(e))
    return 0


def single_threaded_blas() -> None:
    """numpy's OpenBLAS starts a thread per core at import, and they spin for a while: ~0.1 CPU-s in
    every process (`python -c "import numpy"`: 0.30 s user against 0.18 with one thread), five
    processes at once at start-up on a 2-core box. fastrl calls no BLAS large enough to use them
    (numpy acting is [envs x 64] matmuls, under OpenBLAS's multi-threading threshold). Set before
    numpy is imported, so this process and every child inherit it; a user's own setting stays."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    single_threaded_blas()
    args = _parser().parse_args(argv)
    commands = {"train": cmd_train, "bench": cmd_bench, "tune": cmd_tune, "eval": cmd_eval, "plot": cmd_plot}
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        # a Ctrl-C before a command's own handling is in place (a run's is once its runner starts,
        # about half a second in): one line, not a traceback through whatever was importing
        print(f"fastrl {args.command}: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    except RuntimeError as e:
        from fastrl.buffers.shm import SharedMemoryFull  # here: fastrl plot and eval need no numpy-backed buffers

        if not isinstance(e, SharedMemoryFull):
            raise
        print(f"fastrl {args.command}: {e}", file=sys.stderr)  # the run cleaned up before this propagated
        return 1


def entry() -> NoReturn:
    """The `fastrl` command. main()'s exit status, except that a command stopped by a signal (128 + N:
    a run stopped in order by Ctrl-C, SIGTERM or a closed terminal) dies of signal N once it has
    cleaned up, so that the shell or job scheduler that started it sees it stopped, not finished."""
    code = main()
    if code - 128 in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        from fastrl.workers.process import die_of_signal

        die_of_signal(code - 128)
    sys.exit(code)


if __name__ == "__main__":
    entry()
