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

Where fastrl_ext._optim is built, the optimizer step after the pieces' backward takes two passes
instead of six: the pieces summed with the squares the clip needs (`set_master_grads`), then Adam
with the clip's scale, which also rounds the new weights into this copy (`written_by_step`), so the
next refresh has nothing to cast.

Where Adam also steps natively, the fp32 `.grad` need not exist at all (`gradient_pieces`): the pieces'
sum of squares is taken without writing their sum, and Adam sums them again as it reads them, the
same float32 sums in the same order. A Pong optimizer step then reads 3.4 MB of bf16 gradient once
more instead of writing and reading back 6.8 MB of fp32 (bench/optim_microbench.py).

Everything else is shared or copied as fp32: the observation normalizer is the master's own module
(its statistics are updated there), a Gaussian head's log-std is copied at every refresh like the
layers and its gradient comes back in fp32.
"""

from __future__ import annotations

import copy

import torch

from fastrl.algo.flat_params import memory_flat_array
from fastrl.algo.split_backward import WeightGradThread, wrap_cnn_layers
from fastrl.models import ActorCritic
from fastrl_ext import _optim


def _piece_views(dst: torch.Tensor, present: list) -> list | None:
    """The flat int16 views fastrl_ext._optim reads `present` (one parameter's bf16 gradient pieces) through,
    in `dst`'s memory order; None where a piece does not suit it."""
    if (len(present) > 8 or dst.dtype != torch.float32 or dst.device.type != "cpu"
            or any(g.dtype != torch.bfloat16 or g.stride() != dst.stride() for g in present)):
        return None
    views = [memory_flat_array(g) for g in present]
    return None if any(v is None for v in views) else views


def _native_sum(dsts: list, pieces: list) -> float | None:
    """fastrl_ext._optim over every parameter: the pieces summed into dsts and the sum of the
    squares of everything written; None (nothing written) when some tensor does not suit it."""
    if _optim is None:
        return None
    jobs = []
    for dst, present in zip(dsts, pieces):
        flat_dst, flat_pieces = memory_flat_array(dst), _piece_views(dst, present)
        if flat_dst is None or flat_pieces is None:
            return None
        jobs.append((flat_dst, flat_pieces))
    return sum(_optim.sum_pieces(dst, flat_pieces) for dst, flat_pieces in jobs)


class Bf16WorkingCopy:
    def __init__(self, master: ActorCritic, native: bool = True):
        """`native`: sum the gradient pieces with fastrl_ext._optim where it is built (the same bits as
        torch's cast and add, and the sum of squares on the way; see set_master_grads), and let the
        optimizer's native step write the new weights into the copy (see written_by_step)."""
        self.native = native
        self.fresh_versions = None  # see written_by_step
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
        self.weight_grads = None  # see split_weight_grads
        if [p.shape for p in self.params] != [p.shape for p in self.master_params]:
            raise RuntimeError("the working copy's parameters do not line up with the master's")
        self._copy_of = {id(m): c for m, c in zip(self.master_params, self.params)}  # see current_copies

    @torch.no_grad()
    def refresh(self) -> None:
        """Round the master's current weights into the copy (after every optimizer step, or a load),
        unless the step itself wrote them there and nothing has changed the master since."""
        if self.fresh_versions is not None and self.fresh_versions == [p._version for p in self.master_params]:
            return
        self.fresh_versions = None
        torch._foreach_copy_(self.params, self.master_params)

    def written_by_step(self) -> None:
        """The optimizer has just rounded the master's new weights into the copy (Adam.step's
        `bf16_copies`). Its kernel writes raw memory, which leaves the master's version counters as they
        were; any later change through torch (a checkpoint load, a torch step) bumps one, and the next
        refresh then casts again."""
        self.fresh_versions = [p._version for p in self.master_params]

    def current_copies(self, tensors: list) -> list | None:
        """The copy's bf16 tensors standing for the master's `tensors`, in their order, while they hold the
        master's current weights as the optimizer's step rounded them (written_by_step, nothing changed
        since): what the learner publishes to actors that act in bf16 (fastrl.buffers.weights), with nothing
        to round again. None otherwise, or where one of `tensors` has no bf16 copy."""
        if self.fresh_versions is None or self.fresh_versions != [p._version for p in self.master_params]:
            return None
        copies = [self._copy_of.get(id(t)) for t in tensors]
        return None if any(c is None or c.dtype != torch.bfloat16 for c in copies) else copies

    def split_weight_grads(self, thread: WeightGradThread) -> None:
        """From now on the copy's CNN layers hand their weight gradients to `thread` during the
        backward (fastrl.algo.split_backward); `gradients` collects them. One caller at a time then."""
        if wrap_cnn_layers(self.model, thread) == 0:
            raise ValueError("splitting the backward by weight gradients needs a Nature CNN encoder")
        self.weight_grads = thread

    def gradients(self, loss: torch.Tensor) -> tuple:
        """d loss / d the copy's parameters (bf16 for the layers; None for a parameter the loss
        does not reach). Never accumulates anywhere, so pieces on several threads can each call it
        (unless the weight gradients are split off: see split_weight_grads)."""
        if self.weight_grads is not None:
            return self.weight_grads.gradients(loss, self.params)
        return torch.autograd.grad(loss, self.params, allow_unused=True)

    def gradient_pieces(self, pieces: list) -> tuple[float, list] | None:
        """`pieces` (one tuple per piece, as `gradients` returns) left where they are for Adam to sum as it
        steps (Adam.step's `grad_pieces`): (the sum of the squares of their per-parameter sums, one list of
        flat int16 views per master parameter, None for one no piece reached). The sum of squares is
        set_master_grads' to the bit; nothing is written. None where fastrl_ext._optim cannot take them
        (or `native` is off): set_master_grads then."""
        if not self.native or _optim is None:
            return None
        views, sum_sq = [], 0.0
        for i, p in enumerate(self.master_params):
            present = [grads[i] for grads in pieces if grads[i] is not None]
            if not present:
                views.append(None)
                continue
            flat = _piece_views(p, present)
            if flat is None:
                return None
            views.append(flat)
        for flat in views:
            if flat is not None:
                sum_sq += _optim.sum_pieces(None, flat)
        return sum_sq, views

    @torch.no_grad()
    def set_master_grads(self, pieces: list) -> float | None:
        """Each master parameter's `.grad` := the fp32 sum of its gradients in `pieces` (one tuple
        per piece, as `gradients` returns), after the optimizer's zero_grad. An existing `.grad` is
        overwritten in place, so gradients that are views of a flat buffer (fastrl.algo.flat_params)
        stay attached; a missing one gets the parameter's own memory layout, as autograd gives it. A
        parameter no piece reached keeps what zero_grad left, as after `backward()`.

        Returns the sum of the squares of every `.grad` value set, when fastrl_ext._optim did the
        sum (one pass over the pieces instead of torch's cast-copy and add, and the clip's norm
        without another read; with its Adam pass, bench/optim_microbench.py reads 3.24 -> 2.45 CPU-ms
        per optimizer step of Pong's CNN); None when torch did, and the clip then reads the
        gradients for its norm."""
        dsts, present_pieces = [], []
        for i, p in enumerate(self.master_params):
            present = [grads[i] for grads in pieces if grads[i] is not None]
            if not present:
                continue
            if p.grad is None:
                p.grad = torch.empty_like(p, memory_format=torch.preserve_format)
            dsts.append(p.grad)
            present_pieces.append(present)
        if self.native:
            sum_sq = _native_sum(dsts, present_pieces)
            if sum_sq is not None:
                return sum_sq
        torch._foreach_copy_(dsts, [present[0] for present in present_pieces])
        rest = [present[1:] for present in present_pieces]
        for k in range(max((len(r) for r in rest), default=0)):
            pairs = [(d, r[k]) for d, r in zip(dsts, rest) if len(r) > k]
            torch._foreach_add_([d for d, _ in pairs], [g for _, g in pairs])
        return None
