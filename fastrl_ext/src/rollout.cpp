// fastrl_ext._rollout: a rollout worker's env steps between two slot boundaries in one call, for workers
// that act themselves with the native MLP kernel and record with the native recorder.
//
// The reference is RolloutWorker.pump (fastrl.workers.rollout) on that path, which this repeats step for
// step: for group k, send the actions of k and of k + 1 (double buffering) where not sent yet; collect k
// through envpool's raw `_recv` and record it (fastrl_ext._record's arithmetic, record_core.h); scale
// its rewards; act for k at t + 1 (fastrl_ext._acting's kernel, reached through its capsule); k + 1.
// Python keeps every step where a slot fills or a new one is taken, the weight refresh, the heartbeat
// and the stop flag; it passes `n_steps` such that no group collected in this call reaches t = T - 1,
// and the random numbers of those n_steps forwards. The loop ends early, before a step, once the
// learner has published weights newer than those it acts with (the shared header's sequence number
// moved): Python then reads them and takes the step itself, so every step acts with the weights the
// per-step path would have used, give or take one step.
//
// Why native: on CartPole, with the recorder and the forward already native, the Python around them
// (~20 calls, views and attribute lookups per env step of 32 envs) was the last cost between the
// sample stage and its bound: 0.4 µs of the ~3.8 µs each env step cost (bench/README).
#include "acting_api.h"
#include "record_core.h"

#include <memory>
#include <utility>
#include <vector>

