"""The acting CNN's forward with oneDNN-packed weights (fastrl.models.packed_cnn) against torch's eager
forward, and what packing costs per weights version: CPU ms per call, 1 thread, alternated rounds.
Also the direct forward (packed_cnn.direct_forward, the eager network's calls without its modules, what an
inference worker runs when it does not pack) and its own re-cut per version.

    python bench/packed_microbench.py [--config configs/atari_pong.yaml] [--batch 16 --batch 32] [--rounds 7]

The network is the preset's as an inference worker holds it (eval, channels-last, bf16 layers where
the preset resolves to bf16). A repack is timed after a 64 MiB pass evicts the caches, as a run's envs
and learner do between two publications. The last column is the forward's saving divided by a
repack's cost: the weight loads per forward above which repacking at every load costs more than
packing saves (a Pong inference worker in training loads on about every other forward; sampling
alone, never).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastrl.config import load_config
from fastrl.config.checks import inference_batch_size
from fastrl.envs import resolve_env
from fastrl.models import seeded_model
from fastrl.models.packed_cnn import direct_forward, packed_forward
from fastrl.workers.process import keep_freed_heap


def cpu_ms(fn, calls: int) -> float:
    fn()
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/atari_pong.yaml")
    parser.add_argument("--batch", type=int, action="append", help="forward batch (default: 16 and the infer stage's)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=60, help="forwards per variant per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_heap(256)  # as a worker process does
    cfg = load_config(args.config)
    spec = resolve_env(cfg.env)
    model = seeded_model(spec, cfg.model, 1).for_inference()
    hint = inference_batch_size(cfg)
    packed, direct = packed_forward(model, spec.obs_shape, hint), direct_forward(model, spec.obs_shape)
    if packed is None or direct is None:
        raise SystemExit(f"{args.config}: no packed forward for this network on this torch (an MLP, or no oneDNN ops)")
    batches = args.batch or sorted({16, hint})
    gen = torch.Generator().manual_seed(0)
    evict = torch.empty(64 << 20, dtype=torch.uint8)
    print(f"{args.config}: {model.actor_encoder.input_dtype} layers, packing tuned for batch {hint}, "
          f"{args.rounds} rounds of {args.calls} calls, CPU ms per call")
    print(f"{'batch':>5} {'eager':>8} {'direct':>8} {'ratio':>7} {'re-cut':>8} {'packed':>8} {'ratio':>7} "
          f"{'repack':>8} {'break-even loads/forward':>25}")
    for batch in batches:
        obs = torch.randint(0, 256, (batch, *spec.obs_shape), dtype=torch.uint8, generator=gen)
        eager, straight, fast, direct_ratios, ratios, recuts, repacks = [], [], [], [], [], [], []
        with torch.inference_mode():
            for _ in range(args.rounds):
                e = cpu_ms(lambda: model(obs), args.calls)
                d = cpu_ms(lambda: direct(obs), args.calls)
                p = cpu_ms(lambda: packed(obs), args.calls)
                eager.append(e)
                straight.append(d)
                fast.append(p)
                direct_ratios.append(d / e)
                ratios.append(p / e)
                for forward, costs in ((packed, repacks), (direct, recuts)):
                    for _ in range(5):
                        evict.fill_(1)
                        start = time.thread_time()
                        forward.repack()
                        costs.append((time.thread_time() - start) * 1e3)
        e, d, p = statistics.median(eager), statistics.median(straight), statistics.median(fast)
        c, r = statistics.median(recuts), statistics.median(repacks)
        print(f"{batch:>5} {e:>8.3f} {d:>8.3f} {statistics.median(direct_ratios):>6.3f}x {c:>8.3f} {p:>8.3f} "
              f"{statistics.median(ratios):>6.3f}x {r:>8.3f} {(e - p) / r:>25.2f}")


if __name__ == "__main__":
    main()
