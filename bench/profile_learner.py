"""Where the learner's time goes per optimizer step, by phase, at a preset's sizes (1 process, no workers).

    python bench/profile_learner.py --config configs/cartpole.yaml [--set algo.native_loss=false] [--seconds 10]
    python bench/profile_learner.py --config configs/atari_pong.yaml --set system.learner_shards=1 [--torch-optimizer]

Trains the preset's network with its optimizer settings on `fastrl bench`'s synthetic batch (the
learn stage's), wrapping each phase of `APPOTrainer.train` in a timer: the network's forward, the
distribution's log-prob and entropy, V-trace, the loss, backward, gradient clipping, Adam; "other"
is the rest of the loop (minibatch gathers, statistics, the generator). Through the native chain
(algo.native_gradient) "log_prob" is the head's log-probs and entropies in one call, and "backward" the
head's and the layers' gradients. Through a bf16 working copy
(fastrl.algo.bf16_copy) "backward" is its autograd.grad, "grad_sum" the pieces summed into the fp32
gradients and "refresh" the copy's cast. Figures are wall microseconds per optimizer step, medians
over batches; the learner's torch threads and heap setting as configured. With learner shards the
phases of the two threads overlap and add up (`--set system.learner_shards=1` to attribute). The last line gives page faults and system time per batch (`--set
system.heap_keep_mib=0` shows glibc's defaults).
Timings on 2 shared cores drift by 20% between processes: compare variants in one run of this
script only through `--set`, or with `fastrl bench`'s learn stage via bench/side_by_side.py.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from collections import defaultdict
from types import SimpleNamespace

import torch

import fastrl.algo.appo as appo
import fastrl.algo.native_gradient as native_gradient
from fastrl.bench.components import learner_on_synthetic_batch
from fastrl.config.hardware import resolve_auto
from fastrl.config.loader import load_config
from fastrl.envs.spec import resolve_env

PHASES = ("forward", "log_prob", "entropy", "vtrace", "loss", "backward", "grad_sum", "clip", "adam", "refresh")


def timed(spent: dict, phase: str, fn):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[phase] += time.perf_counter() - started
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="SECTION.KEY=VALUE")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--torch-optimizer", action="store_true",
                        help="a bf16 working copy's gradient sum, clip and Adam in torch, not fastrl_ext._optim")
    args = parser.parse_args()
    cfg = resolve_auto(load_config(args.config, args.overrides))
    spec = resolve_env(cfg.env)
    trainer, batch = learner_on_synthetic_batch(cfg, spec)
    if args.torch_optimizer and trainer.bf16_copy is not None:
        trainer.bf16_copy.native = False

    spent: dict[str, float] = defaultdict(float)
    net, optimizer = trainer.net, trainer.optimizer  # net: the bf16 working copy where there is one
    net.forward = timed(spent, "forward", net.forward)
    net.log_prob = timed(spent, "log_prob", net.log_prob)
    net.entropy = timed(spent, "entropy", net.entropy)
    optimizer.step = timed(spent, "adam", optimizer.step)
    copy = trainer.bf16_copy
    if copy is not None:  # its gradients are taken with autograd.grad, not backward()
        copy.gradients = timed(spent, "backward", copy.gradients)
        copy.set_master_grads = timed(spent, "grad_sum", copy.set_master_grads)
        copy.refresh = timed(spent, "refresh", copy.refresh)
    # the trainer looks these up in its module at call time
    originals = {name: getattr(appo, name) for name in ("vtrace", "appo_loss", "clip_grad_norm", "clip_scale_of")}
    appo.vtrace = timed(spent, "vtrace", originals["vtrace"])
    appo.appo_loss = timed(spent, "loss", originals["appo_loss"])
    appo.clip_grad_norm = timed(spent, "clip", originals["clip_grad_norm"])
    appo.clip_scale_of = timed(spent, "clip", originals["clip_scale_of"])
    backward = torch.Tensor.backward
    torch.Tensor.backward = timed(spent, "backward", backward)
    # the native chain (algo.native_gradient) calls its pieces through its module's names: the layers'
    # forward and backward, the head's log-prob and entropy (forward) and its gradient (backward)
    chain_originals = {name: getattr(native_gradient, name)
                       for name in ("_mlp", "_policy_head", "_appo_loss", "vtrace")}
    mlp, head = chain_originals["_mlp"], chain_originals["_policy_head"]
    native_gradient._mlp = SimpleNamespace(forward=timed(spent, "forward", mlp.forward),
                                           backward=timed(spent, "backward", mlp.backward),
                                           normalize=mlp.normalize)  # the inputs: in "other"
    native_gradient._policy_head = SimpleNamespace(forward=timed(spent, "log_prob", head.forward),
                                                   backward=timed(spent, "backward", head.backward))
    loss = chain_originals["_appo_loss"].appo_loss
    native_gradient._appo_loss = SimpleNamespace(appo_loss=timed(spent, "loss", loss))
    native_gradient.vtrace = timed(spent, "vtrace", chain_originals["vtrace"])

    steps_per_batch = cfg.algo.num_epochs * cfg.algo.num_minibatches
    per_batch: list[dict] = []
    try:
        for _ in range(3):  # warm-up: allocator, first-call paths
            batch["policy_version"].fill_(trainer.policy_version)
            trainer.train(batch)
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            spent.clear()
            t0 = time.perf_counter()
            batch["policy_version"].fill_(trainer.policy_version)
            trainer.train(batch)
            total = time.perf_counter() - t0
            row = {p: spent[p] for p in PHASES}
            row["other"] = total - sum(row.values())
            row["total"] = total
            per_batch.append(row)
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        torch.Tensor.backward = backward
        for name, fn in originals.items():
            setattr(appo, name, fn)
        for name, value in chain_originals.items():
            setattr(native_gradient, name, value)

    print(f"{args.config} {' '.join(args.overrides)}: {cfg.algo.batch_size} samples x {cfg.algo.num_epochs} epoch(s) "
          f"in {cfg.algo.num_minibatches} minibatches ({cfg.algo.minibatch_unit}), {cfg.system.learner_threads} "
          f"thread(s); {len(per_batch)} batches")
    print(f"{'phase':<10}{'us per optimizer step':>24}{'share':>8}")
    total = statistics.median(r["total"] for r in per_batch)
    for phase in (*PHASES, "other", "total"):
        us = statistics.median(r[phase] for r in per_batch) / steps_per_batch * 1e6
        print(f"{phase:<10}{us:>24,.0f}{us / (total / steps_per_batch * 1e6):>8.0%}")
    n = max(len(per_batch), 1)
    print(f"per batch: {(usage1.ru_minflt - usage0.ru_minflt) / n:,.0f} page faults, "
          f"{(usage1.ru_stime - usage0.ru_stime) / n * 1e3:,.1f} ms of system time "
          f"(system.heap_keep_mib={cfg.system.heap_keep_mib})")


if __name__ == "__main__":
    main()
