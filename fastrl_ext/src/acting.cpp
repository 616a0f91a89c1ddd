// fastrl_ext._acting: a small MLP actor-critic's acting forward and action sampling, one call per batch.
//
// The reference is fastrl.models.numpy_policy.NumpyPolicy (forward, then sample), which this reproduces
// to float32 rounding:
//   x = obs, or clip((obs - mean) * inv_std, -10, 10) with observation normalisation
//   h = act(... act(x W1 + b1) ... Wn + bn)         act = tanh or relu; the critic has its own layers
//                                                   unless the encoder is shared (n_critic = 0)
//   params = h Wp + bp;  value = h_v Wv + bv
//   masked:      params_j = MASKED_LOGIT where the observation's mask column j is not > 0.5 (plan's mask_column)
//   categorical: z = params - max(params); log_p = z - log(sum(exp z)); the action is the number of
//                cumulative sums of exp z that are <= u * sum(exp z) (at most A - 1), u ~ U[0, 1)
//   several choices (plan's n_1 .. n_K): that draw on each choice's slice of the logits with its own u,
//                actions [K] per row, their log_p added in float32 choice after choice
//   Gaussian:    action = params + std * noise;  log_prob = -0.5 * sum(noise^2) + log_prob_const
// The random numbers (u, or the noise) come from the caller's numpy Generator, so both paths draw the
// same stream. Each W is a contiguous (in, out) matrix, as NumpyPolicy keeps it, except the narrow
// heads, kept (out, in) so that each output is one contiguous dot product.
//
// Why native: a rollout worker acting with a 2x64 MLP on 32 envs made ~25 numpy calls per env step
// (four matmuls, bias adds, tanh, softmax, cumsum, sampling), each microseconds of dispatch for
// nanoseconds of arithmetic. With the forward made free (a measurement hack, bench/README "Native
// acting"), CartPole's rollout workers sampled 2x and the whole run trained 1.5x as fast.
//
// The plan it reads, and the network that plan describes: acting_plan.h. Its dense layers, a row or a
// block of rows at a time: acting_dense.h. The categorical draw, and `sample_categorical` (the draw alone,
// after a forward that ran elsewhere): categorical_draw.h.
#include "acting_api.h"
#include "acting_dense.h"
#include "acting_plan.h"
#include "categorical_draw.h"
#include "buffer_view.h"
#include "isa.h"
#include "vectors.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using View = fastrl_ext::BufferView;
using fastrl_ext::acting::Layer;
using fastrl_ext::acting::ROWS;
using fastrl_ext::acting::dense_row;
using fastrl_ext::acting::dense_rows;
using fastrl_ext::acting::MASKED_LOGIT;
using fastrl_ext::acting::py_sample_categorical;
using fastrl_ext::acting::Net;
using fastrl_ext::acting::categorical_row;
using fastrl_ext::acting::fail;
using fastrl_ext::acting::read_plan;
using fastrl_ext::acting::refuse;

constexpr float NORM_CLIP = 10.0f;

enum Arg { PLAN, PARAMS, OBS, RANDOM, ACTIONS, LOG_PROBS, VALUES, NUM_ARGS };
const char* const NAMES[NUM_ARGS] = {"plan", "params", "obs", "random", "actions", "log_probs", "values"};

// Runs the layers on row `x` (width net.D), or on ROWS rows `stride` floats apart when BLOCK, through the
// ping-pong buffers; returns the last output.
template <typename V, bool BLOCK>
__attribute__((always_inline)) inline const float* trunk(const Net& net, const std::vector<Layer>& layers,
                                                          const float* x, float* buf0, float* buf1, int64_t stride) {
    const int act = net.relu ? 2 : 1;
    const float* in = x;
    float* out = buf0;
    for (const Layer& l : layers) {
        if (BLOCK) {
            dense_rows<V>(l, in, out, stride, act);
        } else {
            dense_row(l, in, out, act);
        }
        in = out;
        out = (out == buf0) ? buf1 : buf0;
    }
    return in;
}