namespace {

using namespace fastrl_ext::record;

enum LoopArg {
    L_GROUPS, L_SLOTS, L_SLOT_LIST, L_T_LIST, L_SENT_LIST, L_K, L_N_STEPS, L_PLAN, L_PARAMS, L_RANDOM, L_VERSION,
    L_WEIGHTS_SEQ, L_SEEN_SEQ, L_ACTION_LOW, L_ACTION_HIGH, L_ACTION_START, L_JOINT, L_MOMENTS, L_GAMMA, L_CLIP, L_EPS, L_FINISHED_SCORES, L_FINISHED_LENGTHS, L_NUM_ARGS
};
// a group: (send, send_args, recv, env_actions, output_index, was_reset, ep_score, ep_len, returns|None)
enum GroupItem { G_SEND, G_SEND_ARGS, G_RECV, G_ENV_ACTIONS, G_INDEX, G_WAS_RESET, G_EP_SCORE, G_EP_LEN, G_RETURNS, G_NUM };
// the slots: (obs, rewards, terminated, truncated, valid, actions, log_probs, values, policy_version)
enum SlotItem { S_OBS, S_REWARDS, S_TERMINATED, S_TRUNCATED, S_VALID, S_ACTIONS, S_LOG_PROBS, S_VALUES, S_VERSION, S_NUM };

const fastrl_ext::ActingApi* acting = nullptr;

bool refuse(const char* what) {
    PyErr_Format(PyExc_ValueError, "run_steps: %s", what);
    return false;
}

struct Group {
    PyObject *send, *send_args, *recv;  // borrowed from the caller's tuple, alive for the call
    View env_actions, returns;
    std::unique_ptr<View[]> v{new View[NUM_ARGS]};  // indexed by record_core's Arg: OBS..EP_LEN
    Target to;
    Py_ssize_t index[7];  // where obs, reward, done, trunc, env_id, score, game_over sit in recv's list
    bool scaled = false;
};

// The slots' actions, as the loop reads them to send, and what the env takes (fastrl.envs.actions.EnvActions)
struct Acting {
    const void* actions = nullptr;  // [S, T, N] or [S, T, N, K] int32 (K choices), or [S, T, N, A] float32
    Py_ssize_t per_action = 1;      // 1 (categorical), K (several choices) or A (Gaussian)
    bool int_actions = false;
    Py_ssize_t per_env_action = 1;   // per_action, or E where each action indexes the combinations of E choices
    const int32_t* start = nullptr;  // [per_env_action] added to each choice on its way to the env, or none
    const int32_t* joint = nullptr;  // [per_env_action] each choice's options, where actions index combinations
};

// N envs' discrete actions as the env takes them: each combination index unravelled into its choices, the
// last varying fastest (numpy's unravel_index), then each choice offset by its start
template <typename D>
void env_int_actions(const int32_t* src, D* dst, Py_ssize_t N, const Acting& a) {
    const Py_ssize_t E = a.per_env_action;
    for (Py_ssize_t i = 0; i < N; ++i) {
        D* out = dst + i * E;
        if (a.joint != nullptr) {
            int64_t rest = src[i];
            for (Py_ssize_t j = E - 1; j >= 0; --j) {
                out[j] = static_cast<D>(rest % a.joint[j]);
                rest /= a.joint[j];
            }
        } else {
            for (Py_ssize_t j = 0; j < E; ++j) out[j] = static_cast<D>(src[i * E + j]);
        }
        if (a.start != nullptr) {
            for (Py_ssize_t j = 0; j < E; ++j) out[j] += a.start[j];
        }
    }
}

template <typename S, typename D>
void cast_actions(const S* src, D* dst, Py_ssize_t n, const float* low, const float* high, Py_ssize_t per_action) {
    for (Py_ssize_t i = 0; i < n; ++i) {
        S a = src[i];
        if (low != nullptr) {  // np.clip in float32 first (NaN stays NaN), then numpy's cast on assignment
            const float lo = low[i % per_action], hi = high[i % per_action];
            a = a < lo ? lo : (a > hi ? hi : a);
        }
        dst[i] = static_cast<D>(a);
    }
}

// _DirectCalls.send: the group's actions at (slot, t), clipped to the action bounds and cast into the
// array envpool reads, then envpool's `_send`
bool send_group(Group& g, const Acting& a, Py_ssize_t slot, Py_ssize_t t, const Target& to, const float* low,
                const float* high) {
    const Py_ssize_t n = to.N * a.per_action;
    const Py_ssize_t at = (slot * to.T + t) * n;
    void* dst = g.env_actions.buf.buf;
    const char dk = g.env_actions.kind();
    const Py_ssize_t db = g.env_actions.buf.itemsize;
    if (a.int_actions) {
        const int32_t* src = static_cast<const int32_t*>(a.actions) + at;
        if ((dk == 'i' || dk == 'l' || dk == 'q') && db == 4) env_int_actions(src, static_cast<int32_t*>(dst), to.N, a);
        else env_int_actions(src, static_cast<int64_t*>(dst), to.N, a);
    } else {
        const float* src = static_cast<const float*>(a.actions) + at;
        if (dk == 'f') cast_actions(src, static_cast<float*>(dst), n, low, high, a.per_action);
        else cast_actions(src, static_cast<double*>(dst), n, low, high, a.per_action);
    }
    PyObject* r = PyObject_CallOneArg(g.send, g.send_args);
    if (r == nullptr) return false;
    Py_DECREF(r);
    return true;
}

// envpool's `_recv`, recorded into (slot, t); finished games appended at finished_*[*num_finished]
bool collect_group(Group& g, Py_ssize_t slot, Py_ssize_t t, double* finished_scores, int64_t* finished_lengths,
                   Py_ssize_t* num_finished, Py_ssize_t* num_bad) {
    PyObject* out = PyObject_CallNoArgs(g.recv);
    if (out == nullptr) return false;
    PyObject* seq = PySequence_Fast(out, "run_steps: envpool's _recv did not return a sequence");
    Py_DECREF(out);
    if (seq == nullptr) return false;
    const bool atari = g.index[5] >= 0;
    View v[OBS];  // OBS_SRC..GAME_OVER_SRC
    bool ok = true;
    for (int k = OBS_SRC; k < OBS && ok; ++k) {
        if ((k == SCORE_SRC || k == GAME_OVER_SRC) && !atari) continue;
        const Py_ssize_t at = g.index[k];
        if (at < 0 || at >= PySequence_Fast_GET_SIZE(seq)) ok = refuse("an output index is out of range");
        else ok = v[k].get(PySequence_Fast_GET_ITEM(seq, at), false, "record_step", NAMES[k]);
    }
    Source from;
    Py_ssize_t finished = 0, bad = 0;
    ok = ok && check_source(v, atari, g.to, from) &&
         record_into(from, g.to, slot, t, finished_scores + *num_finished, finished_lengths + *num_finished, &finished, &bad);
    Py_DECREF(seq);  // each view holds its own reference to its array until it is released
    *num_finished += finished;
    *num_bad += bad;
    return ok;
}

bool read_group(PyObject* item, const View* slot_views, Group& g) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != G_NUM) return refuse("each group must be a 9-tuple");
    g.send = PyTuple_GET_ITEM(item, G_SEND);
    g.send_args = PyTuple_GET_ITEM(item, G_SEND_ARGS);
    g.recv = PyTuple_GET_ITEM(item, G_RECV);
    if (!PyCallable_Check(g.send) || !PyCallable_Check(g.recv)) return refuse("send and recv must be callable");
    if (!g.env_actions.get(PyTuple_GET_ITEM(item, G_ENV_ACTIONS), true, "run_steps", "env_actions")) return false;
    PyObject* index = PyTuple_GET_ITEM(item, G_INDEX);
    if (!PyTuple_Check(index) || PyTuple_GET_SIZE(index) != 7) return refuse("output_index must be a 7-tuple");
    for (int k = 0; k < 7; ++k) {
        g.index[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(index, k));
        if (g.index[k] == -1 && PyErr_Occurred()) return false;
    }
    if ((g.index[5] < 0) != (g.index[6] < 0)) return refuse("score and game_over indices are both -1 or both set");
    const int slot_arg[] = {OBS, REWARDS, TERMINATED, TRUNCATED, VALID};
    for (int i = 0; i < 5; ++i) {
        if (!g.v[slot_arg[i]].get(slot_views[i].buf.obj, true, "record_step", NAMES[slot_arg[i]])) return false;
    }
    const std::pair<int, int> state[] = {{WAS_RESET, G_WAS_RESET}, {EP_SCORE, G_EP_SCORE}, {EP_LEN, G_EP_LEN}};
    for (auto [arg, item_at] : state) {
        if (!g.v[arg].get(PyTuple_GET_ITEM(item, item_at), true, "record_step", NAMES[arg])) return false;
    }
    if (!check_target(g.v.get(), g.to)) return false;
    PyObject* returns = PyTuple_GET_ITEM(item, G_RETURNS);
    g.scaled = returns != Py_None;
    if (g.scaled) {
        if (!g.returns.get(returns, true, "run_steps", "returns")) return false;
        if (g.returns.kind() != 'd' || g.returns.items() != g.to.N) return refuse("returns must be float64 [N]");
    }
    return true;
}

