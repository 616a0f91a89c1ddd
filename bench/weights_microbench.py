"""An inference worker's weight refresh: through a private staging copy (`try_read` + `load_into`,
the GPU path) against straight from shared memory (`try_load`, the CPU path), CPU ms per refresh;
and the learner's publication (`publish`: one copy per run of tensors, strided ones through their
strides) against `torch.cat` of the tensors reshaped, what it did for channels-last weights before.
For a preset whose actors hold the network in bf16 (fastrl.workers.first_weights.acts_in_bf16), also
the bf16 acting block (system.publish_bf16): a refresh that loads bf16 as it is, and a publication of
the learner's bf16 copies of the weights (its optimizer's roundings) into that block alone.

    python bench/weights_microbench.py [--config configs/atari_pong.yaml] [--rounds 15]

The model is the preset's network as an inference worker holds it (eval, channels-last, bf16 layers
where the preset resolves to bf16). Between refreshes a 64 MiB pass evicts the caches, as a run's
envs and learner do in the ~30 ms between two publications. The two ways alternate, 1 thread.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fastrl.buffers.shm import ShmAllocator
from fastrl.buffers.weights import LayoutTensors, SharedWeights
from fastrl.config import load_config
from fastrl.envs import resolve_env
from fastrl.models import seeded_model
from fastrl.workers.first_weights import acts_in_bf16
from fastrl.workers.process import keep_freed_heap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/atari_pong.yaml")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keep_freed_heap(64)  # as a worker process does
    cfg = load_config(args.config)
    spec = resolve_env(cfg.env)
    learner_model = seeded_model(spec, cfg.model, 1).use_channels_last()
    worker_model = seeded_model(spec, cfg.model, 2).for_inference()
    alloc, acting_alloc = ShmAllocator(), ShmAllocator()  # the acting block's own names
    try:
        weights = SharedWeights.allocate(alloc, learner_model)
        weights.publish(learner_model, version=1)
        staging = weights.new_staging()
        evict = torch.empty(64 << 20, dtype=torch.uint8)
        # an acting block where the preset's actors act in bf16
        acting = (SharedWeights.allocate(acting_alloc, learner_model, acting_bf16=True)
                  if acts_in_bf16(cfg, spec, learner_model) else None)
        if acting is not None:
            acting.publish(learner_model, version=1)

        def via_staging():
            weights.try_read(staging)
            weights.load_into(worker_model, staging)

        def direct():
            weights.try_load(worker_model)

        ways = {"staging copy (try_read + load_into)": via_staging, "straight from shm (try_load)": direct}
        if acting is not None:
            ways["bf16 from the acting block (try_load)"] = lambda: acting.try_load(worker_model)
        cpu_s: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds + 1):  # the first round warms up and is dropped
            for name, refresh in ways.items():
                evict.add_(1)
                started = time.thread_time()
                refresh()
                cpu_s[name].append(time.thread_time() - started)
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in worker_model.parameters()})
        print(f"{args.config}: {weights.data.array.nbytes / 2**20:.1f} MiB of fp32 weights into "
              f"{'/'.join(dtypes)} layers, caches evicted before each refresh, {args.rounds} rounds")
        medians = {name: 1e3 * statistics.median(v[1:]) for name, v in cpu_s.items()}
        first = next(iter(medians.values()))
        for name, ms in medians.items():
            print(f"  {name:<38} {ms:7.3f} CPU ms per refresh ({ms / first:.2f}x the first)")
        _time_publication(weights, acting, learner_model, evict, args.rounds)
    finally:
        alloc.unlink_all()
        acting_alloc.unlink_all()


def _time_publication(weights: SharedWeights, acting: SharedWeights | None, model: torch.nn.Module,
                      evict: torch.Tensor, rounds: int) -> None:
    tensors = LayoutTensors(model, weights.layout).tensors()  # what publish writes, in the block's order
    block = torch.from_numpy(weights.data.array)

    def through_cat():
        with torch.no_grad():
            torch.cat([t.reshape(-1) for t in tensors], out=block)

    ways = {"torch.cat of the tensors reshaped": through_cat,
            "publish (copies through strides)": lambda: weights.publish(model, version=2)}
    if acting is not None:  # the learner's bf16 working copy, as its optimizer leaves it (channels-last convs)
        copies = [t.detach().to(torch.bfloat16) for t in tensors]
        ways["publish bf16 copies to the acting block"] = lambda: acting.publish(model, version=2, acting_tensors=copies)
    wall_s: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds + 1):
        for name, write in ways.items():
            evict.add_(1)
            started = time.perf_counter()
            write()
            wall_s[name].append(time.perf_counter() - started)
    strided = sum(not t.is_contiguous() for t in tensors)
    print(f"the learner's publication of the same model ({strided} strided tensors), caches evicted before each:")
    for name, v in wall_s.items():
        print(f"  {name:<38} {1e6 * statistics.median(v[1:]):7.0f} µs per publication")


if __name__ == "__main__":
    main()
