"""fp32 against bf16 for a preset's own network on this CPU: what `model.precision: auto` decides.

    python bench/precision_microbench.py --config configs/atari_pong.yaml [--batch 64] [--repeats 7]

Times, with the learner's and inference worker's single torch thread, one training step of a
minibatch (forward, backward, Adam) on the learner's model and one inference forward with action
sampling on the model as an inference worker holds it, for each precision alternately; prints
medians in CPU µs per sample (the thread's own time, so other load on the host does not count)
and the CPU's bf16 flags. On an AVX2-only CPU emulated bf16 is an order of magnitude slower; with
AVX-512 BF16 or AMX it wins.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastrl.algo.adam import Adam
from fastrl.config import load_config
from fastrl.config.hardware import BF16_CPU_FLAGS, cpu_flags, resolve_precision, with_precision
from fastrl.envs import resolve_env
from fastrl.models import seeded_model
from fastrl.workers.learner import build_learner_model


def observations(spec, batch: int) -> torch.Tensor:
    if spec.is_image:
        return torch.randint(0, 256, (batch, *spec.obs_shape), dtype=torch.uint8)
    return torch.randn(batch, *spec.obs_shape)


def time_precision(cfg, spec, precision: str, batch: int, repeats: int) -> tuple[float, float]:
    """(training µs per sample, inference µs per sample): CPU time of the one thread, medians over
    `repeats` calls. Training times the learner's model; inference the model as an inference worker
    holds it (eval, channels-last, conv and linear weights kept in bf16), forward and action sampling."""
    cfg = with_precision(cfg, precision)
    torch.manual_seed(0)
    model = build_learner_model(spec, cfg)
    adam = Adam(model.parameters(), lr=1e-4, eps=1e-5)
    actor = seeded_model(spec, cfg.model, 0).for_inference()
    obs = observations(spec, batch)
    train_s, infer_s = [], []
    for _ in range(repeats + 1):  # the first call of each warms oneDNN's kernels up and is dropped
        started = time.thread_time()
        params, values = model(obs)
        loss = params.square().mean() + values.square().mean()
        adam.zero_grad(set_to_none=True)
        loss.backward()
        adam.step()
        train_s.append(time.thread_time() - started)
        with torch.inference_mode():
            started = time.thread_time()
            actor.sample(actor(obs)[0])
            infer_s.append(time.thread_time() - started)
    return (1e6 * statistics.median(train_s[1:]) / batch, 1e6 * statistics.median(infer_s[1:]) / batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--batch", type=int, default=64, help="samples per call (the Pong preset's minibatch)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2, help="fp32/bf16 alternations")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config)
    spec = resolve_env(cfg.env)
    flags = cpu_flags() or set()
    print(f"CPU bf16 flags: {sorted(f for f in BF16_CPU_FLAGS if f in flags) or 'none'}; "
          f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}; "
          f"model.precision=auto resolves to {resolve_precision('auto', 'cpu')}")
    results: dict[str, list] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        for precision in results:
            results[precision].append(time_precision(cfg, spec, precision, args.batch, args.repeats))
    rows = {p: tuple(statistics.median(r[i] for r in runs) for i in range(2)) for p, runs in results.items()}
    print(f"{'CPU µs per sample, batch ' + str(args.batch):<28}{'fp32':>10}{'bf16':>10}{'bf16/fp32':>11}")
    for i, name in enumerate(("train (fwd+bwd+Adam)", "inference (fwd+sample)")):
        fp32, bf16 = rows["fp32"][i], rows["bf16"][i]
        print(f"{name:<28}{fp32:>10,.0f}{bf16:>10,.0f}{bf16 / fp32:>10.2f}x")


if __name__ == "__main__":
    main()
