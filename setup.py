"""Build of fastrl_ext's native modules; everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

# the learner's pieces and the rollout worker's recorder share one header for the buffer protocol
# (numpy arrays and views of CPU tensors)
LEARNER_HEADERS = ["fastrl_ext/src/buffer_view.h"]
RECORD_CORE = "fastrl_ext/src/record_core.h"  # the recording arithmetic, shared by _record and _rollout
ACTING_API = "fastrl_ext/src/acting_api.h"    # what _acting's capsule hands _rollout
ACTING_PLAN = "fastrl_ext/src/acting_plan.h"  # the acting MLP's plan format and its check
ACTING_DENSE = "fastrl_ext/src/acting_dense.h"  # its dense layers, a row or a block of rows at a time
CATEGORICAL_DRAW = "fastrl_ext/src/categorical_draw.h"  # _acting's draw, in its kernel and sample_categorical
EXP_POLY = "fastrl_ext/src/exp_poly.h"        # a vectorisable exp, for tanh_row.h and _policy_head's softmax
TANH_ROW = "fastrl_ext/src/tanh_row.h"        # the vectorisable tanh of _acting and _activations
ISA = "fastrl_ext/src/isa.h"                  # their instruction-set variant, picked at import
VECTORS = "fastrl_ext/src/vectors.h"          # one vector type per variant, for _mlp's and _acting's products
BF16 = "fastrl_ext/src/bf16.h"                # float32 -> bf16 rounding, shared by _frames and _optim


def native_module(name: str, depends: list = (), optimize: str = "-O2", flags: list = ()) -> Extension:
    """fastrl_ext._<name>, from fastrl_ext/src/<name>.cpp."""
    return Extension(f"fastrl_ext._{name}", sources=[f"fastrl_ext/src/{name}.cpp"], depends=list(depends),
                     language="c++", extra_compile_args=[optimize, "-std=c++17", "-fvisibility=hidden", *flags])


setup(
    ext_modules=[
        native_module("rings"),
        native_module("vtrace", LEARNER_HEADERS),
        native_module("appo_loss", LEARNER_HEADERS),
        # the policy's log-probabilities and entropies with their gradients, for the learner's minibatch
        # gradient without autograd (fastrl.algo.native_gradient)
        native_module("policy_head", [*LEARNER_HEADERS, EXP_POLY, ISA], optimize="-O3", flags=["-fno-trapping-math"]),
        # no fused multiply-adds: the reward scaler's float64 arithmetic matches numpy's bit for bit
        native_module("record", [*LEARNER_HEADERS, RECORD_CORE], flags=["-ffp-contract=off"]),
        # -O3: GCC 12 vectorises the MLP's row loops (trip counts known only at run time) only there
        native_module("acting", [*LEARNER_HEADERS, ACTING_API, ACTING_PLAN, ACTING_DENSE, CATEGORICAL_DRAW, TANH_ROW,
                                 EXP_POLY, ISA, VECTORS],
                      optimize="-O3", flags=["-fno-trapping-math"]),
        # the learner's MLP forward and backward, one call each: the same tanh loop, products vectorised the same way
        native_module("mlp", [*LEARNER_HEADERS, TANH_ROW, EXP_POLY, ISA, VECTORS], optimize="-O3", flags=["-fno-trapping-math"]),
        # the learner's tanh: the same loop and flags as _acting's
        native_module("activations", [*LEARNER_HEADERS, TANH_ROW, EXP_POLY, ISA], optimize="-O3", flags=["-fno-trapping-math"]),
        # the CNN's input from uint8 frames (cast, scale, relayout in one pass), vectorised the same way
        native_module("frames", [*LEARNER_HEADERS, ISA, BF16], optimize="-O3", flags=["-fno-trapping-math"]),
        # the learner's bf16 gradient pieces into the fp32 .grad, with its sum of squares, vectorised the same way
        native_module("optim", [*LEARNER_HEADERS, ISA, BF16], optimize="-O3", flags=["-fno-trapping-math", "-fno-math-errno"]),
        # the rollout worker's steps between slot boundaries: record_core.h's arithmetic under the same
        # flag as _record (same bits), and _acting's kernel through its capsule (its own flags)
        # an Atari frame's area resize and the frame stack, for rollout workers taking envpool's raw frames: no
        # fused multiply-adds, so that the sums round as OpenCV's do in envpool (bit for bit)
        native_module("atari_frames", [*LEARNER_HEADERS, ISA], optimize="-O3", flags=["-ffp-contract=off"]),
        native_module("rollout", [*LEARNER_HEADERS, RECORD_CORE, ACTING_API], flags=["-ffp-contract=off"]),
        # a bf16 conv's weight and bias gradients on AMX tiles, for the learner (fastrl.models.conv_weight_grad);
        # GCC 12 warns of the undefined pass-through operand inside its own AVX-512 shift intrinsics
        native_module("conv_grad", [*LEARNER_HEADERS, BF16], optimize="-O3", flags=["-Wno-maybe-uninitialized"]),
    ],
)
