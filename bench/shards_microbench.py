"""One minibatch's loss and gradient on a preset's own network, several ways, alternated in one process:
one torch thread, `--shards` learner shards of one torch thread each (system.learner_shards), the same
pieces one after another on one thread, and as many OpenMP threads (system.learner_threads).

    python bench/shards_microbench.py --config configs/atari_pong.yaml [--shards 2] [--rounds 7] [--repeats 5]
    python bench/shards_microbench.py --config configs/atari_pong.yaml --whole-batch [--rounds 5]
    python bench/shards_microbench.py --config configs/atari_pong.yaml --rows-sweep [--rounds 5]
    python bench/shards_microbench.py --config configs/atari_pong.yaml --op-profile 8 --op-profile 64

Prints medians of wall and CPU ms per minibatch (`APPOTrainer._loss_and_gradient`, the learner's own
code, on the bench's synthetic batch; no optimizer step), or with `--whole-batch` per learner batch
(`APPOTrainer.train`: every minibatch, each one different, with the optimizer steps between them that
leave the caches cold, and the batch's no-grad forward). The pieces-in-turn variant splits the shards'
price into the pieces' own (smaller GEMMs, each reading the weights again) and the cost of running
them at once. For a bf16 network, one more variant runs the shards with autocast casting the fp32
weights for each piece instead of through the learner's bf16 working copy (fastrl.algo.bf16_copy), with
the per-round CPU ratio of the two. With `--whole-batch`, one more runs the shards on whole minibatches
in groups (algo.minibatches_per_weights = shards) instead of pieces of each. `--rows-sweep` times one
thread's forward + backward over minibatches of 8 to 128 rows and fits a line: its intercept is what
every piece pays whatever its size. `--op-profile ROWS` runs one thread's forward + backward at that
many rows under the torch profiler and prints the ops that took the most CPU, by input shapes, in
ms per call: which kernels make up that fixed part. Alone, the cores are all the learner's: in a run
the samplers share them, which is what `bench/side_by_side.py --stage train` measures.

A minibatch loop takes no optimizer step, so the learner's bf16 working copy (fastrl.algo.bf16_copy)
is marked as written by one (`hold_weights`): a training step's native Adam writes the copy and
skips the refresh cast, which the loop would otherwise pay at every call (~0.4 CPU-ms for Pong's
CNN, whatever the rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from fastrl.algo.appo import APPOTrainer
from fastrl.algo.shards import ShardPool
from fastrl.bench.components import synthetic_batch
from fastrl.config import load_config
from fastrl.config.hardware import resolve_auto
from fastrl.envs import resolve_env
from fastrl.workers.learner import build_learner_model


def hold_weights(trainer: APPOTrainer) -> APPOTrainer:
    """Cast the weights into the bf16 working copy once, and let later refreshes skip, as they do
    after a native optimizer step: the loops here take none, and would otherwise cast every call."""
    if trainer.bf16_copy is not None:
        trainer.bf16_copy.refresh()
        if trainer.bf16_copy.native:
            trainer.bf16_copy.written_by_step()
    return trainer


class PiecesInTurn(ShardPool):
    """The shards' pieces, run one after another on the calling thread."""

    def map(self, fn, items):
        return [fn(x) for x in items]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="SECTION.KEY=VALUE")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=None,
                        help="minibatches (default 5), or with --whole-batch batches (default 1), per round and variant")
    parser.add_argument("--whole-batch", action="store_true",
                        help="time APPOTrainer.train over the whole synthetic batch instead of one minibatch")
    parser.add_argument("--rows-sweep", action="store_true",
                        help="one thread's CPU ms per minibatch at 8-128 rows, and the fixed part per call")
    parser.add_argument("--op-profile", type=int, action="append", default=[], metavar="ROWS",
                        help="the ops of one thread's forward + backward at ROWS rows, by CPU (repeatable)")
    parser.add_argument("--top", type=int, default=14, help="with --op-profile: how many ops to print")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.whole_batch else 5)
    cfg = resolve_auto(load_config(args.config, ["algo.minibatch_unit=samples", *args.overrides]))
    spec = resolve_env(cfg.env)
    if args.rows_sweep:
        return rows_sweep(cfg, spec, args.rounds, args.repeats)
    if args.op_profile:
        return op_profile(cfg, spec, args.op_profile, args.top)
    trainer, batch = held_trainer_and_batch(cfg, spec, cfg.algo)
    mb, loss_fn = next(trainer._minibatches(batch))

    in_turn_name = f"{args.shards} pieces in turn"
    variants = {"1 thread": (trainer, 1, 1), f"{args.shards} shards": (trainer, 1, args.shards),
                in_turn_name: (trainer, 1, args.shards), f"{args.shards} OpenMP threads": (trainer, args.shards, 1)}
    whole_name = f"{args.shards} shards, whole minibatches"
    if args.whole_batch:
        torch.manual_seed(cfg.run.seed)
        variants[whole_name] = (APPOTrainer(build_learner_model(spec, cfg), dataclasses.replace(
            cfg.algo, minibatches_per_weights=args.shards), cfg.sampler.max_policy_lag), 1, args.shards)
    autocast_name = f"{args.shards} shards, autocast"
    if trainer.bf16_copy is not None:
        torch.manual_seed(cfg.run.seed)
        variants[autocast_name] = (APPOTrainer(build_learner_model(spec, cfg), cfg.algo, cfg.sampler.max_policy_lag,
                                               bf16_working_copy=False), 1, args.shards)
    wall: dict[str, list] = {name: [] for name in variants}
    cpu: dict[str, list] = {name: [] for name in variants}
    for round_ in range(args.rounds + 1):  # round 0 warms every variant up and is not counted
        for name, (variant_trainer, threads, shards) in variants.items():
            torch.set_num_threads(threads)
            variant_trainer.set_shards(shards)
            if name == in_turn_name:
                variant_trainer.pool = PiecesInTurn(shards)
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.repeats):
                if args.whole_batch:
                    # every batch fresh to the lag check: the trainer's version moves on with each
                    variant_trainer.train(dict(batch, policy_version=torch.full_like(
                        batch["policy_version"], variant_trainer.policy_version)))
                else:
                    variant_trainer._loss_and_gradient(mb, loss_fn)
            if round_:
                wall[name].append((time.perf_counter() - w0) / args.repeats * 1e3)
                cpu[name].append((time.process_time() - c0) / args.repeats * 1e3)
    for variant_trainer, _, _ in variants.values():
        variant_trainer.set_shards(1)
    unit = (f"batch of {batch['actions'].numel()} samples x {cfg.algo.num_epochs} epochs" if args.whole_batch
            else f"minibatch of {mb['actions'].shape[0]} samples")
    print(f"{args.config}: ms per {unit}, {cfg.model.precision}, medians of {args.rounds} rounds of {args.repeats}")
    for name in variants:
        print(f"  {name:<28} wall {statistics.median(wall[name]):8.1f} ms   CPU {statistics.median(cpu[name]):8.1f} ms")
    ratios = [t / o for t, o in zip(cpu[in_turn_name], cpu["1 thread"])]
    print(f"  CPU, pieces in turn / 1 thread, per round: {' '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")
    ratios = [s / t for s, t in zip(cpu[f"{args.shards} shards"], cpu[in_turn_name])]
    print(f"  CPU, shards / pieces in turn, per round: {' '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")
    if whole_name in variants:
        ratios = [w / s for w, s in zip(cpu[whole_name], cpu[f"{args.shards} shards"])]
        print(f"  CPU, whole minibatches / pieces on the shards, per round: {' '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f}")
    if autocast_name in variants:
        ratios = [c / a for c, a in zip(cpu[f"{args.shards} shards"], cpu[autocast_name])]
        print(f"  CPU, working copy / autocast, per round: {' '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f}")
    return 0


