"""Adam (Kingma & Ba, 2015), without torch.optim.

torch.optim's Optimizer wraps its methods in torch._disable_dynamo, which imports torch._dynamo
the first time one is called: 1.65 CPU-s on the 2-core box, paid by every learner at startup
while the samplers create their envs on the same two cores. This is the same update through the
same fused CPU kernel (`torch._fused_adam_`, what `torch.optim.Adam(fused=True)` runs; 3x quicker
than the per-tensor loop for the Nature CNN), with the textbook per-tensor update where the
kernel is missing. `state_dict()` has torch.optim.Adam's layout, so checkpoints written by either
load in the other.

No weight decay, no amsgrad: fastrl's recipes use neither.
"""

from __future__ import annotations

import math

import torch

from fastrl.algo.flat_params import FlatParams, memory_flat_array
from fastrl_ext import _optim


def _fused_kernel_works(device: torch.device) -> bool:
    fused = getattr(torch, "_fused_adam_", None)
    if fused is None:
        return False
    p = torch.zeros(1, device=device)
    try:
        fused([p], [torch.ones(1, device=device)], [torch.zeros(1, device=device)], [torch.zeros(1, device=device)],
              [], [torch.ones((), device=device)], amsgrad=False, lr=0.1, beta1=0.9, beta2=0.999,
              weight_decay=0.0, eps=1e-8, maximize=False, grad_scale=None, found_inf=None)
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return bool(torch.isfinite(p).all()) and float(p) != 0.0


class _NativeViews:
    """The flat numpy views fastrl_ext._optim steps through, built once: parameters, moments and
    copies keep their memory for the run (checked by address at every step), gradients are new."""

    def __init__(self):
        self.key = None
        self.fixed = None

    def jobs(self, adam: "Adam", copies: list | None) -> list | None:
        """Per parameter (param, grad, exp_avg, exp_avg_sq, copy) views, None for one without a
        gradient; None altogether where the native step does not apply. Without `copies`, float32 CPU
        flat buffers make one job (copy None) over the whole flat parameter, and float32 CPU parameters
        without one a job each (copy None)."""
        if copies is None and adam.flat is not None:
            return self._flat_job(adam)
        fixed_views = self.fixed_for(adam, [None] * len(adam.params) if copies is None else copies)
        if fixed_views is None:
            return None
        jobs = []
        for p, fixed in zip(adam.params, fixed_views):
            g = p.grad
            if g is None:
                jobs.append(None)
                continue
            flat_g = memory_flat_array(g) if g.dtype == torch.float32 and g.stride() == p.stride() else None
            if flat_g is None:
                return None
            jobs.append((fixed[0], flat_g, *fixed[1:]))
        return jobs

    def fixed_for(self, adam: "Adam", copies: list) -> list | None:
        """(param, exp_avg, exp_avg_sq, copy) views per parameter for a step that writes `copies` (an entry
        None: that parameter has no copy), made again when a tensor moves; None where the native step
        over parameters kept apart does not apply."""
        if _optim is None or adam.flat is not None or len(copies) != len(adam.params):
            return None
        key = tuple((p.data_ptr(), 0 if c is None else c.data_ptr()) for p, c in zip(adam.params, copies))
        if key != self.key:
            self.fixed, self.key = self._fixed(adam, copies), key
        return self.fixed

    def _flat_job(self, adam: "Adam") -> list | None:
        """The one job over float32 CPU flat buffers (their views made once per address), or None."""
        flat = adam.flat
        if _optim is None or flat is None:
            return None
        tensors = (flat.data, flat.grad, adam.flat_exp_avg, adam.flat_exp_avg_sq)
        key = tuple(t.data_ptr() for t in tensors)
        if key != self.key:
            ok = all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors)
            self.fixed = [(*(t.detach().numpy() for t in tensors), None)] if ok else None
            self.key = key
        if self.fixed is not None:
            flat.check()
        return self.fixed

    @staticmethod
    def _fixed(adam: "Adam", copies: list) -> list | None:
        """(param, exp_avg, exp_avg_sq, copy) views per parameter; copy None where its entry in `copies` is."""
        fixed = []
        for p, m, v, c in zip(adam.params, adam.exp_avgs, adam.exp_avg_sqs, copies):
            kept = (p, m, v) if c is None else (p, m, v, c)
            if (p.dtype != torch.float32 or p.device.type != "cpu" or (c is not None and c.dtype != torch.bfloat16)
                    or any(t.stride() != p.stride() for t in kept[1:])):
                return None
            views = [memory_flat_array(t) for t in kept]
            if any(t is None for t in views):
                return None
            fixed.append((*views, None) if c is None else tuple(views))
        return fixed


