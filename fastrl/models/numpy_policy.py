"""The actor-critic's acting forward in numpy, for rollout workers that act themselves.

A rollout worker that runs a 2x64 MLP itself (sampler.num_inference_workers=0) spent more CPU in
torch than in its envs: every op costs microseconds of dispatch, a call of 16 observations took
324-350 CPU us here (CartPole, HalfCheetah) against 97-123 in numpy (bench/acting_microbench.py),
and `import torch` alone costs each worker ~1.8-2.5 CPU-s at startup. This is the same network,
read from the same published weights (their state_dict names and flat layout), computing the same
logits or Gaussian mean, value and log-prob; tests/test_numpy_policy.py holds it to ActorCritic
on random weights and inputs.

It covers what fastrl's MLP models are: an MLP encoder (tanh or relu), shared or separate for
the critic, optional observation normalisation, a categorical head (one choice, or several drawn
independently from their slices of the logits: EnvSpec.action_nvec) or a state-independent Gaussian
one, an observed action mask (EnvSpec.action_mask) on the logits, all in fp32 on the CPU.
`unsupported_reason` says why anything else needs torch.
"""

from __future__ import annotations

import math

import numpy as np

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
NORMALIZER_EPS, NORMALIZER_CLIP = 1e-8, 10.0  # ObsNormalizer's defaults too (it imports them from here)
NATIVE_WIDE = 16  # layers at least this wide keep (in, out) weights in the native block: see pack_native
# a forbidden action's logit (ActorCritic imports it from here, and fastrl_ext/src/acting_plan.h repeats it):
# exp(MASKED_LOGIT - any logit a network gives) is 0 in float32, and a finite value keeps 0 * log p at 0
MASKED_LOGIT = -1e9


def forbidden_actions(obs_rows: np.ndarray, mask_columns: slice) -> np.ndarray:
    """[B, A] True where the action mask in `mask_columns` of observations [B, D] forbids the action: read from the
    observation as it came, before normalisation, with ActorCritic._masked's and the C++ kernel's > 0.5 (a NaN
    forbids). NumpyPolicy's forward and the learner's native gradient chain both call this."""
    return ~(obs_rows[:, mask_columns] > 0.5)


def unsupported_reason(cfg, spec) -> str | None:
    """Why this model cannot act in numpy (None: it can). `cfg` is a Config, `spec` an EnvSpec."""
    from fastrl.config.checks import resolve_encoder
    from fastrl.config.hardware import resolve_precision

    m = cfg.model
    encoder = resolve_encoder(m, spec)
    if encoder != "mlp":
        return f"model.encoder resolves to {encoder}; only MLP encoders act in numpy"
    if resolve_precision(m.precision, cfg.system.device) != "fp32":
        return "model.precision resolves to bf16; numpy acts in fp32 only"
    if cfg.system.device != "cpu":
        return f"system.device={cfg.system.device}; numpy acts on the CPU"
    return None


def acting_backend(cfg, spec) -> str:
    """What a rollout worker that acts itself runs the policy with: "numpy" or "torch"."""
    choice = cfg.sampler.acting_backend
    if choice == "auto":
        return "numpy" if unsupported_reason(cfg, spec) is None else "torch"
    return choice


def native_kernel(native_acting: bool) -> bool:
    """Whether a policy asked for fastrl_ext's kernel (system.native_acting) gets it: only where it is built."""
    import fastrl_ext

    return native_acting and fastrl_ext._acting is not None


