"""Children spawned before the runner's setup, so that their `import torch` overlaps it.

On the path from the command to the first sample an inference worker's `import torch` (~3 CPU-s on
the AVX2 EPYC) is one of the two longest links (the other: rollout worker 0 making its first
envs), and it used to start only after the runner had probed the env (~0.5 s for Atari: envpool's
spec and one env) and allocated shared memory, with one core idle meanwhile. A warm child is
spawned as soon as the config passes its checks: it names itself, dies with its parent, imports
torch and its loop, and waits on a pipe for the (role, index, context, loop) that `child_main`
takes, which the supervisor sends where it would otherwise have spawned the worker.
Pong on the AVX2 EPYC, command to first sample, 12 alternated runs each: median 5.41 -> 5.06 s
(bench/README, "Pong's first sample"). Rollout workers spawned warm as well were slower (median
5.50 against 5.15 with inference alone, 5 runs each): their imports took the core the runner's
setup needed, and rollout worker 0 makes its envs only once it has its slots anyway.

The warm children are the inference workers, and the learner of a fresh run whose rollout workers
act themselves: it builds the starting network, which they wait for (fastrl.workers.first_weights).
Only a worker's first start is warm: a replacement is spawned the ordinary way. A warm child the
runner never starts (a bad env id, a run directory that exists) is terminated; it has attached
nothing yet.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection

from fastrl.config.schema import Config
from fastrl.workers.first_weights import LEARNER, first_weights_builder
from fastrl.workers.process import (child_env_overrides, child_environment, process_name,
                                    terminal_signals_ignored_from_birth, warm_child_main)

# what each warm role's loop imports anyway (the learner's module imports torch)
WARM_IMPORTS = {"inference": ("fastrl.workers.inference", "torch"), "learner": ("fastrl.workers.learner",)}
CLOSE_JOIN_S = 2.0


def warm_children(cfg: Config, resuming: bool) -> list[tuple[str, int]]:
    """The (role, index) a run of `cfg` can spawn warm: its inference workers, and its learner when
    that builds the starting weights; none in a serial run."""
    if cfg.system.serial:
        return []
    roles = [("inference", index) for index in range(cfg.sampler.num_inference_workers)]
    if first_weights_builder(cfg, resuming) == LEARNER:
        roles.append(("learner", 0))
    return roles


class WarmChildren:
    """Spawned, importing, and waiting for their context; `take` hands one to the supervisor."""

    def __init__(self, resuming: bool = False):
        # a resumed run's runner publishes its checkpoint's weights; its learner starts cold
        self.resuming = resuming
        self._waiting: dict[tuple[str, int], tuple[mp.Process, Connection]] = {}

    def spawn(self, cfg: Config) -> None:
        """Spawn the run's warm children (once the config is checked), each in the environment it
        would have been spawned in (child_env_overrides: libgomp reads it as torch loads)."""
        spawn = mp.get_context("spawn")
        for role, index in warm_children(cfg, self.resuming):
            reader, writer = spawn.Pipe(duplex=False)
            process = spawn.Process(target=warm_child_main, args=(role, index, WARM_IMPORTS[role], reader),
                                    name=process_name(role, index), daemon=True)
            with child_environment(child_env_overrides(cfg, role)), terminal_signals_ignored_from_birth():
                process.start()
            reader.close()  # the child holds the reading end now
            self._waiting[(role, index)] = (process, writer)

    def take(self, role: str, index: int, child_main_args: tuple) -> mp.Process | None:
        """Start the warm child for (role, index) with `child_main_args`; None when there is none
        (or it died while waiting), and the caller spawns the worker itself."""
        waiting = self._waiting.pop((role, index), None)
        if waiting is None:
            return None
        process, writer = waiting
        try:
            writer.send(child_main_args)
        except OSError:  # it died while importing: the pipe has no reader
            process.join(CLOSE_JOIN_S)
            return None
        finally:
            writer.close()
        return process

    def close(self) -> None:
        """Stop every child nobody took (the run ended before starting them). They have attached
        nothing and hold nothing but their imports, so they are simply terminated."""
        waiting, self._waiting = list(self._waiting.values()), {}
        for process, writer in waiting:
            writer.close()
            process.terminate()
        for process, _ in waiting:
            process.join(CLOSE_JOIN_S)
            if process.is_alive():
                process.kill()
                process.join(CLOSE_JOIN_S)

    def __len__(self) -> int:
        return len(self._waiting)