class Adam:
    def __init__(self, params, lr: float, eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999),
                 flat: FlatParams | None = None, native: bool = True):
        """`flat`: these parameters' FlatParams; the moments are then views of two flat tensors too and
        a step is one update over the flat tensors (the same arithmetic, element by element). `native`: a
        float32 CPU flat step runs in fastrl_ext._optim (one pass, ~5 µs for the MLP presets' 9k weights,
        where torch's fused kernel and its step counter cost ~35), the same update to float rounding."""
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("Adam got no parameters that require grad")
        if flat is not None and [id(p) for p in flat.params] != [id(p) for p in self.params]:
            raise ValueError("Adam's flat buffer must hold exactly its parameters, in order")
        self.flat = flat
        self._native = _NativeViews()
        self._summed_jobs = None  # grad_sum_squares' jobs, for the step that follows it
        self.native = native
        device = self.params[0].device
        self.fused = _fused_kernel_works(device)
        # one group, in torch.optim's layout: the learner sets group["lr"] for its schedule
        self.param_groups = [{"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": 0.0, "amsgrad": False,
                              "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                              "fused": self.fused or None, "decoupled_weight_decay": False, "params": self.params}]
        # float32 scalar tensors, one per parameter, as torch keeps them (the fused kernel reads them);
        # with a flat buffer all parameters share one, as they always step together
        if flat is None:
            self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
            self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
            self.steps = [torch.zeros((), dtype=torch.float32, device=device) for _ in self.params]
        else:
            self.flat_exp_avg, self.flat_exp_avg_sq = torch.zeros_like(flat.data), torch.zeros_like(flat.data)
            self.exp_avgs = [self.flat_exp_avg[o:o + p.numel()].view_as(p) for p, o in self._offsets()]
            self.exp_avg_sqs = [self.flat_exp_avg_sq[o:o + p.numel()].view_as(p) for p, o in self._offsets()]
            self.flat_step = torch.zeros((), dtype=torch.float32, device=device)
            # the native step's view of it (CPU only; load_state_dict fills the tensor in place)
            self._flat_step_array = self.flat_step.numpy() if device.type == "cpu" else None
            self.steps = [self.flat_step] * len(self.params)

    def _offsets(self):
        offset = 0
        for p in self.params:
            yield p, offset
            offset += p.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._summed_jobs = None  # views of the gradients about to go
        if self.flat is not None:  # the gradients are views of the flat buffer: zeroed, never dropped
            self.flat.zero_grad()
            return
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def grad_sum_squares(self) -> float | None:
        """The gradients' sum of squares through fastrl_ext._optim, one pass each, where the next `step`
        runs there over parameters kept apart (no flat buffer, no bf16 copies): the clip's norm, whose
        scale that step applies as it reads the gradients. None elsewhere: the caller clips with torch.

        Why: the fp32 Nature CNN's clip (a norm per tensor, then a scale that rewrites the gradients) and
        torch's fused Adam ran on the learner's two OpenMP threads, which these memory-bound passes do not
        pay for: inside Pong's fp32 learner, 87.2 wall ms a batch (32 steps) against 61.4 for this sum and
        the native step on one thread (bench/optim_microbench.py --learner)."""
        if not self.native or self.flat is not None:
            return None
        jobs = self._native.jobs(self, None)
        if jobs is None:
            return None
        self._summed_jobs = jobs  # the step reads the same gradients: its views cost ~75 µs to make again
        return sum(_optim.sum_squares(job[1]) for job in jobs if job is not None)

    def steps_on_pieces(self, bf16_copies: list) -> bool:
        """Whether `step(grad_mul, bf16_copies, grad_pieces)` can run: fastrl_ext._optim built and every
        parameter, moment and copy a buffer it takes."""
        return self._native.fixed_for(self, bf16_copies) is not None

    @torch.no_grad()
    def step(self, grad_mul: torch.Tensor | float | None = None, bf16_copies: list | None = None,
             grad_pieces: list | None = None) -> bool:
        """One update. `grad_mul` (a 0-dim tensor or a float, at most 1: a clip's scale) multiplies the
        gradients first; torch's fused kernel does it in place, as the divisor it calls grad_scale (the
        product may differ from `g * grad_mul` in the last bit).

        `bf16_copies`: one bf16 tensor per parameter (a working copy's layers, fastrl.algo.bf16_copy)
        to round the new weights into. Where fastrl_ext._optim can take the whole step it does, in one
        pass per parameter that also writes those copies (the gradients are then left unscaled), and
        this returns True; otherwise torch steps and the copies are left as they were (False).

        `grad_pieces` (with `bf16_copies`; see Bf16WorkingCopy.gradient_pieces): per parameter, the flat
        bf16 gradient pieces to step on instead of its `.grad`, summed as they are read; None for a
        parameter without a gradient. Only where `steps_on_pieces` holds: there is no `.grad` to fall
        back on."""
        if grad_pieces is not None:
            self._pieces_step(grad_mul, bf16_copies, grad_pieces)
            return True
        if (bf16_copies is not None or self.native) and self._native_step(grad_mul, bf16_copies):
            return bf16_copies is not None
        self._torch_step(grad_mul)
        return False

    def _scalars(self, grad_mul: torch.Tensor | float | None) -> tuple:
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        return float(group["lr"]), beta1, beta2, float(group["eps"]), 1.0 if grad_mul is None else float(grad_mul)

    def _pieces_step(self, grad_mul: torch.Tensor | float | None, bf16_copies: list, grad_pieces: list) -> None:
        fixed = self._native.fixed_for(self, bf16_copies)
        if fixed is None or len(grad_pieces) != len(self.params):
            raise RuntimeError("Adam cannot step on gradient pieces here (check steps_on_pieces first)")
        self._summed_jobs = None
        lr, beta1, beta2, eps, mul = self._scalars(grad_mul)
        live = [i for i, pieces in enumerate(grad_pieces) if pieces is not None]
        torch._foreach_add_([self.steps[i] for i in live], 1)
        for i in live:
            p, m, v, copy = fixed[i]
            _optim.adam_step(p, grad_pieces[i], m, v, copy, lr, beta1, beta2, eps, float(self.steps[i]), mul)

    def _native_step(self, grad_mul: torch.Tensor | float | None, bf16_copies: list | None) -> bool:
        jobs = self._summed_jobs if bf16_copies is None else None  # the views grad_sum_squares just made
        self._summed_jobs = None
        if jobs is None:
            jobs = self._native.jobs(self, bf16_copies)
        if jobs is None:
            return False
        lr, beta1, beta2, eps, mul = self._scalars(grad_mul)
        if self.flat is not None:  # one job, one shared counter: counted through its numpy view (~6 µs less)
            self._flat_step_array += 1
            _optim.adam_step(*jobs[0], lr, beta1, beta2, eps, float(self._flat_step_array), mul)
            return True
        live = [(i, job) for i, job in enumerate(jobs) if job is not None]
        torch._foreach_add_([self.steps[i] for i, _ in live], 1)
        for i, (p, g, m, v, copy) in live:
            _optim.adam_step(p, g, m, v, copy, lr, beta1, beta2, eps, float(self.steps[i]), mul)
        return True

    def _torch_step(self, grad_mul: torch.Tensor | float | None) -> None:
        group = self.param_groups[0]
        lr, eps = float(group["lr"]), float(group["eps"])
        beta1, beta2 = group["betas"]
        if self.flat is not None:
            self.flat.check()
            params, grads, steps = [self.flat.data], [self.flat.grad], [self.flat_step]
            exp_avgs, exp_avg_sqs = [self.flat_exp_avg], [self.flat_exp_avg_sq]
        else:
            live = [i for i, p in enumerate(self.params) if p.grad is not None]
            if not live:
                return
            params = [self.params[i] for i in live]
            grads = [self.params[i].grad for i in live]
            exp_avgs = [self.exp_avgs[i] for i in live]
            exp_avg_sqs = [self.exp_avg_sqs[i] for i in live]
            steps = [self.steps[i] for i in live]
        scaled = grad_mul is not None and float(grad_mul) != 1.0
        if self.fused:
            torch._foreach_add_(steps, 1)
            divisor = torch.reciprocal(torch.as_tensor(grad_mul, dtype=torch.float32)).reshape(()) if scaled else None
            torch._fused_adam_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=lr, beta1=beta1,
                               beta2=beta2, weight_decay=0.0, eps=eps, maximize=False, grad_scale=divisor,
                               found_inf=None)
            return
        if scaled:
            torch._foreach_mul_(grads, grad_mul)
        for p, g, m, v, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
            step += 1
            t = float(step)
            m.lerp_(g, 1 - beta1)                       # m_t = b1 m + (1 - b1) g
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)  # v_t = b2 v + (1 - b2) g^2
            denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(eps)
            p.addcdiv_(m, denom, value=-lr / (1 - beta1 ** t))

    # --- checkpoints, in torch.optim.Adam's layout
    def state_dict(self) -> dict:
        state = {i: {"step": self.steps[i].clone(), "exp_avg": self.exp_avgs[i].clone(),
                     "exp_avg_sq": self.exp_avg_sqs[i].clone()}
                 for i in range(len(self.params)) if float(self.steps[i]) > 0}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.params):
            raise ValueError(f"optimizer state for {sum(len(g['params']) for g in groups)} parameters in "
                             f"{len(groups)} group(s); this model has {len(self.params)} in 1")
        for key in ("lr", "betas", "eps"):
            self.param_groups[0][key] = groups[0][key]
        ids = groups[0]["params"]
        for i, saved_id in enumerate(ids):
            saved = state_dict["state"].get(saved_id)
            if saved is None:
                continue
            if saved["exp_avg"].shape != self.params[i].shape:
                raise ValueError(f"optimizer state of parameter {i} has shape {tuple(saved['exp_avg'].shape)}, "
                                 f"the model's is {tuple(self.params[i].shape)}")
            self.exp_avgs[i].copy_(saved["exp_avg"])
            self.exp_avg_sqs[i].copy_(saved["exp_avg_sq"])
            self.steps[i].fill_(float(saved["step"]))