// Row i's action and log-prob from its head outputs (the policy's params) and its random numbers.
__attribute__((always_inline)) inline void act_from_head(const Net& net, const float* o, float* head,
                                                         const float* random, int64_t i, int64_t* actions_i,
                                                         float* actions_f, float* log_probs) {
    const int64_t A = net.A;
    if (net.mask_column >= 0) {
        const float* allowed = o + net.mask_column;
        for (int64_t j = 0; j < A; ++j) head[j] = allowed[j] > 0.5f ? head[j] : MASKED_LOGIT;
    }
    if (net.discrete && net.choices.empty()) {
        categorical_row(head, A, random[i], &actions_i[i], &log_probs[i]);
    } else if (net.discrete) {
        const int64_t K = static_cast<int64_t>(net.choices.size());
        const float* logits = head;
        float log_prob = 0.0f;
        for (int64_t c = 0; c < K; ++c) {
            float choice_log_prob;
            categorical_row(logits, net.choices[c], random[i * K + c], &actions_i[i * K + c], &choice_log_prob);
            log_prob += choice_log_prob;
            logits += net.choices[c];
        }
        log_probs[i] = log_prob;
    } else {
        const float* noise = random + i * A;
        float sq = 0.0f;
        for (int64_t j = 0; j < A; ++j) {
            actions_f[i * A + j] = head[j] + net.std_dev[j] * noise[j];
            sq += noise[j] * noise[j];
        }
        log_probs[i] = -0.5f * sq + net.log_prob_const;
    }
}

// Rows [i0, i0 + ROWS) when BLOCK, else row i0 alone: the forward, then each row's draw.
template <typename V, bool BLOCK>
__attribute__((always_inline)) inline void act_some_rows(const Net& net, const float* obs, const float* random,
                                                         int64_t i0, int64_t* actions_i, float* actions_f,
                                                         float* log_probs, float* values, float* work) {
    constexpr int64_t rows = BLOCK ? ROWS : 1;
    const int64_t W = net.widest, D = net.D;
    const int64_t part = rows * W;  // each buffer holds `rows` rows, W floats apart
    float* x = work;
    float* a0 = work + part;
    float* a1 = work + 2 * part;
    float* c0 = work + 3 * part;
    float* c1 = work + 4 * part;
    float* head = work + 5 * part;
    for (int64_t r = 0; r < rows; ++r) {
        const float* o = obs + (i0 + r) * D;
        float* xr = x + r * W;
        if (net.normalized) {
            for (int64_t k = 0; k < D; ++k)
                xr[k] = std::min(std::max((o[k] - net.mean[k]) * net.inv_std[k], -NORM_CLIP), NORM_CLIP);
        } else {
            std::memcpy(xr, o, sizeof(float) * D);
        }
    }
    const float* h = trunk<V, BLOCK>(net, net.actor, x, a0, a1, W);
    const float* h_v = net.critic.empty() ? h : trunk<V, BLOCK>(net, net.critic, x, c0, c1, W);
    if (BLOCK) {
        dense_rows<V>(net.value_head, h_v, head, W, 0);
    } else {
        dense_row(net.value_head, h_v, head, 0);
    }
    for (int64_t r = 0; r < rows; ++r) values[i0 + r] = head[r * W];
    if (BLOCK) {
        dense_rows<V>(net.policy_head, h, head, W, 0);
    } else {
        dense_row(net.policy_head, h, head, 0);
    }
    for (int64_t r = 0; r < rows; ++r)
        act_from_head(net, obs + (i0 + r) * D, head + r * W, random, i0 + r, actions_i, actions_f, log_probs);
}

// The whole batch, compiled below once per instruction set with its vector type V; `act_batch` picks one
// by the CPU.
template <typename V>
__attribute__((always_inline)) inline void act_rows(const Net& net, const float* obs, const float* random, int64_t B,
                                                    int64_t* actions_i, float* actions_f, float* log_probs,
                                                    float* values, float* work) {
    int64_t i = 0;
    for (; i + ROWS <= B; i += ROWS)
        act_some_rows<V, true>(net, obs, random, i, actions_i, actions_f, log_probs, values, work);
    for (; i < B; ++i) act_some_rows<V, false>(net, obs, random, i, actions_i, actions_f, log_probs, values, work);
}

using ActFn = void (*)(const Net&, const float*, const float*, int64_t, int64_t*, float*, float*, float*, float*);

void act_default(const Net& net, const float* obs, const float* random, int64_t B, int64_t* actions_i,
                 float* actions_f, float* log_probs, float* values, float* work) {
    act_rows<fastrl_ext::Vec4>(net, obs, random, B, actions_i, actions_f, log_probs, values, work);
}