bool is_int32(const View& v) {
    const char k = v.kind();
    return (k == 'i' || k == 'l' || k == 'q') && v.buf.itemsize == 4;
}

Py_ssize_t list_int(PyObject* list, Py_ssize_t i) { return PyLong_AsSsize_t(PyList_GET_ITEM(list, i)); }

bool set_list_item(PyObject* list, Py_ssize_t i, PyObject* value) {  // steals `value`
    return value != nullptr && PyList_SetItem(list, i, value) == 0;
}

PyObject* py_run_steps(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != L_NUM_ARGS) {
        PyErr_SetString(PyExc_TypeError,
                        "run_steps(groups, slots, slot_list, t_list, sent_list, k, n_steps, plan, params, random, version, "
                        "weights_seq, seen_seq, action_low|None, action_high|None, action_start|None, joint|None, moments|None, "
                        "gamma, clip, eps, finished_scores, finished_lengths)");
        return nullptr;
    }
    PyObject *groups_obj = args[L_GROUPS], *slots_obj = args[L_SLOTS];
    PyObject *slot_list = args[L_SLOT_LIST], *t_list = args[L_T_LIST], *sent_list = args[L_SENT_LIST];
    if (!PyTuple_Check(groups_obj) || PyTuple_GET_SIZE(groups_obj) < 1) return refuse("groups must be a non-empty tuple"), nullptr;
    if (!PyTuple_Check(slots_obj) || PyTuple_GET_SIZE(slots_obj) != S_NUM) return refuse("slots must be a 9-tuple"), nullptr;
    const Py_ssize_t G = PyTuple_GET_SIZE(groups_obj);
    for (PyObject* list : {slot_list, t_list, sent_list}) {
        if (!PyList_Check(list) || PyList_GET_SIZE(list) < G) return refuse("slot_list, t_list and sent_list need an item per group"), nullptr;
    }
    Py_ssize_t k = PyLong_AsSsize_t(args[L_K]);
    const Py_ssize_t n_steps = PyLong_AsSsize_t(args[L_N_STEPS]);
    const int64_t version = PyLong_AsLongLong(args[L_VERSION]);
    const double gamma = PyFloat_AsDouble(args[L_GAMMA]), clip = PyFloat_AsDouble(args[L_CLIP]), eps = PyFloat_AsDouble(args[L_EPS]);
    if (PyErr_Occurred()) return nullptr;
    if (k < 0 || k >= G || n_steps < 0) return refuse("k or n_steps out of range"), nullptr;

    View slot_views[S_NUM];
    for (int i = 0; i < S_NUM; ++i) {
        if (!slot_views[i].get(PyTuple_GET_ITEM(slots_obj, i), true, "run_steps", "a slot array")) return nullptr;
    }
    std::vector<Group> groups(static_cast<size_t>(G));
    for (Py_ssize_t g = 0; g < G; ++g) {
        if (!read_group(PyTuple_GET_ITEM(groups_obj, g), slot_views, groups[g])) return nullptr;
    }
    const Target& shape = groups[0].to;
    const Py_ssize_t S = shape.S, T = shape.T, N = shape.N;
    if (shape.obs_kind != 'f' || shape.obs_item_bytes != 4) return refuse("the slots' obs must be float32"), nullptr;

    Acting a;
    View& act_v = slot_views[S_ACTIONS];
    const char ak = act_v.kind();
    a.int_actions = (ak == 'i' || ak == 'l' || ak == 'q') && act_v.buf.itemsize == 4;
    if (!a.int_actions && !(ak == 'f' && act_v.buf.itemsize == 4)) return refuse("slot actions must be int32 or float32"), nullptr;
    a.per_action = act_v.buf.ndim == 4 ? act_v.dim(3) : 1;
    a.actions = act_v.buf.buf;
    if (act_v.buf.ndim < 3 || act_v.buf.ndim > 4 || act_v.dim(0) != S || act_v.dim(1) != T || act_v.dim(2) != N)
        return refuse("slot actions must be [slots, T, N] or [slots, T, N, K or A]"), nullptr;
    for (int i : {S_LOG_PROBS, S_VALUES, S_VERSION}) {
        if (slot_views[i].items() != S * T * N) return refuse("log_probs, values and policy_version must be [slots, T, N]"), nullptr;
    }
    const char vk = slot_views[S_VERSION].kind();
    if (slot_views[S_LOG_PROBS].kind() != 'f' || slot_views[S_VALUES].kind() != 'f' ||
        !((vk == 'l' || vk == 'q') && slot_views[S_VERSION].buf.itemsize == 8))
        return refuse("log_probs and values must be float32, policy_version int64"), nullptr;
    View start_v, joint_v;
    a.per_env_action = a.per_action;
    if (args[L_JOINT] != Py_None) {
        if (!a.int_actions || a.per_action != 1 || !joint_v.get(args[L_JOINT], false, "run_steps", "joint"))
            return PyErr_Occurred() ? nullptr : (refuse("joint is for one categorical's [slots, T, N] int32 actions"), nullptr);
        if (!is_int32(joint_v) || joint_v.items() < 2) return refuse("joint must be int32 [E], E >= 2"), nullptr;
        a.joint = static_cast<const int32_t*>(joint_v.buf.buf);
        a.per_env_action = joint_v.items();
        for (Py_ssize_t j = 0; j < a.per_env_action; ++j) {
            if (a.joint[j] < 1) return refuse("joint's options must be positive"), nullptr;
        }
    }
    if (args[L_ACTION_START] != Py_None) {
        if (!a.int_actions || !start_v.get(args[L_ACTION_START], false, "run_steps", "action_start"))
            return PyErr_Occurred() ? nullptr : (refuse("action_start is for int32 actions"), nullptr);
        if (!is_int32(start_v) || start_v.items() != a.per_env_action)
            return refuse("action_start must be int32, one per choice the env takes"), nullptr;
        a.start = static_cast<const int32_t*>(start_v.buf.buf);
    }
    for (Group& g : groups) {
        if (g.to.S != S || g.to.T != T || g.to.N != N) return refuse("every group writes the same slots"), nullptr;
        if (g.env_actions.items() != N * a.per_env_action) return refuse("env_actions must hold N actions"), nullptr;
        const char dk = g.env_actions.kind();
        const bool int_ok = (dk == 'i' || dk == 'l' || dk == 'q') && (g.env_actions.buf.itemsize == 4 || g.env_actions.buf.itemsize == 8);
        const bool float_ok = (dk == 'f' && g.env_actions.buf.itemsize == 4) || (dk == 'd' && g.env_actions.buf.itemsize == 8);
        if (a.int_actions ? !int_ok : !float_ok) return refuse("env_actions' dtype does not take the slots' actions"), nullptr;
    }

    View random, low_v, high_v, moments_v, fs_v, fl_v, seq_v;
    const int64_t seen_seq = PyLong_AsLongLong(args[L_SEEN_SEQ]);
    if (seen_seq == -1 && PyErr_Occurred()) return nullptr;
    if (!seq_v.get(args[L_WEIGHTS_SEQ], false, "run_steps", "weights_seq")) return nullptr;
    const char sk = seq_v.kind();
    if (!((sk == 'l' || sk == 'q') && seq_v.buf.itemsize == 8) || seq_v.items() < 1)
        return refuse("weights_seq must be int64, its first item the published sequence number"), nullptr;
    // written by the learner in another process: read it afresh before every step
    const int64_t* published_seq = static_cast<const int64_t*>(seq_v.buf.buf);
    if (!random.get(args[L_RANDOM], false, "run_steps", "random")) return nullptr;
    if (random.kind() != 'f' || random.items() != n_steps * N * a.per_action)
        return refuse("random must be float32, n_steps * N * (1, K or A) numbers"), nullptr;
    const float *low = nullptr, *high = nullptr;
    if (args[L_ACTION_LOW] != Py_None) {
        if (a.int_actions || !low_v.get(args[L_ACTION_LOW], false, "run_steps", "action_low") ||
            !high_v.get(args[L_ACTION_HIGH], false, "run_steps", "action_high"))
            return PyErr_Occurred() ? nullptr : (refuse("action bounds are for float actions"), nullptr);
        if (low_v.kind() != 'f' || high_v.kind() != 'f' || low_v.items() != a.per_action || high_v.items() != a.per_action)
            return refuse("action_low and action_high must be float32 [A]"), nullptr;
        low = static_cast<const float*>(low_v.buf.buf);
        high = static_cast<const float*>(high_v.buf.buf);
    }
    double* moments = nullptr;
    if (args[L_MOMENTS] != Py_None) {
        if (!moments_v.get(args[L_MOMENTS], true, "run_steps", "moments")) return nullptr;
        if (moments_v.kind() != 'd' || moments_v.items() != 3) return refuse("moments must be float64 (count, mean, var)"), nullptr;
        moments = static_cast<double*>(moments_v.buf.buf);
    }
    for (Group& g : groups) {
        if (g.scaled != (moments != nullptr)) return refuse("returns and moments are both given or both None"), nullptr;
    }
    if (!fs_v.get(args[L_FINISHED_SCORES], true, "run_steps", "finished_scores") ||
        !fl_v.get(args[L_FINISHED_LENGTHS], true, "run_steps", "finished_lengths"))
        return nullptr;
    if (fs_v.kind() != 'd' || !check_int(fl_v, 8, FINISHED_LENGTHS) || fs_v.items() < n_steps * N || fl_v.items() < n_steps * N)
        return refuse("finished_scores (float64) and finished_lengths (int64) must hold n_steps * N"), nullptr;

    // the weights cannot change during the call (it ends at a new version): the network is read once
    const std::unique_ptr<void, void (*)(void*)> net(acting->bind(args[L_PLAN], args[L_PARAMS]), acting->release);
    if (!net) return nullptr;
    const float* obs = reinterpret_cast<const float*>(shape.obs);
    const float* random_at = static_cast<const float*>(random.buf.buf);
    const Py_ssize_t per_step = N * a.per_action;
    const Py_ssize_t D = shape.obs_row_items;
    double* finished_scores = static_cast<double*>(fs_v.buf.buf);
    int64_t* finished_lengths = static_cast<int64_t*>(fl_v.buf.buf);
    Py_ssize_t num_finished = 0, num_bad = 0, steps = 0;
    for (; steps < n_steps; ++steps) {
        if (__atomic_load_n(published_seq, __ATOMIC_ACQUIRE) != seen_seq) break;  // newer weights: Python's turn
        const Py_ssize_t next = (k + 1) % G;
        const Py_ssize_t slot = list_int(slot_list, k), t = list_int(t_list, k);
        if (PyErr_Occurred()) return nullptr;
        // t = T - 1 is the step that takes the next slot, and t + 1 = T the one that hands the slot over: Python's
        if (slot < 0 || slot >= S || t < 0 || t >= T - 1) return refuse("a step reaches a slot boundary (Python's)"), nullptr;
        for (Py_ssize_t g : {k, next}) {
            if (PyList_GET_ITEM(sent_list, g) == Py_True) continue;
            const Py_ssize_t slot_g = list_int(slot_list, g), t_g = list_int(t_list, g);
            if (PyErr_Occurred()) return nullptr;
            if (slot_g < 0 || slot_g >= S || t_g < 0 || t_g >= T) return refuse("a group's slot or t is out of range"), nullptr;
            if (!send_group(groups[g], a, slot_g, t_g, shape, low, high)) return nullptr;
            if (!set_list_item(sent_list, g, Py_NewRef(Py_True))) return nullptr;
        }
        if (!set_list_item(sent_list, k, Py_NewRef(Py_False))) return nullptr;
        Group& g = groups[k];
        if (!collect_group(g, slot, t, finished_scores, finished_lengths, &num_finished, &num_bad)) return nullptr;
        const Py_ssize_t cell = (slot * T + t) * N;
        if (g.scaled) {
            scale_into(static_cast<double*>(g.returns.buf.buf), moments, shape.rewards + cell, shape.valid + cell,
                       g.to.was_reset, N, gamma, clip, eps);
        }
        const Py_ssize_t t1 = t + 1, acted = (slot * T + t1) * N;
        if (!set_list_item(t_list, k, PyLong_FromSsize_t(t1))) return nullptr;
        void* actions = static_cast<char*>(slot_views[S_ACTIONS].buf.buf) + acted * a.per_action * slot_views[S_ACTIONS].buf.itemsize;
        if (acting->act(net.get(), obs + (slot * (T + 1) + t1) * N * D, N * D, random_at, per_step, N,
                        actions, a.int_actions ? 4 : 0, per_step, static_cast<float*>(slot_views[S_LOG_PROBS].buf.buf) + acted,
                        static_cast<float*>(slot_views[S_VALUES].buf.buf) + acted) != 0)
            return nullptr;
        int64_t* pv = static_cast<int64_t*>(slot_views[S_VERSION].buf.buf) + acted;
        for (Py_ssize_t i = 0; i < N; ++i) pv[i] = version;
        random_at += per_step;
        k = next;
    }
    return Py_BuildValue("(nnnn)", k, steps, num_finished, num_bad);
}

PyMethodDef methods[] = {
    {"run_steps", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_run_steps)), METH_FASTCALL,
     "run_steps(groups, slots, slot_list, t_list, sent_list, k, n_steps, plan, params, random, version, weights_seq, "
     "seen_seq, action_low|None, action_high|None, action_start|None, joint|None, moments|None, gamma, clip, eps, "
     "finished_scores, finished_lengths) "
     "-> (k, steps, finished, nonfinite): up to n_steps of RolloutWorker.pump for workers that act with the native "
     "kernel, none at a slot boundary, stopping early once weights_seq[0] != seen_seq; t_list and sent_list are "
     "updated in place, finished games' scores and lengths written first in finished_*."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rollout",
                      "A rollout worker's env steps between slot boundaries in one call (see fastrl.workers.native_steps).",
                      -1, methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__rollout(void) {
    acting = static_cast<const fastrl_ext::ActingApi*>(PyCapsule_Import(FASTRL_ACTING_CAPSULE, 0));
    if (acting == nullptr) return nullptr;
    return PyModule_Create(&module);
}
