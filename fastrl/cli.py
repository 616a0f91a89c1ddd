"""Command line: `fastrl train --config configs/<preset>.yaml [--set section.key=value ...]`.

Every configuration problem is found before a process starts and reported together, with
exit code 2. A run that fails after starting exits 1; a finished or interrupted run exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_CONFIG = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastrl", description="High-throughput asynchronous APPO/V-trace trainer.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train an agent")
    train.add_argument("--config", help="YAML preset (e.g. configs/cartpole.yaml); defaults apply to anything unset")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override one setting; repeatable (e.g. --set algo.lr=3e-4)")
    train.add_argument("--name", help="run name (default: <env>_<date>_<time>)")
    train.add_argument("--runs-dir", default="runs", help="where run directories go (default: ./runs)")
    train.add_argument("--resume", action="store_true", help="continue run --name from its latest checkpoint")
    train.add_argument("--help-config", action="store_true", help="list every setting with its type, default and help")
    return parser


def _config_error(problems: list[str]) -> int:
    print("fastrl: invalid configuration:", file=sys.stderr)
    for p in problems:
        print(f"  - {p}", file=sys.stderr)
    return EXIT_CONFIG


def cmd_train(args: argparse.Namespace) -> int:
    from fastrl.config import ConfigError, check_config, config_to_dict, load_config
    from fastrl.config.loader import describe_config

    if args.help_config:
        print(describe_config())
        return 0
    runs_dir = Path(args.runs_dir)
    saved = None
    saved_path = runs_dir / (args.name or "") / "config.json"
    if args.resume and args.name and args.config is None and saved_path.exists():
        saved = json.loads(saved_path.read_text())  # continue with the run's own resolved config
    try:
        cfg = load_config(args.config, args.overrides, saved=saved)
    except ConfigError as e:
        return _config_error(e.problems)
    problems = check_config(cfg)
    from fastrl.envs import EnvError, resolve_env

    spec = None
    try:
        spec = resolve_env(cfg.env)
    except EnvError as e:
        problems.append(str(e))
    if problems:
        return _config_error(problems)

    from fastrl.rundir import RunDirError, latest_checkpoint, prepare_run_dir

    try:
        run_dir = prepare_run_dir(runs_dir, args.name, cfg.env.id, config_to_dict(cfg), args.resume)
    except RunDirError as e:
        print(f"fastrl: {e}", file=sys.stderr)
        return EXIT_CONFIG
    resume_ckpt = latest_checkpoint(run_dir / "checkpoints") if args.resume else None
    if args.resume and resume_ckpt is None:
        print(f"fastrl: --resume: no checkpoint in {run_dir / 'checkpoints'}; starting from scratch")

    from fastrl.runner.runner import Runner

    return Runner(cfg, spec, run_dir, resume_ckpt).run()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "train":
        return cmd_train(args)
    return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