def held_trainer_and_batch(cfg, spec, algo) -> tuple[APPOTrainer, dict]:
    """A trainer with `algo`'s settings, its weights held (`hold_weights`), and the learn stage's
    synthetic batch with every valid sample trained on."""
    torch.manual_seed(cfg.run.seed)
    trainer = hold_weights(APPOTrainer(build_learner_model(spec, cfg), algo, cfg.sampler.max_policy_lag))
    batch = synthetic_batch(cfg, spec)
    return trainer, dict(batch, train_mask=batch["valid"].bool())


def one_thread_minibatch(cfg, spec, rows: int):
    """A trainer at minibatches of `rows` samples, and its first minibatch."""
    algo = dataclasses.replace(cfg.algo, num_minibatches=cfg.algo.batch_size // rows)
    trainer, batch = held_trainer_and_batch(cfg, spec, algo)
    return trainer, next(trainer._minibatches(batch))


def rows_sweep(cfg, spec, rounds: int, repeats: int) -> int:
    """CPU ms per minibatch forward + backward on one thread, at each size that divides the batch."""
    torch.set_num_threads(1)
    sizes = [rows for rows in (8, 16, 32, 64, 128) if cfg.algo.batch_size % rows == 0]
    runs = {rows: one_thread_minibatch(cfg, spec, rows) for rows in sizes}
    cpu: dict[int, list] = {rows: [] for rows in sizes}
    for round_ in range(rounds + 1):  # round 0 warms up
        for rows, (trainer, (mb, loss_fn)) in runs.items():
            c0 = time.process_time()
            for _ in range(repeats):
                trainer._loss_and_gradient(mb, loss_fn)
            if round_:
                cpu[rows].append((time.process_time() - c0) / repeats * 1e3)
    medians = {rows: statistics.median(v) for rows, v in cpu.items()}
    slope, intercept = statistics.linear_regression(list(medians), list(medians.values()))
    print(f"{cfg.env.id}: one thread's loss + gradient per minibatch, {cfg.model.precision}, "
          f"CPU ms, medians of {rounds} rounds of {repeats}")
    for rows, ms in medians.items():
        print(f"  {rows:>4} rows  {ms:7.2f} ms  {ms / rows * 1e3:6.0f} us/row")
    print(f"  least squares: {intercept:.2f} ms per call + {slope * 1e3:.0f} us per row")
    return 0


def op_profile(cfg, spec, sizes: list, top: int, calls: int = 30) -> int:
    """The torch profiler over `calls` forward + backward passes at each size, caches warm (the same
    minibatch again): the ops with the most self CPU, with their input shapes, in ms per call."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    for rows in sizes:
        if rows < 1 or cfg.algo.batch_size % rows:
            raise SystemExit(f"--op-profile {rows}: the batch ({cfg.algo.batch_size}) must split into minibatches of it")
        trainer, (mb, loss_fn) = one_thread_minibatch(cfg, spec, rows)
        for _ in range(5):
            trainer._loss_and_gradient(mb, loss_fn)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(calls):
                trainer._loss_and_gradient(mb, loss_fn)
        ops = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: e.self_cpu_time_total, reverse=True)
        total_ms = sum(e.self_cpu_time_total for e in ops) / 1e3 / calls
        print(f"{cfg.env.id}, {rows} rows, {cfg.model.precision}: {total_ms:.2f} CPU-ms per forward + backward "
              f"(self time of all ops, {calls} calls, 1 thread); the top {top}:")
        for e in ops[:top]:
            shapes = ", ".join(str(s) for s in e.input_shapes if s)
            print(f"  {e.self_cpu_time_total / 1e3 / calls:7.3f} ms  {e.count // calls:>3} x {e.key:<28} {shapes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
