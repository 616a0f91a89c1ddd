"""The learner's bf16 working copy of its network (model.precision=bf16): the conv and linear weights
cast to bf16 once per optimizer step, and the gradients taken with respect to those bf16 weights cast
back into the fp32 parameters' `.grad`.

Under autocast each forward casts every conv and linear weight from fp32 to bf16 for itself, and its
backward casts every weight gradient back to fp32 and accumulates it: the learner's two shards
(fastrl.algo.shards) each paid that for the Nature CNN's 1.7M weights at every minibatch, and the
no-grad forward once per chunk. Here one copy of the network holds those layers in bf16, refreshed
from the fp32 weights (what Adam updates and checkpoints and publishing read) by one cast per step;
every piece's gradient comes back in bf16 and the pieces are cast and summed into `.grad` in one
pass. The bf16 weights are the roundings autocast makes and the fp32 sum is the one its
accumulation makes, so the gradients are autocast's to the bit (tests/test_bf16_copy.py).

Everything else is shared or copied as fp32: the observation normalizer is the master's own module
(its statistics are updated there), a Gaussian head's log-std is copied at every refresh like the
layers and its gradient comes back in fp32.
"""

from __future__ import annotations

import copy

import torch

from fastrl.models import ActorCritic


class Bf16WorkingCopy:
    def __init__(self, master: ActorCritic):
        if not master.bf16:
            raise ValueError("a bf16 working copy is for a network that runs in bf16 (model.precision=bf16)")
        self.master_params = [p for p in master.parameters() if p.requires_grad]
        normalizer = master.normalizer
        master.normalizer = None  # shared, not copied: a copy would keep stale statistics
        try:
            model = copy.deepcopy(master)
        finally:
            master.normalizer = normalizer
        model.normalizer = normalizer
        model.hold_layer_weights_in_bf16()
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        if [p.shape for p in self.params] != [p.shape for p in self.master_params]:
            raise RuntimeError("the working copy's parameters do not line up with the master's")

    @torch.no_grad()
    def refresh(self) -> None:
        """Round the master's current weights into the copy (after every optimizer step, or a load)."""
        torch._foreach_copy_(self.params, self.master_params)

    def gradients(self, loss: torch.Tensor) -> tuple:
        """d loss / d the copy's parameters (bf16 for the layers; None for a parameter the loss
        does not reach). Never accumulates anywhere, so pieces on several threads can each call it."""
        return torch.autograd.grad(loss, self.params, allow_unused=True)

    @torch.no_grad()
    def set_master_grads(self, pieces: list) -> None:
        """Each master parameter's `.grad` := the fp32 sum of its gradients in `pieces` (one tuple
        per piece, as `gradients` returns), after the optimizer's zero_grad. An existing `.grad` is
        overwritten in place, so gradients that are views of a flat buffer (fastrl.algo.flat_params)
        stay attached; a missing one gets the parameter's own memory layout, as autograd gives it. A
        parameter no piece reached keeps what zero_grad left, as after `backward()`."""
        dsts, firsts, rest = [], [], []
        for i, p in enumerate(self.master_params):
            present = [grads[i] for grads in pieces if grads[i] is not None]
            if not present:
                continue
            if p.grad is None:
                p.grad = torch.empty_like(p, memory_format=torch.preserve_format)
            dsts.append(p.grad)
            firsts.append(present[0])
            rest.append(present[1:])
        torch._foreach_copy_(dsts, firsts)
        for k in range(max((len(r) for r in rest), default=0)):
            pairs = [(d, r[k]) for d, r in zip(dsts, rest) if len(r) > k]
            torch._foreach_add_([d for d, _ in pairs], [g for _, g in pairs])
