"""What denormal floats cost a trained network: the learner's batch and the inference worker's forward,
with system.flush_denormals off and on, on a run's checkpoint and real observations.

    python bench/denormals_microbench.py --run RUN_DIR [--rounds 3] [--batches 3] [--forwards 60]

`fastrl bench` times a network as a run starts it, on random observations, where no value is yet small
enough to be denormal (below 1.2e-38 in float32 and bf16). A trained network's small weights, gradients
and Adam moments are, and on Intel CPUs each vector operation on one takes a slow microcode assist. Each
measurement runs in a child process that sets system.flush_denormals before any thread starts (threads
inherit the setting and keep it; torch's OpenMP threads and the learner's shard threads live as long as
the process): the preset's learner, set up as `fastrl bench`'s learn stage sets it up, trains one batch
--batches times, CPU ms per batch (the process's, all its threads); then the acting network
(ActorCritic.for_inference, one torch thread) runs an inference batch, CPU µs per forward and draw, the
median of --forwards calls. Two cases: the starting weights on `fastrl bench`'s random observations, and
the run's newest checkpoint (weights and Adam state) on observations its env steps under random actions.
Cases and settings alternate, --rounds times; medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fastrl.bench.components import inference_batch_size, learner_on_synthetic_batch
from fastrl.bench.env_stage import random_actions
from fastrl.config.hardware import resolve_auto
from fastrl.config.loader import config_from_dict
from fastrl.envs import resolve_env
from fastrl.envs.vector import make_split
from fastrl.models import seeded_model
from fastrl.rundir.checkpoints import latest_checkpoint, load_checkpoint

WARMUP_STEPS = 200  # env steps before the first recorded one: past the reset frames


def stepped_observations(cfg, spec, steps: int, num_envs: int, seed: int = 1) -> torch.Tensor:
    """[steps, num_envs, *obs] observations of the run's env under uniformly random actions."""
    env = make_split(cfg.env, spec, num_envs, 1, seed)
    rng = np.random.default_rng(seed)
    env.reset()
    frames = []
    for t in range(WARMUP_STEPS + steps):
        env.send(random_actions(spec, num_envs, rng))
        obs = env.recv().obs
        if t >= WARMUP_STEPS:
            frames.append(torch.from_numpy(np.array(obs)))
    env.close()
    return torch.stack(frames)


def cpu_ms_per_batch(trainer, batch: dict, batches: int) -> float:
    times = []
    for _ in range(batches + 1):  # the first makes oneDNN's kernels and is not counted
        batch["policy_version"].fill_(trainer.policy_version)  # on-policy: nothing masked for lag
        started = time.process_time()
        trainer.train(batch)
        times.append(time.process_time() - started)
    return 1e3 * statistics.median(times[1:])


def cpu_us_per_forward(actor, obs: torch.Tensor, forwards: int) -> float:
    with torch.inference_mode():
        for _ in range(3):
            actor.sample(actor(obs)[0])
        times = []
        for _ in range(forwards):
            started = time.thread_time()
            actor.sample(actor(obs)[0])
            times.append(time.thread_time() - started)
    return 1e6 * statistics.median(times)


def measure(run: Path, trained: bool, flush: bool, batches: int, forwards: int) -> dict:
    """One case, one setting, in this (fresh) process."""
    saved = config_from_dict(json.loads((run / "config.json").read_text()))
    cfg = resolve_auto(dataclasses.replace(saved, system=dataclasses.replace(saved.system, flush_denormals=flush)))
    spec = resolve_env(cfg.env)
    trainer, batch = learner_on_synthetic_batch(cfg, spec)  # sets the flush before its threads start
    checkpoint = load_checkpoint(latest_checkpoint(run / "checkpoints")) if trained else None
    if trained:
        batch["obs"] = stepped_observations(cfg, spec, *batch["obs"].shape[:2])
        trainer.model.load_state_dict(checkpoint["model"])
        trainer.optimizer.load_state_dict(checkpoint["optimizer"])
        if trainer.bf16_copy is not None:
            trainer.bf16_copy.refresh()
    learner_ms = cpu_ms_per_batch(trainer, batch, batches)
    torch.set_num_threads(cfg.system.inference_threads)
    actor = seeded_model(spec, cfg.model, cfg.run.seed)
    if trained:
        actor.load_state_dict(checkpoint["model"])
    obs = batch["obs"].reshape(-1, *batch["obs"].shape[2:])[-inference_batch_size(cfg):]
    return {"learner_ms": learner_ms, "forward_us": cpu_us_per_forward(actor.for_inference(), obs, forwards),
            "forward_batch": len(obs), "precision": cfg.model.precision,
            "train_steps": None if checkpoint is None else int(checkpoint["train_steps"])}


CASES = {False: "starting weights, random observations (fastrl bench's)",
         True: "the run's checkpoint, observations of its env"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="a run folder (its config.json and checkpoints/)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--forwards", type=int, default=60)
    parser.add_argument("--child", nargs=2, type=int, metavar=("TRAINED", "FLUSH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    run = Path(args.run)
    if args.child:
        print(json.dumps(measure(run, *map(bool, args.child), args.batches, args.forwards)))
        return
    if latest_checkpoint(run / "checkpoints") is None:
        raise SystemExit(f"no checkpoint in {run / 'checkpoints'}")
    results: dict[tuple, list] = {}
    for _ in range(args.rounds):
        for trained in (False, True):
            for flush in (False, True):
                out = subprocess.run([sys.executable, __file__, "--run", str(run), "--batches", str(args.batches),
                                      "--forwards", str(args.forwards), "--child", str(int(trained)), str(int(flush))],
                                     capture_output=True, text=True, check=True).stdout
                results.setdefault((trained, flush), []).append(json.loads(out.splitlines()[-1]))
    first = results[(True, True)][0]
    print(f"{run}: checkpoint after {first['train_steps']} batches, {first['precision']}; medians of {args.rounds} "
          f"rounds, denormals kept -> flushed")
    for key, unit, what in (("learner_ms", "CPU ms per batch", "learner"),
                            ("forward_us", f"CPU µs per forward of {first['forward_batch']}", "acting")):
        for trained, case in CASES.items():
            kept, flushed = ([r[key] for r in results[(trained, f)]] for f in (False, True))
            print(f"  {what}, {case}: {statistics.median(kept):,.0f} -> {statistics.median(flushed):,.0f} {unit} "
                  f"({statistics.median(flushed) / statistics.median(kept):.2f}x; rounds "
                  f"{', '.join(f'{x:.0f}' for x in kept)} / {', '.join(f'{x:.0f}' for x in flushed)})")


if __name__ == "__main__":
    main()
