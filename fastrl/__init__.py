"""fastrl: a single-machine, high-throughput asynchronous APPO/V-trace trainer.

Rooms: config/ (settings), envs/ (simulators), buffers/ (shared memory), ipc/ (queues),
algo/ (V-trace, APPO loss), models/ (networks), workers/ (rollout, inference, learner
processes), runner/ (the main process), rundir/ (what a run leaves on disk).
"""

__version__ = "0.1.0"
