"""The learner's work between a bf16 backward and the next forward, in torch against with
fastrl_ext._optim (fastrl.algo.bf16_copy, fastrl.algo.adam), CPU ms per optimizer step, 1 thread,
alternated.

    python bench/optim_microbench.py [--config configs/atari_pong.yaml] [--pieces 2] [--rounds 25]
    OMP_WAIT_POLICY=PASSIVE python bench/optim_microbench.py --learner [--config configs/atari_pong.yaml] [--rounds 15]
    python bench/optim_microbench.py --learner-pieces [--config configs/atari_pong.yaml] [--rounds 8] [--seconds 3]

torch: the pieces cast-copied and added into the fp32 .grad, the clip's norm and scale, Adam (its
fused kernel), then the bf16 copy refreshed from the new weights. fastrl_ext: the pieces summed with
their sum of squares in one pass, then one Adam pass that applies the clip's scale and writes the
new weights into the bf16 copy too (its refresh is then a no-op). fastrl_ext on pieces: the pieces'
sum of squares without writing their sum, then the Adam pass summing them again as it reads them
(no .grad; what the learner runs, Bf16WorkingCopy.gradient_pieces). Caches are evicted before each
step, as the backward that precedes it leaves them. With `--learner-pieces`, the preset's learner as
`fastrl bench`'s learn stage sets it up (its shards too) trains its synthetic batch with Adam's native
step on the summed .grad and on the pieces, in alternated rounds (fastrl.bench.measure): the process's
CPU ms per batch. With `--learner`, the preset's whole learner (as `fastrl bench`'s learn stage sets it
up) trains its synthetic batch with fastrl_ext._optim off and on in alternate rounds: CPU and wall s per
batch. For a bf16 learner that switches the working copy's gradient sum, clip and Adam; for a fp32 one,
Adam and (parameters kept apart, as the CNN's are) the clip's sum of squares.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import fastrl.algo.appo as appo
from fastrl.algo.adam import Adam
from fastrl.algo.bf16_copy import Bf16WorkingCopy
from fastrl.algo.grad_clip import clip_grad_norm, clip_scale_of
from fastrl.bench.measure import alternated_learner_cpu_ms
from fastrl.bench.report import learner_ab_lines, learner_setup
from fastrl.config import load_config
from fastrl.config.hardware import resolve_auto, with_precision
from fastrl.envs import resolve_env
from fastrl.workers.learner import build_learner_model
from fastrl.workers.process import torch_process_settings
from fastrl_ext import _optim


def step_ab(cfg, spec, pieces_count: int, rounds: int) -> None:
    model = build_learner_model(spec, cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    adam = Adam(params, lr=cfg.algo.lr, eps=cfg.algo.adam_eps)
    copies = {"torch": Bf16WorkingCopy(model, native=False), "fastrl_ext": Bf16WorkingCopy(model, native=True)}
    gen = torch.Generator().manual_seed(0)
    pieces = [tuple(torch.randn(p.shape, generator=gen).to(torch.bfloat16).to(memory_format=_layout(q)) * 0.01
                    for p, q in zip(params, copies["torch"].params)) for _ in range(pieces_count)]
    evict = torch.empty(64 << 20, dtype=torch.uint8)
    max_norm = cfg.algo.max_grad_norm

    def torch_step(copy):
        copy.set_master_grads(pieces)
        clip_grad_norm(params, max_norm)
        adam.step()
        copy.refresh()

    def native_step(copy):
        sum_sq = copy.set_master_grads(pieces)
        if adam.step(clip_scale_of(sum_sq ** 0.5, max_norm), copy.params):  # as the trainer does
            copy.written_by_step()
        copy.refresh()

    def pieces_step(copy):
        sum_sq, views = copy.gradient_pieces(pieces)
        adam.step(clip_scale_of(sum_sq ** 0.5, max_norm), copy.params, views)
        copy.written_by_step()
        copy.refresh()

    copies["fastrl_ext on pieces"] = Bf16WorkingCopy(model, native=True)
    steps = {"torch": torch_step, "fastrl_ext": native_step, "fastrl_ext on pieces": pieces_step}
    cpu_ms: dict[str, list] = {name: [] for name in steps}
    for round_ in range(rounds + 1):  # round 0 warms both up and is not counted
        for name, step in steps.items():
            adam.zero_grad(set_to_none=True)
            evict.add_(1)
            started = time.thread_time()
            step(copies[name])
            if round_:
                cpu_ms[name].append(1e3 * (time.thread_time() - started))
    n = sum(p.numel() for p in params)
    print(f"{n:,} parameters, {pieces_count} bf16 piece(s), fastrl_ext._optim as {_optim.ISA}; "
          f"CPU ms per optimizer step (grad sum, clip, Adam, copy refresh), medians of {rounds} alternated rounds")
    for name, values in cpu_ms.items():
        print(f"  {name:<20} {statistics.median(values):7.3f}")
    for after, before in (("fastrl_ext", "torch"), ("fastrl_ext on pieces", "fastrl_ext")):
        ratios = [b / a for a, b in zip(cpu_ms[before], cpu_ms[after])]
        print(f"  {after} / {before} per round: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


def _layout(p: torch.Tensor):
    return torch.channels_last if p.dim() == 4 and not p.is_contiguous() else torch.contiguous_format


def learner_ab(cfg, spec, rounds: int) -> None:
    from fastrl.bench.components import learner_on_synthetic_batch

    trainer, batch = learner_on_synthetic_batch(cfg, spec)
    if trainer.bf16_copy is not None:  # the copy's gradient sum, the clip's norm and Adam
        def use_native(on): trainer.bf16_copy.native = on
    else:  # a fp32 network: Adam, and the clip's norm where its parameters are kept apart (Adam.grad_sum_squares)
        def use_native(on): trainer.optimizer.native = on
    # the step's own part of each batch, timed where it runs: the clip's norm (torch's, or Adam's native sum
    # of squares) and Adam; a bf16 copy's native sum comes with its gradients and is not in it
    in_step = [0.0]

    def timed(fn):
        def call(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                in_step[0] += time.perf_counter() - started
        return call
    trainer.optimizer.step = timed(trainer.optimizer.step)
    trainer.optimizer.grad_sum_squares = timed(trainer.optimizer.grad_sum_squares)
    appo.clip_grad_norm = timed(appo.clip_grad_norm)
    cpu_s: dict[str, list] = {"torch": [], "fastrl_ext": []}
    wall_s: dict[str, list] = {"torch": [], "fastrl_ext": []}
    step_ms: dict[str, list] = {"torch": [], "fastrl_ext": []}
    for round_ in range(rounds + 1):  # round 0 warms both up and is not counted
        for name in cpu_s:
            use_native(name == "fastrl_ext")
            batch["policy_version"].fill_(trainer.policy_version)
            in_step[0] = 0.0
            started, started_wall = time.process_time(), time.perf_counter()
            trainer.train(batch)
            if round_:
                cpu_s[name].append(time.process_time() - started)
                wall_s[name].append(time.perf_counter() - started_wall)
                step_ms[name].append(1e3 * in_step[0])
    print(f"learner per batch ({cfg.model.precision}, {cfg.system.learner_threads} thread(s), "
          f"{cfg.system.learner_shards} shard(s)), medians of {rounds} alternated rounds: CPU s, wall s, "
          f"wall ms in clip + Adam")
    for name, values in cpu_s.items():
        print(f"  optimizer step by {name:<11} {statistics.median(values):.4f}  {statistics.median(wall_s[name]):.4f}"
              f"  {statistics.median(step_ms[name]):7.1f}")
    for label, spent in (("CPU", cpu_s), ("wall", wall_s)):
        ratios = [b / a for a, b in zip(spent["torch"], spent["fastrl_ext"])]
        print(f"  {label} fastrl_ext / torch per round: {' '.join(f'{r:.3f}' for r in ratios)}; "
              f"median {statistics.median(ratios):.3f}")


def pieces_ab(config: str, cfg, spec, rounds: int, seconds: float) -> None:
    from fastrl.bench.components import learner_on_synthetic_batch

    trainer, batch = learner_on_synthetic_batch(cfg, spec)
    if trainer.bf16_copy is None or not trainer.bf16_copy.native:
        raise SystemExit("--learner-pieces compares a bf16 learner's native optimizer steps: this preset's "
                         "learner has no bf16 working copy, or algo.native_optimizer is off")
    before, after = "summed into .grad", "Adam on the pieces"
    learners = {before: (trainer, batch, lambda: setattr(trainer, "step_on_pieces", False)),
                after: (trainer, batch, lambda: setattr(trainer, "step_on_pieces", True))}
    # the process's CPU: the learner's shards run on two threads
    spent = alternated_learner_cpu_ms(learners, rounds, seconds, clock=time.process_time)
    print("\n".join(learner_ab_lines(config, _optim.ISA, spent, before, after, learner_setup(cfg, trainer))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/atari_pong.yaml")
    parser.add_argument("--pieces", type=int, default=2, help="bf16 gradient pieces (the learner's shards)")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--learner", action="store_true", help="A/B the preset's whole learner batch instead")
    parser.add_argument("--learner-pieces", action="store_true",
                        help="A/B the preset's learner with Adam on the summed .grad and on the gradient pieces")
    parser.add_argument("--seconds", type=float, default=3.0, help="each round's stretch with --learner-pieces")
    args = parser.parse_args()
    cfg = resolve_auto(load_config(args.config, []))
    spec = resolve_env(cfg.env)
    if args.learner_pieces:
        pieces_ab(args.config, cfg, spec, args.rounds, args.seconds)
        return
    if args.learner:
        learner_ab(cfg, spec, args.rounds)
        return
    torch.set_num_threads(1)
    torch_process_settings(cfg.system)  # as the learner process sets itself up
    step_ab(with_precision(cfg, "bf16"), spec, args.pieces, args.rounds)


if __name__ == "__main__":
    main()
