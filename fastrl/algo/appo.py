"""One APPO optimisation pass over a batch of trajectories: V-trace targets, loss, Adam step.

Knows nothing of processes or shared memory: it takes a time-major batch of tensors and a
callback to publish weights after every optimizer step (or every algo.publish_every_steps), so it
can be tested in-process.

Two ways to cut a batch into minibatches (algo.minibatch_unit):
- trajectories: whole trajectories per minibatch, V-trace re-run on each with the network as it
  is at that step (Sample Factory's APPO);
- samples: V-trace once per batch from a no-grad forward over it (or from the values the acting
  policy recorded, algo.vtrace_values=behaviour), then minibatches of single samples drawn across
  every trajectory (PPO's way). Samples of one trajectory are strongly
  correlated, so for the same number of optimizer steps this gives less noisy gradients; on Pong
  it turned 4 steps per batch that learned too slowly into 16 cheap ones that learn.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

import torch

from fastrl.algo.adam import Adam
from fastrl.algo.appo_loss import LossOutput, appo_loss, normalized_advantages
from fastrl.algo.bf16_copy import Bf16WorkingCopy
from fastrl.algo.flat_params import FlatParams
from fastrl.algo.grad_clip import clip_grad_norm, clip_scale_of
from fastrl.algo.minibatches import epoch_minibatches
from fastrl.algo.native_gradient import NativeGradient
from fastrl.algo.policy_lag import lag_stats
from fastrl.algo.shards import ShardPool, even_cuts, ran_here
from fastrl.algo.split_backward import WeightGradThread
from fastrl.algo.vtrace import vtrace
from fastrl.config.schema import AlgoConfig
from fastrl.models import ActorCritic

# The no-grad forward over a whole batch runs in chunks of about this many bytes of observations.
# On the Pong preset (1,056 frames of 28 KB) one pass took 190 ms and chunks of 132-264 frames
# 137-140 ms: a chunk's activations stay in cache instead of ~100 MB of freshly mapped pages.
NO_GRAD_CHUNK_BYTES = 8 << 20
TRAJECTORY_LOSS_KEYS = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated", "train_mask")
BATCH_KEYS = ("obs", "actions", "log_probs", "values", "rewards", "terminated", "truncated", "valid", "policy_version")


def scheduled_lr(algo: AlgoConfig, env_steps: int, train_for_env_steps: int) -> float:
    """The learning rate after env_steps: constant, or linear from algo.lr down to 0 at
    algo.lr_decay_env_steps (by default the run's own length), and 0 beyond it."""
    if algo.lr_schedule == "constant":
        return algo.lr
    horizon = algo.lr_decay_env_steps or train_for_env_steps
    return algo.lr * max(0.0, 1.0 - env_steps / horizon)


def _as_float(value: torch.Tensor | float) -> float:
    """A LossOutput field as a Python float: the native chain's already is, the autograd path's is a
    0-dim tensor (detached first: reading one that requires grad warns)."""
    return value if isinstance(value, float) else float(value.detach())


class APPOTrainer:
    def __init__(self, model: ActorCritic, cfg: AlgoConfig, max_policy_lag: int, seed: int = 0, shards: int = 1,
                 bf16_working_copy: bool = True, split: str = "rows"):
        """`shards` > 1 (system.learner_shards) runs each sample minibatch, and the batch's no-grad
        forward, as that many pieces on as many threads (fastrl.algo.shards); with
        algo.minibatches_per_weights > 1 the shards instead take one whole minibatch each of a group
        computed against the same weights. A bf16 network runs
        its forwards through a bf16 working copy (fastrl.algo.bf16_copy) unless `bf16_working_copy`
        is off, which leaves the casts to autocast (the same gradients; tests compare the two).
        `cfg.native_optimizer` off keeps the copy's gradient sum, the clip and Adam in torch; on, they run
        in fastrl_ext._optim where it is built: the same gradients, and a norm and weights that differ from
        torch's by rounding (tests compare).
        `split` (system.learner_split) says how the shards' threads share a sample minibatch: "rows",
        a piece each; "weight_grads", one minibatch whose CNN weight gradients the other threads
        compute while the caller carries the input gradients back (fastrl.algo.split_backward: the
        bf16 working copy's Nature CNN only, one minibatch per weights)."""
        if shards > 1 and cfg.minibatch_unit != "samples":
            raise ValueError("learner shards need algo.minibatch_unit=samples")
        self.model, self.cfg, self.max_policy_lag = model, cfg, max_policy_lag
        self.pool = ShardPool(shards)
        # minibatch order: its own stream, so a run's seed fixes it whatever else draws numbers
        self.generator = torch.Generator().manual_seed(seed)
        self.trained_params = [p for p in model.parameters() if p.requires_grad]
        # the MLPs' parameters and gradients as views of two flat tensors: the clip and Adam run over one
        # tensor each instead of a dozen (fastrl.algo.flat_params says why and when)
        self.flat = FlatParams(self.trained_params) if FlatParams.supported(self.trained_params) else None
        self.optimizer = Adam(self.trained_params, lr=cfg.lr, eps=cfg.adam_eps, flat=self.flat,
                              native=cfg.native_optimizer)
        # `net` runs every forward; `model` holds the fp32 weights that Adam updates and others read
        self.bf16_copy = Bf16WorkingCopy(model, cfg.native_optimizer) if model.bf16 and bf16_working_copy else None
        self.grad_sum_sq = None  # the last gradient's sum of squares, where the copy summed it natively
        # the copy's bf16 gradient pieces that Adam steps on in place of a .grad (Bf16WorkingCopy.gradient_pieces)
        self.grad_pieces = None
        # off: the pieces are summed into the master's .grad first, as before (bench/optim_microbench.py compares)
        self.step_on_pieces = True
        # a minibatch's loss and gradient without autograd, where its pieces all run natively (algo.native_gradient)
        self.native_gradient = NativeGradient(model, cfg, self.flat) if NativeGradient.supported(
            model, cfg, self.flat) else None
        self.net = self.bf16_copy.model if self.bf16_copy is not None else model
        if split not in ("rows", "weight_grads"):
            raise ValueError(f"split must be rows or weight_grads, got {split!r}")
        self.split = split
        if split == "weight_grads":
            if self.bf16_copy is None or cfg.minibatches_per_weights != 1 or cfg.minibatch_unit != "samples":
                raise ValueError("split=weight_grads needs a bf16 working copy, algo.minibatches_per_weights=1 "
                                 "and algo.minibatch_unit=samples")
            # through self.pool each time: set_shards may replace it (with one shard the jobs run in place)
            self.bf16_copy.split_weight_grads(WeightGradThread(
                lambda job: self.pool.submit(job) if self._parallel_now else ran_here(job)))
        # asked before each minibatch and each no-grad forward, with how many of the batch's minibatches have
        # run: may the shards' other threads take part? None: always. The learner process passes its own test
        # (system.learner_serial_tail).
        self.parallel_when: Callable[[int], bool] | None = None
        self._parallel_now = True
        # minibatches run with 2+ shards since construction, and how many of them on all the threads
        self.minibatches_run = self.minibatches_parallel = 0
        self._batch_first_minibatch = 0  # minibatches_run when the current batch began
        self.policy_version = 0  # number of optimizer steps taken: the version stamped on published weights
        self.skipped_total = 0   # optimizer steps dropped for a non-finite loss or gradient
        self.skipped_in_row = 0  # ... since the last good one

    def set_shards(self, shards: int) -> None:
        """Change how many threads share each minibatch (the bench times 1 beside the configured count)."""
        self.pool.close()
        self.pool = ShardPool(shards)

    def _parallel(self, minibatches: int = 0) -> bool:
        """Whether the shards' other threads take part in what comes next (`minibatches` of them, counted)."""
        if self.pool.shards == 1:
            self._parallel_now = False
            return False
        done = self.minibatches_run - self._batch_first_minibatch
        self._parallel_now = self.parallel_when is None or self.parallel_when(done)
        self.minibatches_run += minibatches
        self.minibatches_parallel += minibatches if self._parallel_now else 0
        return self._parallel_now

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _forward_time_major(self, obs, chunked: bool = False):
        """obs [T+1, B, ...] -> (policy params [T, B, ...] for the steps taken, values [T+1, B]).
        `chunked` (no-grad only) runs the network over pieces of NO_GRAD_CHUNK_BYTES."""
        T1, B = obs.shape[:2]
        flat = obs.reshape(T1 * B, *obs.shape[2:])
        rows = max(1, NO_GRAD_CHUNK_BYTES // max(1, flat[0].numel() * flat.element_size()))
        sharded = chunked and self._parallel()
        if not sharded and (not chunked or rows >= flat.shape[0]):
            params, values = self.net(flat)  # one call, nothing to concatenate (the path with autograd)
        else:
            if sharded:  # each shard takes an even, contiguous share, so the pieces come back in order
                shares = [flat[lo:hi] for lo, hi in even_cuts(flat.shape[0], self.pool.shards)]
                pieces = [p for share in self.pool.map(lambda x: self._no_grad_forwards(x, rows), shares)
                          for p in share]
            else:
                pieces = [self.net(flat[i:i + rows]) for i in range(0, flat.shape[0], rows)]
            params, values = torch.cat([p for p, _ in pieces]), torch.cat([v for _, v in pieces])
        return params.reshape(T1, B, *params.shape[1:])[:-1], values.reshape(T1, B)

    def _no_grad_forwards(self, obs, rows: int) -> list:
        """The network over `obs` in pieces of `rows`, on a shard's thread."""
        with torch.no_grad():  # grad mode is per thread: the caller's no_grad does not reach a shard's
            return [self.net(obs[i:i + rows]) for i in range(0, obs.shape[0], rows)]

    def _trajectory_minibatch_loss(self, mb: dict):
        """Whole trajectories [T(+1), b]: V-trace with this minibatch's own (current) values."""
        cfg = self.cfg
        params, values = self._forward_time_major(mb["obs"])
        new_log_probs = self.net.log_prob(params, mb["actions"])
        entropy = self.net.entropy(params)
        targets = vtrace(new_log_probs.detach() - mb["log_probs"], mb["rewards"], values.detach(),
                         mb["terminated"], mb["truncated"], cfg.gamma, cfg.rho_bar, cfg.c_bar, cfg.vtrace_lambda,
                         native=cfg.native_vtrace)
        return self._loss(mb, new_log_probs, entropy, values[:-1], targets.vs, targets.pg_advantages)

    def _sample_minibatch_loss(self, mb: dict):
        """Single samples [b] whose V-trace targets were computed for the whole batch."""
        params, values = self.net(mb["obs"])
        return self._loss(mb, self.net.log_prob(params, mb["actions"]), self.net.entropy(params), values,
                          mb["vs"], mb["pg_advantages"])

    def _loss(self, mb: dict, new_log_probs, entropy, values, value_targets, advantages, normalize_adv=None):
        cfg = self.cfg
        normalize_adv = cfg.normalize_advantages if normalize_adv is None else normalize_adv
        return appo_loss(new_log_probs, mb["log_probs"], entropy, values, mb["values"], value_targets, advantages,
                         mb["train_mask"], cfg.clip_ratio, cfg.value_coef, cfg.entropy_coef, cfg.value_clip,
                         normalize_adv, native=cfg.native_loss)

    def _loss_and_gradient(self, mb: dict, minibatch_loss) -> LossOutput:
        """The minibatch's loss, with its gradient in the parameters' .grad (zeroed first), or, for a bf16
        working copy whose Adam steps on the pieces, in `grad_pieces` (see _take_gradient)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.grad_sum_sq = self.grad_pieces = None
        if self.bf16_copy is not None:
            self.bf16_copy.refresh()  # the weights the last step left
        native = self._native_gradient_for(minibatch_loss)
        if native is not None:
            out, self.grad_sum_sq = native(mb)  # the clip's sum of squares comes with the gradient
            return out
        if self._parallel(minibatches=1) and self.split == "rows":
            return self._sharded_sample_backward(mb)
        out = minibatch_loss(mb)
        if self.bf16_copy is not None:
            self._take_gradient([self.bf16_copy.gradients(out.loss)])
        else:
            out.loss.backward()
        return out

    def _native_gradient_for(self, minibatch_loss):
        """The native chain that computes `minibatch_loss` and its gradient, where it can run now (one shard:
        with more, their threads share the minibatch through autograd); else None."""
        if self.native_gradient is None or self.pool.shards != 1 or not self.native_gradient.ready():
            return None
        if minibatch_loss == self._trajectory_minibatch_loss:
            return self.native_gradient.trajectory_minibatch
        return self.native_gradient.sample_minibatch if minibatch_loss == self._sample_minibatch_loss else None

    def _sharded_sample_backward(self, mb: dict) -> LossOutput:
        """The sample minibatch's loss and gradient as `pool.shards` pieces on as many threads; the
        gradient lands in the parameters' .grad, as `loss.backward()` would leave it (or, for a bf16
        working copy, where _take_gradient leaves it).

        Piece k's loss is its mean over its valid samples, weighted by its share of the minibatch's
        valid samples: the weighted sum is the whole minibatch's mean, and so is its gradient.
        Advantages are normalised over the whole minibatch first, as the unsharded loss does."""
        mask = mb["train_mask"]
        advantages = mb["pg_advantages"]
        if self.cfg.normalize_advantages:
            advantages = normalized_advantages(advantages, mask)
        total_valid = max(1, int(mask.sum()))
        bounds = even_cuts(mask.shape[0], self.pool.shards)

        def piece(index_and_bounds):
            index, (lo, hi) = index_and_bounds
            part = {key: value[lo:hi] for key, value in mb.items()}
            params, values = self.net(part["obs"])
            out = self._loss(part, self.net.log_prob(params, part["actions"]), self.net.entropy(params), values,
                             part["vs"], advantages[lo:hi], normalize_adv=False)
            weight = int(part["train_mask"].sum()) / total_valid
            loss = out.loss * weight
            if self.bf16_copy is not None:
                return out, weight, self.bf16_copy.gradients(loss)
            if index == 0:
                loss.backward()  # into .grad (the flat buffer's views stay attached); the others only read
                return out, weight, None
            return out, weight, torch.autograd.grad(loss, self.trained_params, allow_unused=True)

        results = self.pool.map(piece, list(enumerate(bounds)))
        if self.bf16_copy is not None:
            self._take_gradient([grads for _, _, grads in results])
        else:
            for _, _, grads in results[1:]:
                self._put_grads(grads, accumulate=True)
        return LossOutput(*(sum(weight * getattr(out, name).detach().double() for out, weight, _ in results)
                            for name in LossOutput._fields))

    @torch.no_grad()
    def _flat_samples_with_targets(self, batch: dict) -> dict:
        """V-trace over the whole batch under the current network (or on the acting policy's values,
        algo.vtrace_values=behaviour), then every per-step tensor flattened to [T*B, ...] so that
        minibatches can draw single samples."""
        cfg = self.cfg
        obs = batch["obs"]
        if self.bf16_copy is not None:
            self.bf16_copy.refresh()
        if cfg.vtrace_values == "behaviour":
            # the acting policy's values stand in for the forward over the batch; only the bootstrap
            # observations, which no recorded step acted on yet, go through the learner's network
            _, bootstrap = self.net(obs[-1])
            values = torch.cat([batch["values"].to(bootstrap.dtype), bootstrap[None]])
            # ratios of 1, untruncated: GAE's lambda-returns, whatever rho_bar and c_bar
            log_ratios, rho_bar, c_bar = torch.zeros_like(batch["log_probs"]), 1.0, 1.0
        else:
            params, values = self._forward_time_major(obs, chunked=True)
            log_ratios = self.net.log_prob(params, batch["actions"]) - batch["log_probs"]
            rho_bar, c_bar = cfg.rho_bar, cfg.c_bar
        targets = vtrace(log_ratios, batch["rewards"], values, batch["terminated"],
                         batch["truncated"], cfg.gamma, rho_bar, c_bar, cfg.vtrace_lambda,
                         native=cfg.native_vtrace)
        per_step = {"obs": obs[:-1], "actions": batch["actions"], "log_probs": batch["log_probs"],
                    "values": batch["values"], "train_mask": batch["train_mask"],
                    "vs": targets.vs, "pg_advantages": targets.pg_advantages}
        return {k: v.reshape(-1, *v.shape[2:]) for k, v in per_step.items()}

    def _minibatches(self, batch: dict, buffers: int = 1):
        """Yield (minibatch, loss function) for every optimizer step of this batch. The observations of
        the last `buffers` minibatches yielded stay valid; older ones are overwritten."""
        cfg = self.cfg
        if cfg.minibatch_unit == "samples":
            tensors, dim = self._flat_samples_with_targets(batch), 0
            loss = self._sample_minibatch_loss
        else:
            # only what the loss reads: each key is a gather over [T, B] (once an epoch)
            tensors, dim = {k: batch[k] for k in TRAJECTORY_LOSS_KEYS}, 1
            loss = self._trajectory_minibatch_loss
        for mb in epoch_minibatches(tensors, dim, cfg.num_epochs, cfg.num_minibatches, self.generator, buffers):
            yield mb, loss

    def _gradient_groups(self, batch: dict):
        """Yield, for every group of algo.minibatches_per_weights minibatches, a list of (loss output,
        gradients or None) in step order. With groups of 1 the gradient is already in the parameters'
        .grad (None); with larger groups every member's gradient was computed against the weights the
        group started from, each member whole on one shard, and is installed by `_install_gradient`
        just before its step."""
        k = self.cfg.minibatches_per_weights
        minibatches = self._minibatches(batch, buffers=k)
        if k == 1:
            for mb, minibatch_loss in minibatches:
                yield [(self._loss_and_gradient(mb, minibatch_loss), None)]
            return
        while True:
            group = list(itertools.islice(minibatches, k))
            if not group:
                return
            yield self._group_gradients(group)

    def _group_gradients(self, group: list) -> list:
        """Each (minibatch, loss function)'s loss and gradient at the current weights, on the shards."""
        if self.bf16_copy is not None:
            self.bf16_copy.refresh()  # the weights the last step left

        def one(item):
            mb, minibatch_loss = item
            out = minibatch_loss(mb)
            if self.bf16_copy is not None:
                return out, self.bf16_copy.gradients(out.loss)
            return out, torch.autograd.grad(out.loss, self.trained_params, allow_unused=True)
        return self.pool.map(one, group) if self._parallel(len(group)) else [one(item) for item in group]

    @torch.no_grad()
    def _install_gradient(self, grads: tuple) -> None:
        """Put one group member's gradient where the step reads it, as `loss.backward()` would."""
        self.optimizer.zero_grad(set_to_none=True)
        self.grad_pieces = None
        if self.bf16_copy is not None:
            self._take_gradient([grads])
            return
        self.grad_sum_sq = None
        self._put_grads(grads, accumulate=False)

    def _take_gradient(self, pieces: list) -> None:
        """The bf16 working copy's gradient `pieces` (one tuple per piece): left for Adam's native step to sum
        as it reads them where it can (`grad_pieces`, no .grad written), else summed into the master's .grad;
        either way with their sum of squares where that is native (`grad_sum_sq`)."""
        copy = self.bf16_copy
        if (self.step_on_pieces and copy.native and isinstance(self.optimizer, Adam)
                and self.optimizer.steps_on_pieces(copy.params)):
            taken = copy.gradient_pieces(pieces)
            if taken is not None:
                self.grad_sum_sq, self.grad_pieces = taken
                return
        self.grad_pieces = None
        self.grad_sum_sq = copy.set_master_grads(pieces)

    @torch.no_grad()
    def _put_grads(self, grads: tuple, accumulate: bool) -> None:
        """Each gradient into its parameter's .grad, added to it or over it; a parameter without one
        takes the tensor itself, as a first backward leaves it. Writing in place keeps a .grad that is
        a view of the flat gradient buffer (fastrl.algo.flat_params) one."""
        for p, g in zip(self.trained_params, grads):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g
            elif accumulate:
                p.grad.add_(g)
            else:
                p.grad.copy_(g)

    def train(self, batch: dict, publish: Callable[[], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> dict:
        """Run num_epochs x num_minibatches steps over `batch` ([T(+1), B, ...] tensors), or fewer
        once `should_stop()` turns true: on a slow machine one batch can take a minute, and a
        stop that waited for it could run past the supervisor's patience and lose the final checkpoint."""
        cfg = self.cfg
        lag = torch.rsub(batch["policy_version"], self.policy_version)  # without Tensor.__rsub__'s Python wrapper
        valid = batch["valid"].bool()
        fresh = lag <= self.max_policy_lag
        batch = dict(batch, train_mask=valid & fresh)
        if self.model.normalizer is not None:
            self.model.normalizer.update(batch["obs"][:-1][valid])

        sums: dict[str, float] = {}
        run0, parallel0 = self.minibatches_run, self.minibatches_parallel
        self._batch_first_minibatch = run0
        steps = 0
        skipped = 0
        for out, grads in (member for group in self._gradient_groups(batch) for member in group):
            if should_stop is not None and should_stop():
                break
            if grads is not None:
                self._install_gradient(grads)
            grad_mul = None
            if self.grad_sum_sq is None and isinstance(self.optimizer, Adam):  # tests swap in torch's
                self.grad_sum_sq = self.optimizer.grad_sum_squares()
            if self.grad_sum_sq is not None:
                # the gradients' squares were summed with them (fastrl.algo.bf16_copy) or by Adam in one
                # pass: Adam applies the clip's scale as it reads them, instead of the clip reading them
                # twice more
                grad_norm = math.sqrt(self.grad_sum_sq)
                grad_mul = clip_scale_of(grad_norm, cfg.max_grad_norm)
            else:
                flat = self.flat is not None and self.flat.attached()  # not under another optimizer's zero_grad
                grad_norm = clip_grad_norm(self.trained_params, cfg.max_grad_norm, self.flat.grad if flat else None)
            # as Python floats: torch.isfinite and its bool cost ~15 µs a tensor on the MLP presets' step
            if not math.isfinite(_as_float(out.loss)) or not math.isfinite(float(grad_norm)):
                skipped += 1  # a non-finite step would poison the weights; drop it
                self.skipped_total += 1
                self.skipped_in_row += 1
                continue
            self.skipped_in_row = 0
            copies = self.bf16_copy.params if self.bf16_copy is not None and self.bf16_copy.native else None
            if grad_mul is None and copies is None:
                self.optimizer.step()  # any torch.optim-like optimizer (tests swap in torch's reference)
            elif self.optimizer.step(grad_mul, copies, self.grad_pieces):
                self.bf16_copy.written_by_step()  # the step rounded the new weights into it: no refresh
            self.policy_version += 1
            if publish is not None and self.policy_version % cfg.publish_every_steps == 0:
                publish()
            steps += 1
            for name, value in out._asdict().items():
                sums[name] = sums.get(name, 0.0) + _as_float(value)
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + float(grad_norm)
        stats = {k: v / max(steps, 1) for k, v in sums.items()}
        if self.minibatches_run > run0:
            stats["parallel_fraction"] = (self.minibatches_parallel - parallel0) / (self.minibatches_run - run0)
        stats.update(sgd_steps=steps, skipped_steps=skipped, lr=self.optimizer.param_groups[0]["lr"],
                     **lag_stats(lag, valid, fresh))
        return stats

