// fastrl_ext: what _acting hands other native modules through its `_C_API` capsule, so that
// _rollout runs the same compiled forward (same flags, same bits) without a Python call per step.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

#define FASTRL_ACTING_CAPSULE "fastrl_ext._acting._C_API"

namespace fastrl_ext {

struct ActingApi {
    // Reads `plan` and `params` (as NumpyPolicy keeps them) once, holding their buffers: an opaque network
    // for `act`, or null with a Python error set. Give it back with `release`.
    void* (*bind)(PyObject* plan, PyObject* params);
    // act_mlp on raw rows with a bound network: obs [B, D] float32, random [B] or [B, A] float32; actions
    // int32/int64 (`int_action_bytes` 4 or 8, categorical) or float32 (0); the *_items counts are checked
    // against the network. 0, or -1 with a Python error set.
    int (*act)(const void* net, const float* obs, int64_t obs_items, const float* random, int64_t random_items,
               int64_t B, void* actions, int int_action_bytes, int64_t action_items, float* log_probs, float* values);
    void (*release)(void* net);
};

}  // namespace fastrl_ext
