"""Microbenchmark of an inference worker's action draw after its torch forward: torch's (log_softmax,
multinomial, gather, the copies out) against fastrl_ext._acting.sample_categorical written straight
into the slot cells (TorchForward.act_into).

    python bench/draw_microbench.py [--rounds 5] [--seconds 1] [--json draw_micro.json]

One call takes a forward's logits [B, A] and values [B] as torch tensors, as the network returns them,
and leaves actions, log-probs and values in the request's slot cells: for Pong's inference worker, one
or two groups of 16 envs and 6 actions; Breakout's 4 actions alike. Both sides include what the
worker does after the forward: the torch side its `.numpy()` copies and the writes into each group's
cells, the native side the uniforms' draw from numpy's Generator. Alternated --rounds times for
--seconds each; medians of µs per call, warm caches (the run's calls come colder, so they gain more).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

import fastrl_ext
from fastrl.bench.measure import alternated_us_per_call, microbench_args, write_json

SHAPES = {  # label: (rows per group, groups, actions)
    "Pong, 1 group of 16 x 6 actions": (16, 1, 6),
    "Pong, 2 groups of 16 x 6 actions": (16, 2, 6),
    "Breakout, 2 groups of 16 x 4 actions": (16, 2, 4),
    "64 rows x 18 actions (full action set)": (64, 1, 18),
}


def draw_call(shape: tuple, native: bool) -> Callable[[], None]:
    rows, groups, num_actions = shape
    B = rows * groups
    gen = torch.Generator().manual_seed(0)
    logits, values = torch.randn(B, num_actions, generator=gen), torch.randn(B, generator=gen)
    cells = (np.zeros((groups, rows), np.int32), np.zeros((groups, rows), np.float32), np.zeros((groups, rows), np.float32))
    rng = np.random.default_rng(0)
    draw = fastrl_ext._acting.sample_categorical

    def torch_draw() -> None:  # TorchForward.__call__'s sample, then PolicyActor.act's copies into the cells
        with torch.inference_mode():
            log_p = torch.log_softmax(logits, dim=-1)
            actions = torch.multinomial(log_p.exp(), 1).squeeze(-1)
            log_probs = log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        a, lp, v = actions.cpu().numpy(), log_probs.cpu().numpy(), values.cpu().numpy()
        for g in range(groups):
            cells[0][g] = a[g * rows:(g + 1) * rows]
            cells[1][g] = lp[g * rows:(g + 1) * rows]
            cells[2][g] = v[g * rows:(g + 1) * rows]

    def native_draw() -> None:  # TorchForward.act_into's
        lg, v = np.ascontiguousarray(logits.numpy()), values.numpy()
        u = rng.random(B, dtype=np.float32)
        for g in range(groups):
            part = slice(g * rows, (g + 1) * rows)
            draw(lg[part], u[part], cells[0][g], cells[1][g])
            cells[2][g] = v[part]
    return native_draw if native else torch_draw


def main() -> None:
    args = microbench_args(__doc__.splitlines()[0])
    torch.set_num_threads(1)  # as an inference worker runs
    results: dict[str, dict] = {}
    for label, shape in SHAPES.items():
        calls = {"torch": draw_call(shape, False), "native": draw_call(shape, True)}
        results[label] = alternated_us_per_call(calls, args.rounds, args.seconds) | {"rows": shape[0] * shape[1]}
    print(f"{'shape':<42}{'torch us':>10}{'native us':>11}{'speed-up':>10}{'native ns/row':>15}")
    for label, r in results.items():
        print(f"{label:<42}{r['torch']:>10.1f}{r['native']:>11.2f}{r['torch'] / r['native']:>9.1f}x"
              f"{r['native'] * 1e3 / r['rows']:>15.0f}")
    write_json(args.json, results)


if __name__ == "__main__":
    main()
