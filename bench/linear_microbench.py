"""The CNN's hidden layer with its weight on the left of the product (fastrl.models.linear) against
`F.linear`: CPU µs per call, 1 thread, the caches evicted before every call, the two alternated.

    python bench/linear_microbench.py [--config configs/atari_pong.yaml] [--rows 16 --rows 32] [--calls 41]

First the layer alone, in bf16 and fp32, at each row count whether or not `weight_left_pays` would
choose it (that table is where the rule comes from); then the preset's whole acting forward
(`for_inference`, as an inference worker holds it) with the layer as shipped against the same
network with a plain nn.Linear holding the same parameters.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from fastrl.config import load_config
from fastrl.envs import resolve_env
from fastrl.models import seeded_model
from fastrl.models.linear import WeightLeftLinear, weight_left_pays

DEFAULT_ROWS = [1, 8, 16, 17, 20, 32, 33, 48, 64, 96, 128]


def alternated_us(fns: list, calls: int, evict: torch.Tensor) -> list[float]:
    """Median CPU µs per call of each fn, calls alternated in turn order and evicted before each."""
    times = [[] for _ in fns]
    for call in range(calls):
        order = range(len(fns)) if call % 2 else reversed(range(len(fns)))
        for i in order:
            evict.fill_(1)
            start = time.thread_time_ns()
            fns[i]()
            times[i].append(time.thread_time_ns() - start)
    return [statistics.median(t[1:]) / 1e3 for t in times]


def layer_table(in_dim: int, out_dim: int, rows: list[int], calls: int, evict: torch.Tensor) -> None:
    print(f"the layer alone ({out_dim} x {in_dim}), CPU µs per call; weight left / F.linear")
    print(f"{'dtype':>9} {'rows':>5} {'F.linear':>9} {'left':>9} {'ratio':>7}  chosen")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        w = torch.randn(out_dim, in_dim, generator=gen).to(dtype)
        b = torch.randn(out_dim, generator=gen).to(dtype)
        for r in rows:
            x = torch.randn(r, in_dim, generator=gen).to(dtype)
            with torch.inference_mode():
                plain, left = alternated_us([lambda: F.linear(x, w, b),
                                             lambda: torch.addmm(b.unsqueeze(1), w, x.t()).t()], calls, evict)
            chosen = "left" if weight_left_pays(r, dtype) else "F.linear"
            print(f"{str(dtype).removeprefix('torch.'):>9} {r:>5} {plain:>9.1f} {left:>9.1f} {left / plain:>6.3f}x  {chosen}")


def network_table(cfg_path: str, rows: list[int], calls: int, evict: torch.Tensor) -> None:
    cfg = load_config(cfg_path)
    spec = resolve_env(cfg.env)
    model = seeded_model(spec, cfg.model, 1).for_inference()
    layer = getattr(model.actor_encoder, "fc", [None])[0]
    if not isinstance(layer, WeightLeftLinear):
        print(f"{cfg_path}: no CNN hidden layer to compare")
        return
    plain = copy.deepcopy(model)
    old = plain.actor_encoder.fc[0]
    new = nn.Linear(old.in_features, old.out_features, dtype=old.weight.dtype)
    new.weight, new.bias = old.weight, old.bias
    plain.actor_encoder.fc[0] = new
    print(f"\n{cfg_path}'s acting forward ({model.actor_encoder.input_dtype}), CPU µs per call")
    print(f"{'rows':>5} {'nn.Linear':>10} {'shipped':>10} {'ratio':>7}")
    gen = torch.Generator().manual_seed(1)
    for r in rows:
        obs = torch.randint(0, 256, (r, *spec.obs_shape), dtype=torch.uint8, generator=gen)
        with torch.inference_mode():
            base, shipped = alternated_us([lambda: plain(obs), lambda: model(obs)], calls, evict)
        print(f"{r:>5} {base:>10.1f} {shipped:>10.1f} {shipped / base:>6.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/atari_pong.yaml")
    parser.add_argument("--rows", type=int, action="append", help=f"batch rows (default: {DEFAULT_ROWS})")
    parser.add_argument("--calls", type=int, default=41, help="calls per variant per row count")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = args.rows or DEFAULT_ROWS
    evict = torch.empty(64 << 20, dtype=torch.uint8)  # a run's envs and learner pass between two calls
    layer_table(3136, 512, rows, args.calls, evict)
    network_table(args.config, [r for r in rows if r <= 64], args.calls, evict)


if __name__ == "__main__":
    main()
