"""fastrl_ext's kernels are compiled for AVX-512, AVX2+FMA and plain x86-64 and picked by the CPU at import;
FASTRL_ACTING_ISA caps the pick, so the variants this machine would not choose are tested too: each kernel's
own tests run again in a fresh interpreter under the cap. One interpreter per variant for all the kernels,
not one per kernel's file: each start costs ~1.5 s of pytest and torch imports, and twelve of them were
~40 s of `make test`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from helpers import ROOT

# test file, the fastrl_ext module whose pick the cap must reach, the file's tests to run again (pytest -k)
KERNEL_TESTS = [
    ("test_activations.py", "_activations", "match_torch"),
    ("test_atari_frames.py", "_atari_frames", "matches_reference or envpools_own"),
    ("test_frames.py", "_frames", "matches_torch or blocks_are_torchs"),
    ("test_native_gradient.py", "_policy_head", "test_policy_head_matches_autograd"),
    ("test_native_mlp.py", "_mlp", "match_torch"),
    ("test_numpy_policy.py", "_acting", "native_act_matches or native_tanh"),
    ("test_optim.py", "_optim", "sum_matches_torch or non_finite or sum_squares or adam_step_matches or specials or adam_step_on_pieces"),
]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fastrl_ext._acting") is None,
                                reason="fastrl_ext not built")


@pytest.mark.parametrize("isa", ["avx2", "default"])
def test_every_compiled_variant_passes_its_kernels_tests(isa):
    env = dict(os.environ, FASTRL_ACTING_ISA=isa)
    modules = [module for _, module, _ in KERNEL_TESTS]
    chosen = subprocess.run([sys.executable, "-c", "import importlib; print(*(importlib.import_module("
                             f"'fastrl_ext.' + m).ISA for m in {modules!r}))"],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    picks = chosen.stdout.split()
    assert len(picks) == len(modules), chosen.stdout + chosen.stderr
    # a CPU without the variant falls back to "default"; anything wider means the cap did not reach it
    assert all(pick in (isa, "default") for pick in picks), dict(zip(modules, picks))

    # -k matches a test's module name as well as its own, so one expression picks each file's tests
    select = " or ".join(f"({file.removesuffix('.py')} and ({tests}))" for file, _, tests in KERNEL_TESTS)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                          *(f"tests/{file}" for file, _, _ in KERNEL_TESTS), "-k", select],
                         capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    report = out.stdout[-3000:] + out.stderr[-3000:]
    assert out.returncode == 0 and " passed" in out.stdout, report
    for file, _, _ in KERNEL_TESTS:  # every file's selection still names tests (a rename would drop them)
        assert f"PASSED tests/{file}::" in out.stdout, f"no test of {file} ran under {isa}\n{report}"
