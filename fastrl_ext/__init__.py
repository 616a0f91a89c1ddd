"""fastrl's native (C++) hot path, built by the ordinary `pip install` (setuptools + g++).

`_rings`: push, pop and wait on the shared-memory rings and futex doorbells of
`fastrl.ipc.rings`, whose pure-Python classes are the reference these are tested against
(tests/test_rings.py runs every ring test on both). `system.native_rings` picks one per run.

`_vtrace`: V-trace's targets in one pass of C++ loops, for CPU tensors; `fastrl.algo.vtrace.vtrace_torch`
is the reference (tests/test_vtrace.py checks both against the paper). `algo.native_vtrace` picks.

`_appo_loss`: the APPO loss and its gradient in one C++ pass, for CPU tensors;
`fastrl.algo.appo_loss.appo_loss_torch` is the reference (tests/test_appo_loss.py checks both against
the formulas and each other's gradients). `algo.native_loss` picks.

`_record`: a rollout worker's writes of one env step into its trajectory slot, from envpool's raw
outputs, and the reward scaling (`scale_rewards`); `fastrl.workers.recording.PythonRecorder` and
`fastrl.algo.reward_scaling.ReturnScaler` are the references (tests/test_recording.py and
tests/test_reward_scaling.py check they write the same bytes). `system.native_record` picks.

`_acting`: a small MLP policy's acting forward and action sampling in one call, for rollout workers
that act themselves; `fastrl.models.numpy_policy.NumpyPolicy` is the reference (tests/test_numpy_policy.py
holds them together). Its categorical draw alone (`sample_categorical`) takes an inference worker's torch
logits straight into the slot cells (tests/test_categorical_draw.py). `system.native_acting` picks.

`_activations`: tanh and its gradient for the learner's MLPs, vectorised for AVX-512 and AVX2 (torch's
CPU tanh is scalar, numpy's vectorised only on AVX-512); `torch.tanh` is the reference
(tests/test_activations.py). Used by `fastrl.models.activations` for large float32 CPU tensors. And the
ReLU's gradient on bf16 or float32 bits, torch's `threshold_backward` the reference (same tests), for the
CNN's conv ReLUs in the learner's split backward (`fastrl.models.conv_relu.relu_backward`).

`_rollout`: a rollout worker's env steps between two slot boundaries in one call, from `_record`'s
arithmetic and `_acting`'s kernel (through its capsule); `fastrl.workers.rollout.RolloutWorker.pump` is
the reference (tests/test_native_steps.py and tests/test_serial.py hold them to the same bytes).
`system.native_rollout_loop` picks.

`_frames`: uint8 frames to the Nature CNN's input (cast, scaled to [0, 1], relaid to channels-last, or
cut into the 4x4 tiles of a space-to-depth first conv) in one pass, float32 or bf16; torch's passes are
the reference (tests/test_frames.py), checked for every byte value before first use. Used by
`fastrl.models.frames` for contiguous CPU frames.

`_optim`: the learner's optimizer step through a bf16 working copy: the shards' bf16 gradient pieces
summed into the float32 `.grad` with the clip's sum of squares, and Adam with the clip's scale that
also rounds the new weights into the copy, one pass each; torch's cast-copy and add, clip, fused Adam
and refresh cast are the references (tests/test_optim.py, tests/test_bf16_copy.py). Used by
`fastrl.algo.bf16_copy` and `fastrl.algo.adam`; its Adam pass alone steps the MLP presets' flat float32
weights, and `sum_squares` gives the native gradient chain its clip norm (numpy's float64 sum the reference).

`_mlp`: an fp32 MLP's layers (products, biases, tanh or ReLU) forward and backward in one call each,
vectorised the same way; torch's layers and autograd are the reference (tests/test_native_mlp.py). Used
by `fastrl.models.native_mlp` for the MLP presets' actor and critic (`model.native_mlp`); its `normalize`
is the observation normaliser's forward, bit for bit, for `fastrl.algo.native_gradient`.

`_policy_head`: the categorical or Gaussian policy's log-probabilities and entropies, and their gradients,
one call each; `ActorCritic.log_prob` and `entropy` through torch's autograd are the reference
(tests/test_native_gradient.py). Used by `fastrl.algo.native_gradient` (`algo.native_gradient`).

`_atari_frames`: an Atari frame's area-average resize (OpenCV's INTER_AREA, which envpool runs, bit for bit)
and the frame stack, for rollout workers that take envpool's raw 210x160 frames; envpool's own 84x84 stacks
are the reference (tests/test_atari_frames.py). Used by `fastrl.envs.atari_frames` (`env.atari_frames`).

`_conv_grad`: a bf16 conv's weight and bias gradients as one product on the AMX tiles of Intel CPUs that
have them, for the learner's backward; a float64 reference and oneDNN's `convolution_backward` are what
it is held to (tests/test_conv_weight_grad.py). Used by `fastrl.models.conv_weight_grad`.
"""

try:
    from fastrl_ext import _acting, _activations, _atari_frames, _appo_loss, _conv_grad, _frames, _mlp, _optim, _policy_head, _record, _rings, _vtrace
    from fastrl_ext import _rollout  # after _acting, whose capsule it imports
except ImportError as err:  # not built (no compiler at install time): the Python paths still work
    _acting = _activations = _atari_frames = _appo_loss = _conv_grad = _frames = _mlp = _optim = _policy_head = _record = _rings = _rollout = _vtrace = None
    BUILD_ERROR = str(err)
else:
    BUILD_ERROR = ""

__all__ = ["_acting", "_activations", "_atari_frames", "_appo_loss", "_conv_grad", "_frames", "_mlp", "_optim", "_policy_head", "_record", "_rings", "_rollout", "_vtrace", "BUILD_ERROR"]
