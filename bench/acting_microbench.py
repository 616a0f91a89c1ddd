"""The acting forward of a preset's network: torch, numpy and fastrl_ext (sampler.acting_backend,
system.native_acting), 1 thread.

Each round runs `fastrl bench`'s infer stage (forward + action sampling of one split of
observations, as a rollout worker that acts does) for `--seconds` in each, alternately;
prints the median CPU µs per call and per observation, and the CPU seconds `import torch` costs a
fresh process (what a rollout worker acting in numpy skips).

    .venv/bin/python bench/acting_microbench.py --config configs/cartpole.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys

from fastrl.bench.components import bench_infer
from fastrl.config import load_config
from fastrl.config.checks import rollout_workers_act
from fastrl.envs import resolve_env
from fastrl.models.numpy_policy import unsupported_reason

CPU_S = "import resource; r = resource.getrusage(resource.RUSAGE_SELF); print(r.ru_utime + r.ru_stime)"


def _cpu_s_of(code: str) -> float:
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def import_torch_cpu_s(repeats: int = 3) -> float:
    return statistics.median(_cpu_s_of("import torch; " + CPU_S) - _cpu_s_of(CPU_S) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--seconds", type=float, default=3.0, help="per backend per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cfg = load_config(args.config, [])
    spec = resolve_env(cfg.env)
    reason = unsupported_reason(cfg, spec)
    if reason or not rollout_workers_act(cfg):
        sys.exit(f"this preset's rollout workers do not act in numpy: {reason or 'it has inference workers'}")
    def variant(backend: str, native: bool):
        return dataclasses.replace(cfg, sampler=dataclasses.replace(cfg.sampler, acting_backend=backend),
                                   system=dataclasses.replace(cfg.system, native_acting=native))

    # numpy runs in one fastrl_ext._acting call unless system.native_acting is off
    configs = {"torch": variant("torch", False), "numpy": variant("numpy", False), "native": variant("numpy", True)}
    per_core: dict[str, list[float]] = {b: [] for b in configs}
    batch = 0
    for _ in range(args.rounds):
        for name, c in configs.items():
            result = bench_infer(c, spec, args.seconds, lambda *_: None)
            assert result.detail["backend"] == c.sampler.acting_backend
            assert result.detail.get("native_acting", False) == (name == "native"), "fastrl_ext not built?"
            per_core[name].append(result.per_core)
            batch = result.detail["batch"]
    us = {b: batch * 1e6 / statistics.median(v) for b, v in per_core.items()}
    print(f"{cfg.env.id}, {cfg.model.hidden_sizes} {cfg.model.activation} MLP, batch {batch}, "
          f"{cfg.system.inference_threads} thread(s), medians of {args.rounds} rounds of {args.seconds:g} s")
    for name in configs:
        print(f"  {name}: {us[name]:8.1f} CPU us per call ({us[name] / batch:6.2f} per observation)")
    print(f"  numpy is {us['torch'] / us['numpy']:.2f}x torch; fastrl_ext is {us['numpy'] / us['native']:.2f}x numpy")
    print(f"  import torch in a fresh process: {import_torch_cpu_s():.2f} CPU-s")

if __name__ == "__main__":
    main()