class NumpyPolicy:
    def __init__(self, layout: list[tuple[str, tuple, int]], spec, activation: str, native: bool = False):
        """`layout`: (state_dict name, shape, offset) of every tensor in the flat published weights.
        `native`: `act` runs in one fastrl_ext._acting call (system.native_acting) where it is built."""
        import fastrl_ext

        self.layout, self.spec, self.activation = layout, spec, activation
        self.native = native_kernel(native)
        self._act_mlp = fastrl_ext._acting.act_mlp if self.native else None
        self.plan = self.block = None  # the network as _acting takes it (load, pack_native)
        self.discrete = spec.discrete
        self.nvec = tuple(spec.action_nvec)  # several choices' numbers of options; () for one categorical
        self.mask = spec.action_mask_columns  # the observation's columns that say which actions are allowed
        self.act_fn = np.tanh if activation == "tanh" else (lambda x: np.maximum(x, 0.0, out=x))
        self.names = {name for name, _, _ in layout}
        self.actor_layers = self._layer_names("actor_encoder")
        self.critic_layers = self._layer_names("critic_encoder")  # [] when the encoder is shared
        self.normalized = "normalizer.mean" in self.names
        self._p: dict[str, np.ndarray] | None = {}
        self._flat: np.ndarray | None = None  # the weights last loaded, while `p` is not unpacked from them
        self._gather = None                   # (flat indices of the native block, derived slots): _native_gather

    @classmethod
    def from_module(cls, module, spec, activation: str, native: bool = False) -> "NumpyPolicy":
        """A NumpyPolicy with a torch ActorCritic's current weights, laid out as the learner publishes
        them (for benchmarks; workers read the published block)."""
        from fastrl.buffers.weights import state_layout

        policy = cls(state_layout(module), spec, activation, native)
        policy.load(np.concatenate([t.detach().cpu().float().numpy().reshape(-1)
                                    for t in module.state_dict().values()]))
        return policy

    def _layer_names(self, prefix: str) -> list[str]:
        # nn.Sequential of (Linear, activation) pairs: Linear i sits at index 2 i
        indices = sorted(int(name.split(".")[1]) for name in self.names
                         if name.startswith(prefix + ".") and name.endswith(".weight"))
        return [f"{prefix}.{i}" for i in indices]

    @property
    def p(self) -> dict[str, np.ndarray]:
        """The weights by state_dict name, (in, out) matrices, plus what `load` derives (inv_std, std,
        log_prob_const). A native policy unpacks them only when the numpy path needs them."""
        if self._p is None:
            self._p = self._unpack(self._flat)
        return self._p

    @p.setter
    def p(self, value: dict[str, np.ndarray]) -> None:
        self._p, self._flat = value, None

    def load(self, flat: np.ndarray) -> None:
        """Take weights from a consistent copy of the published block. The native block is gathered
        from it in one call: a rollout worker loads every version the learner publishes (HalfCheetah:
        24 a batch), and unpacking them into `p` and repacking cost it a third of its Python."""
        if self.native:
            self._load_native(flat)
            self._p, self._flat = None, flat.copy()
        else:
            self._p = self._unpack(flat)

    def _unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """`p` from the flat weights (weights transposed once here, so each numpy forward multiplies
        by contiguous (in, out) matrices)."""
        p = {}
        for name, shape, offset in self.layout:
            t = flat[offset:offset + math.prod(shape)].reshape(shape)
            p[name] = np.ascontiguousarray(t.T) if name.endswith(".weight") else t.copy()
        if self.normalized:
            p["normalizer.inv_std"] = (1.0 / np.sqrt(p["normalizer.var"] + NORMALIZER_EPS)).astype(np.float32)
        if not self.discrete:
            p["std"] = np.exp(p["log_std"])
            p["log_prob_const"] = np.float32(-(p["log_std"].sum() + LOG_SQRT_2PI * p["log_std"].size))
        return p

    def _load_native(self, flat: np.ndarray) -> None:
        """plan and block as `pack_native` makes them from `p`, straight from the flat weights: one
        gather, then the few values derived from the normaliser's variance and the log-std."""
        if self._gather is None:
            self._gather = self._native_gather()
            self.block = np.empty(self._gather[0].size, dtype=np.float32)
        indices, derived = self._gather
        np.take(flat, indices, out=self.block)
        if self.normalized:
            var_at, var_shape = derived["normalizer.var"]
            self.block[derived["inv_std"]] = 1.0 / np.sqrt(flat[var_at].reshape(var_shape) + NORMALIZER_EPS)
        if not self.discrete:
            log_std_at, log_std_shape = derived["log_std"]
            log_std = flat[log_std_at].reshape(log_std_shape)
            self.block[derived["std"]] = np.exp(log_std).reshape(-1)
            self.block[derived["log_prob_const"]] = np.float32(-(log_std.sum() + LOG_SQRT_2PI * log_std.size))

    def _native_gather(self) -> tuple[np.ndarray, dict]:
        """(flat index of every float of the native block, where `load` derives the rest: the block's
        slices it writes, which gather index 0 until then, and the (slice, shape) of the flat weights
        it derives them from), with self.plan: `pack_native`'s layout, from the layout of the
        published weights instead of `p`."""
        where = {name: (shape, offset) for name, shape, offset in self.layout}
        parts, size = [], 0

        def index(name: str) -> np.ndarray:
            shape, offset = where[name]
            return offset + np.arange(math.prod(shape), dtype=np.int64).reshape(shape)

        def put(idx: np.ndarray) -> int:
            nonlocal size
            parts.append(idx.reshape(-1))
            size += parts[-1].size
            return size - parts[-1].size

        def derived(n: int) -> slice:
            start = put(np.zeros(n, dtype=np.int64))
            return slice(start, start + n)

        def layer(name: str) -> list[int]:
            w = index(name + ".weight")  # (out, in), as torch stores it
            by_output = w.shape[0] < NATIVE_WIDE
            return [w.shape[1], w.shape[0], put(w if by_output else w.T), put(index(name + ".bias")), int(by_output)]

        dims = self.obs_dim, where["policy_head.bias"][0][0]
        layers = [layer(name) for name in self.actor_layers + self.critic_layers + ["policy_head", "value_head"]]
        slices = {name: (slice(offset, offset + math.prod(shape)), shape) for name, (shape, offset) in where.items()
                  if name in ("normalizer.var", "log_std")}
        tail = [-1, -1, -1, -1]
        if self.normalized:
            tail[0] = put(index("normalizer.mean"))
            slices["inv_std"] = derived(self.obs_dim)
            tail[1] = slices["inv_std"].start
        if not self.discrete:
            slices["std"] = derived(dims[1])
            slices["log_prob_const"] = derived(1)
            tail[2], tail[3] = slices["std"].start, slices["log_prob_const"].start
        self.plan = self._plan(dims, layers, tail)
        return np.concatenate(parts), slices

    def pack_native(self) -> tuple[np.ndarray, np.ndarray]:
        """(plan, params): the loaded network as fastrl_ext._acting.act_mlp reads it (the layout is
        described at the top of fastrl_ext/src/acting_plan.h), built from `p`: the reference for what
        `load` gathers straight from the flat weights (tests/test_numpy_policy.py)."""
        p, parts, offset = self.p, [], 0

        def put(a) -> int:
            nonlocal offset
            a = np.asarray(a, dtype=np.float32).reshape(-1)
            parts.append(a)
            offset += a.size
            return offset - a.size

        def layer(name: str) -> list[int]:
            w = p[name + ".weight"]  # (in, out); the narrow heads go back to (out, in), one dot product per output
            by_output = w.shape[1] < NATIVE_WIDE
            return [w.shape[0], w.shape[1], put(w.T if by_output else w), put(p[name + ".bias"]), int(by_output)]

        dims = self.obs_dim, p["policy_head.bias"].shape[0]
        layers = [layer(name) for name in self.actor_layers + self.critic_layers + ["policy_head", "value_head"]]
        tail = [put(p["normalizer.mean"]) if self.normalized else -1,
                put(p["normalizer.inv_std"]) if self.normalized else -1,
                -1 if self.discrete else put(p["std"]), -1 if self.discrete else put(p["log_prob_const"])]
        return self._plan(dims, layers, tail), np.concatenate(parts)

    def _plan(self, dims: tuple, layers: list[list[int]], tail: list[int]) -> np.ndarray:
        """The plan (fastrl_ext/src/acting_plan.h) from the (D, A) dims, each layer's row and the four
        offsets of the tail: the header, the layers, the tail, the action mask's first observation column
        (-1 without one), then each choice's number of options (none for one categorical or a Gaussian)."""
        mask_column = -1 if self.mask is None else self.mask.start
        return np.asarray([*dims, int(self.discrete), int(self.activation != "tanh"), int(self.normalized),
                           len(self.actor_layers), len(self.critic_layers), len(self.nvec),
                           *(v for row in layers for v in row), *tail, mask_column, *self.nvec], dtype=np.int64)

    @property
    def obs_dim(self) -> int:
        first = (self.actor_layers or ["policy_head"])[0]
        shape = next(shape for name, shape, _ in self.layout if name == first + ".weight")
        return int(shape[1])  # torch's (out, in)

    def _encode(self, x: np.ndarray, layers: list[str]) -> np.ndarray:
        for layer in layers:
            x = x @ self.p[layer + ".weight"]
            x += self.p[layer + ".bias"]
            x = self.act_fn(x)
        return x

    def forward(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logits or Gaussian mean [B, A], value [B]) for observations [B, ...], as ActorCritic.forward."""
        p = self.p
        x = obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False)
        if self.normalized:
            x = np.clip((x - p["normalizer.mean"]) * p["normalizer.inv_std"], -NORMALIZER_CLIP, NORMALIZER_CLIP)
        h = self._encode(x, self.actor_layers)
        h_v = h if not self.critic_layers else self._encode(x, self.critic_layers)
        params = h @ p["policy_head.weight"]
        params += p["policy_head.bias"]
        values = (h_v @ p["value_head.weight"])[:, 0] + p["value_head.bias"][0]
        if self.mask is not None:
            params[forbidden_actions(obs.reshape(obs.shape[0], -1), self.mask)] = MASKED_LOGIT
        return params, values

    def act(self, obs: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions, log-probs, values) for observations [B, ...]: forward, then sample, in numpy or
        in one native call; both draw the same random numbers from `rng`."""
        if self._act_mlp is not None:
            B = obs.shape[0]
            out = (np.empty((B, len(self.nvec)) if self.nvec else B, dtype=np.int64) if self.discrete
                   else np.empty((B, int(self.plan[1])), dtype=np.float32),
                   np.empty(B, dtype=np.float32), np.empty(B, dtype=np.float32))
            if self.act_into(obs, rng, *out):
                return out
        params, values = self.forward(obs)
        actions, log_probs = self.sample(params, rng)
        return actions, log_probs, values

    def act_into(self, obs: np.ndarray, rng: np.random.Generator, actions: np.ndarray, log_probs: np.ndarray,
                 values: np.ndarray) -> bool:
        """`act`, its results written straight into the given arrays (a trajectory slot's cells: int32
        or int64 categorical actions, [B] or [B, choices]); False, with nothing drawn or written, where only
        `act` can."""
        if self._act_mlp is None or obs.dtype != np.float32 or not obs.flags.c_contiguous:
            return False
        self._act_mlp(self.plan, self.block, obs, self._random(obs.shape[0], rng), actions, log_probs, values)
        return True

    def _random(self, B: int, rng: np.random.Generator) -> np.ndarray:
        """What `sample` draws for B observations: a uniform per choice, or a normal per action dimension."""
        if self.discrete:
            return rng.random((B, len(self.nvec) or 1), dtype=np.float32)
        return rng.standard_normal((B, int(self.plan[1])), dtype=np.float32)

    def sample(self, params: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(actions, their log-probabilities) drawn from the policy at `params`: several choices are
        independent categoricals over their slices of the logits, their log-probabilities summed."""
        if self.discrete:
            u = self._random(params.shape[0], rng)
            if not self.nvec:
                return _categorical(params, u)
            actions = np.empty((params.shape[0], len(self.nvec)), dtype=np.int64)
            log_probs = np.zeros(params.shape[0], dtype=np.float32)
            start = 0
            for c, n in enumerate(self.nvec):
                actions[:, c], log_p = _categorical(params[:, start:start + n], u[:, c:c + 1])
                log_probs += log_p  # in float32, choice after choice, as the C++ kernel adds them
                start += n
            return actions, log_probs
        noise = rng.standard_normal(params.shape, dtype=np.float32)
        actions = params + self.p["std"] * noise
        # z = (a - mean) / std is the noise itself
        log_probs = -0.5 * np.einsum("ij,ij->i", noise, noise) + self.p["log_prob_const"]
        return actions, log_probs.astype(np.float32, copy=False)


def _categorical(logits: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(actions [B], log-probabilities [B]) of one categorical per row of `logits` [B, n], each drawn with its
    uniform in `u` [B, 1]: the action is the number of cumulative sums of exp(z) at or below u * sum(exp(z))
    (at most n - 1), z = logits - max(logits); fastrl_ext's kernel draws with the same formula."""
    z = logits - logits.max(axis=1, keepdims=True)
    cdf = np.cumsum(np.exp(z), axis=1)  # unnormalised: its last column is the softmax's denominator
    log_p = z - np.log(cdf[:, -1:])
    actions = np.minimum((cdf <= u * cdf[:, -1:]).sum(axis=1), logits.shape[1] - 1)
    return actions, log_p[np.arange(logits.shape[0]), actions]