#if FASTRL_X86_VARIANTS
FASTRL_TARGET_AVX2 void act_avx2(const Net& net, const float* obs, const float* random, int64_t B, int64_t* actions_i,
                                 float* actions_f, float* log_probs, float* values, float* work) {
    act_rows<fastrl_ext::Vec8>(net, obs, random, B, actions_i, actions_f, log_probs, values, work);
}

FASTRL_TARGET_AVX512 void act_avx512(const Net& net, const float* obs, const float* random, int64_t B,
                                     int64_t* actions_i, float* actions_f, float* log_probs, float* values,
                                     float* work) {
    act_rows<fastrl_ext::Vec16>(net, obs, random, B, actions_i, actions_f, log_probs, values, work);
}
const ActFn act_variants[] = {act_default, act_avx2, act_avx512};  // by fastrl_ext::isa_level()
#else
const ActFn act_variants[] = {act_default, act_default, act_default};
#endif

ActFn act_batch = act_default;

bool has_kind(const View& v, char kind, Py_ssize_t itemsize, int arg) {
    const char k = v.kind();
    const bool ok = kind == 'i' ? ((k == 'i' || k == 'l' || k == 'q') && v.buf.itemsize == itemsize) : k == kind;
    if (!ok) PyErr_Format(PyExc_TypeError, "act_mlp: %s has the wrong dtype", NAMES[arg]);
    return ok;
}

// The checked batch forward on a read network: `int_action_bytes` 4 or 8 for categorical actions written
// as int32/int64, 0 for float32 (Gaussian) actions. 0, or -1 with an error set.
int act_net(const Net& net, const float* obs, int64_t obs_items, const float* random, int64_t random_items,
            int64_t B, void* actions, int int_action_bytes, int64_t action_items, float* log_probs,
            int64_t log_prob_items, float* values) {
    if (net.discrete ? int_action_bytes == 0 : int_action_bytes != 0) {
        PyErr_Format(PyExc_TypeError, "act_mlp: %s has the wrong dtype", NAMES[ACTIONS]);
        return -1;
    }
    if (obs_items != B * net.D) return refuse("obs is not [B, D] for the network's D and values' B");
    if (log_prob_items != B) return refuse("log_probs must hold B values");
    // a value per row for one categorical, one per choice for several, one per dimension for a Gaussian
    const int64_t per_action = net.discrete ? std::max<int64_t>(1, static_cast<int64_t>(net.choices.size())) : net.A;
    if (action_items != B * per_action)
        return refuse("actions must be [B] (categorical), [B, K] (K choices) or [B, A] (Gaussian)");
    if (random_items != B * per_action) return refuse("random must be [B] or [B, K] uniforms, or [B, A] normals");
    const bool int32_actions = int_action_bytes == 4;
    // the work rows live as long as the thread; resized only when a wider network arrives
    thread_local std::vector<float> work;
    if (static_cast<int64_t>(work.size()) < 6 * ROWS * net.widest) work.resize(6 * ROWS * net.widest);
    thread_local std::vector<int64_t> narrow;  // int64 actions before an int32 destination
    if (int32_actions && static_cast<int64_t>(narrow.size()) < B * per_action) narrow.resize(B * per_action);
    int64_t* actions_i = int32_actions ? narrow.data() : static_cast<int64_t*>(actions);
    act_batch(net, obs, random, B, actions_i, static_cast<float*>(actions), log_probs, values, work.data());
    if (int32_actions) {
        int32_t* out = static_cast<int32_t*>(actions);
        for (int64_t i = 0; i < B * per_action; ++i) out[i] = static_cast<int32_t>(actions_i[i]);
    }
    return 0;
}

