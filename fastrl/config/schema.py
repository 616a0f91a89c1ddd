"""The one declaration of every setting fastrl has: typed dataclasses with defaults and help.

A run's configuration is a `Config` made of sections (`env`, `sampler`, `model`, `algo`,
`system`, `run`). YAML presets and `--set section.key=value` overrides are applied on top of
these defaults by `fastrl.config.loader`, which also rejects unknown keys and bad types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional


def opt(default: Any, help: str) -> Any:
    """A dataclass field with its help text kept next to it (shown by `fastrl train --help-config`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class EnvConfig:
    id: str = opt("CartPole-v1", "Environment id: an envpool task (e.g. Pong-v5) or a registered gymnasium id.")
    backend: Literal["auto", "envpool", "gymnasium"] = opt(
        "auto", "Which simulator runs the env; auto = envpool when it has the id, else gymnasium.")
    kwargs: dict = opt({}, "Extra keyword arguments for envpool.make / gymnasium.make (e.g. episodic_life).")
    joint_actions: bool = opt(
        True, "Where an env acts with several discrete choices and its Dict observation's action_mask marks every "
        "combination of them (Minesweeper's [10, 10] cells for a row and a column; BinPack, Tetris, FlatPack), act "
        "with one categorical over the combinations so that the mask applies; false draws one categorical per "
        "choice, and the mask, which cannot apply to independent draws, is only an input.")
    atari_frames: Literal["auto", "fastrl", "envpool"] = opt(
        "auto", "Who shrinks and stacks envpool Atari frames. fastrl: envpool hands over its raw 210x160 grayscale "
        "frames and fastrl_ext resizes them (OpenCV's INTER_AREA, as envpool does, bit for bit, in vectors) and "
        "keeps the stacks in the rollout worker: envpool's scalar resize was ~10% of a Pong sample stage's CPU. "
        "envpool: envpool does both. auto = fastrl where it can (fastrl_ext built, grayscale, area resize, frames "
        "shrunk, and not by whole numbers both ways, where OpenCV averages blocks by another path); fastrl where it "
        "cannot is an error.")


@dataclass
class SamplerConfig:
    num_rollout_workers: int = opt(2, "Rollout worker processes, each stepping its own envs.")
    num_envs_per_worker: int = opt(32, "Envs stepped by each rollout worker, divided evenly into its splits.")
    num_splits: int = opt(2, "Env groups per rollout worker; >=2 lets one group step while another waits for actions.")
    env_threads: int = opt(1, "envpool C++ threads per group, where each group is its own envpool (env_pool per_group).")
    env_pool: Literal["per_group", "per_worker"] = opt(
        "per_group", "How a rollout worker's groups map onto envpool instances. per_group: one envpool per group, "
        "env_threads threads each, so groups can step at the same time. per_worker: one envpool for all the "
        "worker's groups in envpool's async mode, one C++ thread stepping envs in the order their actions came "
        "(needs env_threads 1): a thread per worker instead of per group, so fewer runnable threads queue on the "
        "cores. fastrl bench side by side: Pong sampling 1.06x, training a tie with the learner waiting 5.6% -> 2.0%; "
        "Breakout sampling 1.20x, training 1.07x; the first sample ~0.6 s later, as a worker makes all its envs "
        "at once (bench/README, stop 49). gymnasium envs ignore it: they step in the worker's own thread.")
    rollout_len: int = opt(32, "Env steps per trajectory (T); the learner bootstraps from step T.")
    num_inference_workers: int = opt(
        1, "Inference worker processes running the batched policy forward; 0 = each rollout worker runs the "
        "policy itself (no round trip to another process: faster for tiny models such as 2x64 MLPs).")
    acting_backend: Literal["auto", "numpy", "torch"] = opt(
        "auto", "What a rollout worker that acts itself (num_inference_workers=0) runs the policy with. numpy: "
        "no torch in the worker (its import costs ~2.5 CPU-s at startup) and ~3x less CPU per forward of a "
        "small MLP; torch: the same network through torch. auto = numpy where the model allows it (MLP "
        "encoder, fp32, CPU), else torch.")
    num_traj_buffers: int = opt(0, "Trajectory slots in shared memory; 0 = enough for the groups plus 2 batches.")
    max_policy_lag: int = opt(50, "Samples acted by a policy more than this many SGD steps old are masked out.")


@dataclass
class ModelConfig:
    encoder: Literal["auto", "mlp", "nature_cnn"] = opt(
        "auto", "Observation encoder; auto = nature_cnn for image observations of at least 36x36 "
        "([C, H, W] or [H, W, C]), else mlp.")
    hidden_sizes: list = opt([64, 64], "Hidden layer widths of the MLP encoder (and of the CNN's head: first entry).")
    activation: Literal["tanh", "relu"] = opt("tanh", "MLP activation.")
    shared_encoder: bool = opt(False, "One encoder for actor and critic; False gives each its own.")
    normalize_obs: bool = opt(False, "Running mean/std observation normalisation (updated by the learner).")
    init_log_std: float = opt(0.0, "Initial log standard deviation of the Gaussian policy (continuous actions).")
    precision: Literal["auto", "fp32", "bf16"] = opt(
        "fp32", "Compute precision of the network's layers (inference and learner): bf16 runs convs and matmuls "
        "under torch autocast; weights, optimizer state, losses and V-trace stay fp32. auto = bf16 where the "
        "device multiplies in bf16 natively (CPU flags avx512_bf16/amx_bf16, or a CUDA GPU with bf16), else "
        "fp32: emulated bf16 is ~12x slower than fp32 on an AVX2 CPU. The run's config.json records the choice.")
    first_conv: Literal["auto", "strided", "space_to_depth"] = opt(
        "auto", "How the Nature CNN's first conv (8x8 kernel, stride 4, over the frame stack's 4 channels) runs. "
        "space_to_depth: on the frames cut into 4x4 tiles, each tile's pixels as 64 channels, with a 2x2 kernel at "
        "stride 1: the same products in another order, which oneDNN's bf16 kernels on an AMX CPU run far faster "
        "(weight gradient 0.49x, forward 0.86x at batch 64); for images whose height and width 4 divides, others "
        "keep the strided conv. The parameter keeps its shape, so checkpoints load either way. auto = "
        "space_to_depth in bf16 on a CPU with amx_bf16 (where it was measured), else strided.")
    native_mlp: bool = opt(
        True, "Run an fp32 MLP actor's and critic's layers on the CPU (encoder and head, shared_encoder false) "
        "forward and backward in one fastrl_ext call per network (fastrl.models.native_mlp) instead of ~10 torch "
        "ops and autograd nodes per layer: the same math to float rounding, on one thread whatever "
        "system.learner_threads says; taken where the extension has its AVX2 or AVX-512 variant (on plain "
        "x86-64 torch's layers are faster). The learner's batch 1.2-1.3x faster on the CartPole and HalfCheetah "
        "presets (bench/mlp_microbench.py --learner). false runs torch's layers.")
    native_conv_grad: bool = opt(
        True, "In the learner, compute a bf16 Nature CNN's conv weight and bias gradients in fastrl_ext._conv_grad on "
        "the CPU's AMX tiles (fastrl.models.conv_weight_grad), where the CPU has amx_bf16 and a conv's channel counts "
        "are multiples of 32: each as one tiled product over the output positions instead of oneDNN's backward, "
        "0.4x the time for Pong's second and third convs at a minibatch of 64 (bench/conv_grad_microbench.py). "
        "float32 sums in another order, so a gradient may differ from torch's in its last bf16 place. false keeps "
        "torch's convolution_backward everywhere; elsewhere (no AMX, fp32) it is torch's either way.")


@dataclass
class AlgoConfig:
    gamma: float = opt(0.99, "Discount factor.")
    vtrace_lambda: float = opt(1.0, "lambda of the V-trace traces c_t = lambda * min(c_bar, ratio).")
    rho_bar: float = opt(1.0, "Truncation of the importance weight rho_t in V-trace.")
    c_bar: float = opt(1.0, "Truncation of the trace coefficient c_t in V-trace.")
    native_vtrace: bool = opt(
        True, "Compute V-trace's targets in fastrl_ext's C++ loop when the batch is on the CPU (the torch version's "
        "per-time-step Python loop costs ~1 ms a minibatch); false runs the torch reference (same math).")
    native_loss: bool = opt(
        True, "Compute the APPO loss and its gradient in fastrl_ext's C++ loop when the batch is on the CPU (one call "
        "instead of ~75 small torch ops per minibatch); false runs the torch reference (same math).")
    native_gradient: bool = opt(
        True, "Compute a minibatch's loss and gradient as a chain of fastrl_ext calls without torch's autograd "
        "(fastrl.algo.native_gradient): the actor and critic forward, the policy's log-prob and entropy, V-trace, "
        "the loss, and back through the head and the layers into the gradients. Taken where the autograd path "
        "would run the same native pieces (model.native_mlp's layers, native_vtrace, native_loss, fp32, one "
        "learner shard, minibatches_per_weights 1); the same math to float rounding. false keeps autograd.")
    native_optimizer: bool = opt(
        True, "Take the Adam step in fastrl_ext._optim when the weights are float32 on the CPU (fastrl.algo.adam), "
        "and, where the parameters are not one flat buffer (the CNN), the clip's norm too: one single-threaded "
        "pass per tensor that applies the clip's scale as it reads the gradients, and with a bf16 working copy "
        "also rounds the new weights into it. The MLP presets' flat buffer keeps torch's clip. Pong's fp32 learner on "
        "the AVX2 EPYC spent 61 wall ms a batch there against 87 in torch's clip and fused Adam on two threads "
        "(bench/optim_microbench.py --learner). The same update to float rounding; false keeps torch's.")
    clip_ratio: float = opt(0.1, "PPO clip epsilon of the surrogate objective.")
    value_coef: float = opt(0.5, "Weight of the value loss.")
    value_clip: Optional[float] = opt(None, "If set, clip the value prediction to +-this around the behaviour value.")
    entropy_coef: float = opt(0.003, "Weight of the entropy bonus.")
    normalize_rewards: bool = opt(
        False, "Divide rewards by a running std of the discounted return and clip to +-10 (PPO's MuJoCo recipe); "
        "each rollout worker keeps its own statistics. Reported episode returns stay unscaled.")
    normalize_advantages: bool = opt(True, "Normalise advantages over the valid samples of a minibatch.")
    lr: float = opt(1e-4, "Adam learning rate.")
    lr_schedule: Literal["constant", "linear"] = opt(
        "constant", "linear decays lr to 0 at lr_decay_env_steps (default: run.train_for_env_steps).")
    lr_decay_env_steps: Optional[int] = opt(
        None, "Env steps at which the linear schedule reaches 0 (null: run.train_for_env_steps). Lets a run that "
        "stops early, or at a return, keep the lr of a longer recipe instead of annealing to 0 by its own end.")
    adam_eps: float = opt(1e-6, "Adam epsilon.")
    max_grad_norm: float = opt(4.0, "Gradient norm clip.")
    batch_size: int = opt(1024, "Samples (env steps) per training batch.")
    num_epochs: int = opt(1, "Passes over each batch.")
    num_minibatches: int = opt(1, "Minibatches per epoch.")
    minibatches_per_weights: int = opt(
        1, "Consecutive minibatches whose gradients are computed against the same weights before their "
        "optimizer steps are taken one after another. 1: each step's gradient is at the weights the step before "
        "left (plain minibatch SGD). k > 1: steps 2..k of each group apply a gradient up to k-1 steps stale, as "
        "in asynchronous SGD; in exchange, with system.learner_shards > 1, each shard computes a whole minibatch "
        "of its own instead of a piece of every one, and a CNN forward + backward costs ~7 CPU-ms per call "
        "whatever its rows (Pong's, one thread, bf16: 9.7 ms at 8 rows, 19.6 at 32, 32.3 at 64), which pieces pay "
        "once per shard. Every step still publishes a version. Pong: train stage 1.25x with 2, but it learned "
        "slower: seed 1 +16.2 at 1.67M env steps against +18.0 at 1.31M with 1, seed 2 +3.2 at 1.5M against +17.1 "
        "(bench/README, stop 34).")
    publish_every_steps: int = opt(
        1, "The learner publishes its weights to the acting workers after every this many optimizer steps (the "
        "versions stamped on samples still count steps, so the policy lag grows by up to this minus 1). Each "
        "publication costs the learner a copy of every weight into shared memory and each acting worker a load "
        "(and a repack, system.packed_inference). Faster, but no preset takes it, because the learning runs "
        "measured did not keep up: Pong with 4, train stage 1.04x, seed 1 at -0.97 after 1.45M env steps where 1 "
        "reached +18.0 at 1.31M (stop 34); HalfCheetah with 4, train stage 1.29x but whole runs 1.04x, seeds 1-5 "
        "at 5,800 / 4,214 / 1,809 / 5,014 / 4,771 after 2M against 4,120 / 3,575 / 4,701 / 5,776 / 4,090 with 1 "
        "(bench/README, stop 35).")
    minibatch_unit: Literal["trajectories", "samples"] = opt(
        "trajectories", "trajectories: each minibatch is whole trajectories and re-runs V-trace with the current "
        "network (Sample Factory's APPO). samples: V-trace runs once per batch after a no-grad forward over it, "
        "and minibatches are random single samples, less correlated than whole trajectories (PPO's way; "
        "costs that one extra forward per batch).")
    vtrace_values: Literal["learner", "behaviour"] = opt(
        "learner", "Where minibatch_unit=samples takes V-trace's values and importance weights. learner: a no-grad "
        "forward over the whole batch under the current network (IMPALA's V-trace). behaviour: the values the acting "
        "policy recorded with each step, bootstrapped from one forward over the batch's last observations, and "
        "importance weights of 1 (rho_bar and c_bar must stay 1): the value targets are then GAE's lambda-returns on the "
        "acting values, as PPO computes them, and the loss's clip still bounds the ratio to the current policy. It "
        "skips that forward: Pong's fp32 learner takes 10-13% less CPU a batch on an AVX2 EPYC (bench/README, "
        "stop 64).")


@dataclass
class SystemConfig:
    device: Literal["cpu", "cuda"] = opt("cpu", "Device of the learner and the inference workers.")
    learner_threads: int | Literal["auto"] = opt(
        1, "torch intra-op threads in the learner. auto: 1 where the network runs in bf16 on the CPU or "
        "learner_shards (resolved) > 1, else 2 "
        "(at most the core count): on 2 cores a bf16 CNN learner trains fast enough that the samplers need "
        "the second core, while an fp32 one leaves them most of it idle (Pong preset, fastrl bench train "
        "stage: AVX-512 EPYC in bf16, 1 thread 1.11x faster than 2; AVX2 EPYC in fp32, 2 threads ~1.7x faster "
        "than 1). On cuda, auto is 1.")
    learner_shards: int | Literal["auto"] = opt(
        1, "Threads that each run the forward and backward of a piece of every minibatch (and of the batch's no-grad "
        "forward), their gradients summed before the one optimizer step: data parallelism that meets once per "
        "minibatch, where learner_threads' OpenMP threads meet after every op. Each shard runs on one torch thread, "
        "so >1 needs learner_threads 1 (auto gives 1) and algo.minibatch_unit=samples. Same loss and gradient "
        "as one piece, to float rounding. auto: 2 where the network runs in bf16 on a CPU with 2+ cores (3+ "
        "with AMX), minibatches are single samples and learner_threads is auto or 1; else 1. Pong preset, "
        "fastrl bench train stage, alternated rounds: AVX-512 EPYC in bf16, 2 shards against 1 thread "
        "0.90-1.09x over 10 rounds, median ~1.05x, policy lag p50 ~100 -> 32 versions; AVX2 EPYC in fp32, "
        "against 2 OpenMP threads 0.77-1.49x over 11 rounds, median 0.99x; 2-core AMX Xeon in bf16, 1 shard "
        "(with the preset's 6 slots) against 2 (with 9) 1.075x over 5 rounds, the learner's CPU per env step "
        "0.88x: both cores stay busy either way there, and the second shard costs CPU (bench/README, stop 76).")
    learner_split: Literal["auto", "rows", "weight_grads"] = opt(
        "auto", "How learner_shards' threads share a minibatch of single samples. rows: each takes a piece of its "
        "samples (fastrl.algo.shards), and each piece pays a CNN call's fixed cost. weight_grads: the whole "
        "minibatch's forward and input gradients run on one thread while the others compute the Nature CNN's "
        "weight gradients, layer by layer as the backward reaches them (fastrl.algo.split_backward; the "
        "gradients are one thread's bit for bit); it needs model.precision bf16 on the CPU, a Nature CNN, "
        "algo.minibatches_per_weights 1 and algo.minibatch_unit samples. Both split the batch's no-grad forward "
        "by rows. auto: weight_grads where that holds (model.encoder nature_cnn; an auto encoder stays rows unless "
        "the observations are images) and learner_shards resolves to 2+, else rows. "
        "AVX-512 EPYC, Pong preset, fastrl bench train stage, weight_grads against rows, alternated: 1.045x over 6 "
        "rounds (1.006-1.187, all six faster), the learner's CPU per env step 0.93x, the learn stage alone 0.85x "
        "(its critical path is longer; its CPU per sample is one thread's); bench/README, stop 39.")
    learner_serial_tail: float = opt(
        0.0, "With learner_shards > 1: the last share of each batch's minibatches in which the learner's other threads "
        "join a minibatch only while learner_parallel_backlog's share of the next batch already waits in full slots; "
        "otherwise that minibatch runs on one thread and the samplers get the other core, so that the next batch is "
        "more often there when this one ends. 0: every minibatch on all threads. The gradients are the same either "
        "way (with learner_split weight_grads bit for bit). Pong preset, AVX-512 EPYC, fastrl bench train stage "
        "alternated with 0: at 0.25 the learner waiting 5.1% -> 2.8%, policy lag p50 35 -> 39, env steps/s a tie "
        "(5 rounds, 1.008x); at 1 (every minibatch tested) the wait 5-6% -> 0.1% but lag p50 ~35 -> 64 as the "
        "learner keeps a batch queued. Both learned slower on seed 1: +18 at 1.58M env steps at 1, +13.7 at 1.67M "
        "at 0.25, where 0 reached +18 at 1.38M (one run each; bench/README, stop 40).")
    learner_parallel_backlog: float = opt(
        1.0, "The share of the next batch that must wait in full slots for the learner's other threads to join a "
        "minibatch in learner_serial_tail's share of a batch (1: the whole next batch).")
    learner_omp_wait: Literal["inherit", "active", "passive"] = opt(
        "inherit", "How the learner's OpenMP threads wait at a barrier (OMP_WAIT_POLICY, set before it loads "
        "torch). active spins, fastest when nothing else wants the core; passive sleeps at once, so when a "
        "sampler preempts one learner thread its partner yields the other core instead of spinning on it. "
        "inherit leaves the environment's setting.")
    inference_threads: int = opt(1, "torch intra-op threads in each inference worker.")
    publish_bf16: bool = opt(
        True, "Where every actor holds the whole network in bf16 (model.precision=bf16, a network whose only state "
        "is its conv and linear layers', acting in torch on the CPU), the learner publishes its training versions as "
        "bf16, rounded already by its optimizer, into a block of their own (fastrl.buffers.weights), and the "
        "actors load them as they are, instead of float32 that each actor rounds at every load: half the bytes on "
        "each side, the same bf16 weights. false: float32 always.")
    packed_inference: bool = opt(
        False, "A Nature CNN acting on the CPU (in an inference worker, or a rollout worker acting with torch) "
        "runs with its conv and hidden-layer weights packed into oneDNN's blocked layout, ReLU fused into each "
        "layer (fastrl.models.packed_cnn), instead of torch's eager calls, which re-lay the weights out every "
        "forward; a version is packed once it outlasts its first few forwards (fastrl.workers.acting, "
        "PACK_AFTER_FORWARDS). The same kernels: "
        "in bf16 the same outputs bit for bit. Pong: a forward 0.84x the CPU, the sample stage 1.01-1.08x, but the "
        "train stage 0.86-0.97x against eager (bench/README, stop 35), so off by default.")
    heap_keep_mib: int = opt(
        256, "Freed memory the learner and inference workers keep for reuse instead of handing back to the OS "
        "(glibc's trim threshold; blocks up to 32 MiB then come from the heap, not from fresh mappings). With "
        "glibc's defaults every large tensor lands in new pages, one page fault per 4 KiB: ~25,000 per Pong "
        "batch. 0 keeps glibc's defaults.")
    flush_denormals: bool = opt(
        True, "Processes that run torch (the learner, inference workers, rollout workers acting with torch, and "
        "serial mode's runner) flush denormal floats to zero: torch.set_flush_denormal, the SSE FTZ and DAZ bits, "
        "which threads started later inherit. On Intel CPUs each operation on a denormal takes a slow microcode "
        "assist, and a trained network's small weights, gradients and Adam moments produce them: Pong's learner on "
        "an AMX Xeon, a 30-minute run's checkpoint on its env's frames: 653 CPU-ms a batch kept against 526 flushed; "
        "that run resumed trained 1.15x as fast flushed, and a run from scratch 1.52x (bench/README, stop 69). "
        "Only values below 1.2e-38 change, to 0.")
    rollout_nice: int = opt(
        0, "Niceness added to rollout workers (0-19): the learner keeps its core when it is the bottleneck, "
        "while rollout workers still get all the CPU it leaves idle.")
    rollout_sched_policy: Literal["normal", "batch", "idle"] = opt(
        "normal", "Linux scheduling policy of the rollout workers' threads. batch (SCHED_BATCH): a woken rollout "
        "thread waits for the running thread's time slice instead of preempting it, while its CPU share stays "
        "(rollout_nice's job); pays where a learner-bound run's rollout threads sleep and wake thousands of times "
        "a second (CartPole: training 1.14x), costs where the rollouts are the heavier side (HalfCheetah ~0.85x). "
        "idle (SCHED_IDLE): the threads run only on CPU no normal thread wants (rollout_nice no longer matters) "
        "and never preempt a normal thread when they wake; on Pong fewer of them sat queued behind another thread "
        "while a core idled, and the inference worker ran in longer slices: sampling 1.11x, training a tie; on "
        "HalfCheetah the learner and the rollouts stopped preempting each other mid-slice: training 1.12-1.25x. "
        "On a shared machine idle rollouts get next to nothing while other programs are busy.")
    rollout_pinning: Literal["never", "auto", "always"] = opt(
        "never", "Keep each rollout worker's threads (its own and envpool's) on one core, worker i on the i-th usable "
        "CPU, so that every env step's hand-over to envpool's thread and back stays on that core. It pays where "
        "the envs are cheap and the samplers set the rate, and costs where the learner needs a core's share the "
        "scheduler can no longer give it (CartPole, pinned throughout: sampling 1.10x and steadier, training "
        "0.86x). auto: pinned while the learner waits for data over half of the last second, released when it "
        "waits under a quarter; only rollout workers that act themselves and divide evenly onto the cores, else "
        "left alone (logged). always: pinned throughout; needs sampler.num_inference_workers=0.")
    inference_nice: int = opt(
        0, "Niceness added to inference workers (0-19). Below rollout_nice, the one serial inference process "
        "is not starved by the env threads it feeds; a learner-bound run then never waits for data.")
    learner_discards_batches: bool = opt(
        False, "Benchmark mode: the learner frees every batch untrained, so a run measures sampling alone.")
    heartbeat_timeout_s: float = opt(
        60.0, "A child silent this long is hung: a rollout/inference worker is replaced, a hung learner stops the run.")
    startup_timeout_s: float = opt(120.0, "Time allowed for a child to start (first heartbeat).")
    env_make_timeout_s: float = opt(
        900.0, "Time allowed for one env-making call of a rollout worker, which cannot beat meanwhile (envpool "
        "makes a group in one call; an Atari env costs ~0.2 CPU-s on a 2-core box, so hundreds take minutes).")
    max_restarts_per_worker: int = opt(
        3, "A rollout/inference worker replaced more often than this within restart_window_s stops the run.")
    restart_window_s: float = opt(600.0, "Window over which max_restarts_per_worker is counted.")
    max_nonfinite_steps_in_row: int = opt(
        20, "Stop (with the last good checkpoint) after this many consecutive non-finite optimizer steps.")
    native_rings: bool = opt(
        True, "Channels push/pop/wait through fastrl_ext (C++), which skips wake-up syscalls while the receiver "
        "is busy; false uses the pure-Python reference (same memory layout), e.g. to compare the two.")
    native_record: bool = opt(
        True, "Rollout workers write each env step into its trajectory slot with one fastrl_ext (C++) call "
        "(envpool envs): rewards, episode ends, the valid mask, episode statistics and the observation. false "
        "uses the numpy reference (same bytes; on CartPole ~25 numpy calls per step of 32 envs).")
    native_acting: bool = opt(
        True, "Rollout workers that act with a small MLP in numpy (sampler.acting_backend) run its forward and "
        "action sampling in one fastrl_ext (C++) call; false uses the numpy reference (~25 numpy calls per "
        "forward of a 2x64 MLP). Both draw the same random numbers. Also: a torch policy on the CPU with "
        "categorical actions (an inference worker's CNN) has its actions drawn by fastrl_ext straight into "
        "the slot cells instead of by torch's log_softmax, multinomial and gather.")
    native_rollout_loop: bool = opt(
        True, "Rollout workers that act with the native kernel and record natively run the env steps between "
        "two slot boundaries in one fastrl_ext (C++) call, handing back to Python whenever the learner has "
        "published new weights; false runs every step through the Python pump (same bytes in serial mode).")
    serial: bool = opt(
        False, "Debug mode: every component in one process, stepped in a fixed order; bit-reproducible from the seed.")


@dataclass
class RunConfig:
    train_for_env_steps: int = opt(
        10_000_000, "Stop after this many env steps (not frames): a rollout worker steps no further once a slot it "
        "hands over brings the run's count there, so a run samples about one trajectory slot per rollout worker "
        "more (num_envs_per_worker / num_splits x rollout_len env steps each; two where hand-overs coincide).")
    train_for_seconds: Optional[float] = opt(None, "Also stop after this much wall time (seconds), if set.")
    stop_at_mean_return: Optional[float] = opt(None, "Stop early when the mean return of the last 100 episodes reaches this.")
    seed: int = opt(0, "Seed for envs and network initialisation.")
    report_interval_s: float = opt(5.0, "Seconds between console lines / TensorBoard points.")
    save_every_s: float = opt(300.0, "Seconds between checkpoints (one is always written at the end).")
    keep_checkpoints: int = opt(3, "How many checkpoints to keep.")


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    run: RunConfig = field(default_factory=RunConfig)
