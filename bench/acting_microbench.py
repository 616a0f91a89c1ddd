"""The acting forward of a preset's network, torch against numpy (sampler.acting_backend), 1 thread.

Each round times `--calls` forwards + action sampling of `--batch` observations in each backend,
alternately, from the same weights; prints the median µs per call and per observation, and the
CPU seconds `import torch` costs a fresh process (what a rollout worker acting in numpy skips).

    .venv/bin/python bench/acting_microbench.py --config configs/cartpole.yaml --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from fastrl.config import load_config
from fastrl.envs import resolve_env
from fastrl.models import ActorCritic
from fastrl.models.numpy_policy import NumpyPolicy, unsupported_reason


def import_torch_cpu_s(repeats: int = 3) -> float:
    code = "import resource, torch; r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"
    bare = "import resource; r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"
    run = lambda c: float(subprocess.run([sys.executable, "-c", c], capture_output=True, text=True).stdout)  # noqa: E731
    return statistics.median(run(code) - run(bare) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, default=16, help="observations per call (the preset's envs per split)")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config, [])
    spec = resolve_env(cfg.env)
    reason = unsupported_reason(cfg, spec)
    if reason:
        sys.exit(f"this preset cannot act in numpy: {reason}")
    model = ActorCritic(spec, cfg.model).eval()
    policy = NumpyPolicy.from_module(model, spec, cfg.model.activation)
    obs = np.random.default_rng(0).standard_normal((args.batch, *spec.obs_shape)).astype(np.float32)
    rng = np.random.default_rng(1)

    def torch_call():
        with torch.inference_mode():
            params, values = model(torch.from_numpy(obs))
            actions, log_probs = model.sample(params)
        return actions.numpy(), log_probs.numpy(), values.numpy()

    def numpy_call():
        params, values = policy.forward(obs)
        return (*policy.sample(params, rng), values)

    times: dict[str, list[float]] = {"torch": [], "numpy": []}
    for _ in range(args.rounds):
        for name, call in (("torch", torch_call), ("numpy", numpy_call)):
            for _ in range(50):
                call()
            t0 = time.perf_counter()
            for _ in range(args.calls):
                call()
            times[name].append((time.perf_counter() - t0) / args.calls * 1e6)
    t, n = statistics.median(times["torch"]), statistics.median(times["numpy"])
    print(f"{cfg.env.id}, {cfg.model.hidden_sizes} {cfg.model.activation} MLP, batch {args.batch}, "
          f"medians of {args.rounds} rounds x {args.calls} calls")
    print(f"  torch: {t:8.1f} us per call ({t / args.batch:6.2f} per observation)")
    print(f"  numpy: {n:8.1f} us per call ({n / args.batch:6.2f} per observation)  {t / n:.2f}x")
    print(f"  import torch in a fresh process: {import_torch_cpu_s():.2f} CPU-s")


if __name__ == "__main__":
    main()