PyObject* py_act_mlp(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != NUM_ARGS) {
        PyErr_Format(PyExc_TypeError, "act_mlp takes %d arguments (%s, ...)", NUM_ARGS, NAMES[0]);
        return nullptr;
    }
    View v[NUM_ARGS];
    for (int k = 0; k < NUM_ARGS; ++k) {
        if (!v[k].get(args[k], k >= ACTIONS, "act_mlp", NAMES[k])) return nullptr;
    }
    if (!has_kind(v[PLAN], 'i', 8, PLAN) || !has_kind(v[PARAMS], 'f', 4, PARAMS) || !has_kind(v[OBS], 'f', 4, OBS) ||
        !has_kind(v[RANDOM], 'f', 4, RANDOM) || !has_kind(v[LOG_PROBS], 'f', 4, LOG_PROBS) ||
        !has_kind(v[VALUES], 'f', 4, VALUES))
        return nullptr;
    // categorical actions go out as int64, or as int32 straight into a trajectory slot
    const Py_ssize_t action_bytes = v[ACTIONS].buf.itemsize;
    const char k = v[ACTIONS].kind();
    const bool int_actions = (k == 'i' || k == 'l' || k == 'q') && (action_bytes == 4 || action_bytes == 8);
    if (!int_actions && !has_kind(v[ACTIONS], 'f', 4, ACTIONS)) return nullptr;
    thread_local Net net;  // no allocation per call once its layer vectors have grown
    if (!read_plan(v[PLAN], v[PARAMS], net)) return nullptr;
    if (act_net(net, static_cast<const float*>(v[OBS].buf.buf), v[OBS].items(),
                static_cast<const float*>(v[RANDOM].buf.buf), v[RANDOM].items(), v[VALUES].items(),
                v[ACTIONS].buf.buf, int_actions ? static_cast<int>(action_bytes) : 0, v[ACTIONS].items(),
                static_cast<float*>(v[LOG_PROBS].buf.buf), v[LOG_PROBS].items(),
                static_cast<float*>(v[VALUES].buf.buf)) != 0)
        return nullptr;
    Py_RETURN_NONE;
}

// fastrl_ext._rollout's way in (see acting_api.h): the network read once for a call of many steps; its
// views keep the plan's and weights' buffers held for as long as the binding lives
struct BoundNet {
    View plan, params;
    Net net;
};

void* bind_net(PyObject* plan_obj, PyObject* params_obj) {
    auto* bound = new BoundNet;
    if (!bound->plan.get(plan_obj, false, "act_mlp", NAMES[PLAN]) ||
        !bound->params.get(params_obj, false, "act_mlp", NAMES[PARAMS]) || !has_kind(bound->plan, 'i', 8, PLAN) ||
        !has_kind(bound->params, 'f', 4, PARAMS) || !read_plan(bound->plan, bound->params, bound->net)) {
        delete bound;
        return nullptr;
    }
    return bound;
}

void release_net(void* bound) { delete static_cast<BoundNet*>(bound); }

int act_bound(const void* bound, const float* obs, int64_t obs_items, const float* random, int64_t random_items,
              int64_t B, void* actions, int int_action_bytes, int64_t action_items, float* log_probs, float* values) {
    return act_net(static_cast<const BoundNet*>(bound)->net, obs, obs_items, random, random_items, B, actions,
                   int_action_bytes, action_items, log_probs, B, values);
}

const fastrl_ext::ActingApi api = {bind_net, act_bound, release_net};

PyMethodDef methods[] = {
    {"act_mlp", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_act_mlp)), METH_FASTCALL,
     "act_mlp(plan, params, obs, random, actions, log_probs, values): one batch's forward and sampling, "
     "written into actions, log_probs and values."},
    {"sample_categorical", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_sample_categorical)),
     METH_FASTCALL,
     "sample_categorical(logits, random, actions, log_probs[, choices]): one categorical draw per row of float32 "
     "logits [B, A] from uniforms [B] (or one per choice of several, [B, K], each over its slice of the row), "
     "written into int32/int64 actions and float32 log_probs."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_acting", "A small MLP policy's acting forward (fastrl_ext).", -1,
                      methods};

}  // namespace

PyMODINIT_FUNC PyInit__acting() {
    PyObject* m = PyModule_Create(&module);
    // which compiled variant runs the batch: "avx512", "avx2" or "default"
    const int level = fastrl_ext::isa_level();
    act_batch = act_variants[level];
    if (m != nullptr && PyModule_AddStringConstant(m, "ISA", fastrl_ext::isa_name(level)) != 0) {
        Py_DECREF(m);
        return nullptr;
    }
    if (m == nullptr) return nullptr;
    PyObject* capsule = PyCapsule_New(const_cast<fastrl_ext::ActingApi*>(&api), FASTRL_ACTING_CAPSULE, nullptr);
    if (capsule == nullptr || PyModule_AddObject(m, "_C_API", capsule) != 0) {  // steals capsule only on success
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
