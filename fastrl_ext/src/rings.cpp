// fastrl_ext._rings: the per-step operations of fastrl's shared-memory rings and doorbells.
//
// The memory layout is fastrl.ipc.rings' (pure Python, the reference implementation):
//   ring counters: int64 [head, tail]; ring data: int64 [capacity, width];
//   doorbell: int32 [seq, waiters] -- seq is the futex word, waiters is 1 while its one
//   consumer is inside FUTEX_WAIT.
// Every function takes raw addresses (Python ints) of those shared arrays, so one call does the
// whole push / pop / wait with no numpy indexing and no temporary arrays.
//
// Why native: the Python version must issue the FUTEX_WAKE syscall on every push, because
// without a full fence between publishing seq and reading `waiters` it cannot know whether the
// consumer is asleep (x86 may reorder a store before a later load). Here seq is bumped with a
// locked (sequentially consistent) add, so reading waiters afterwards is safe, and the wake-up
// syscall is skipped whenever the consumer is busy -- the common case under load.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <ctime>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace {

struct Bell {
    uint32_t seq;
    uint32_t waiters;
};

inline int64_t load_acquire(const int64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void store_release(int64_t* p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

template <typename T>
T* as_ptr(PyObject* obj) {
    return reinterpret_cast<T*>(PyLong_AsVoidPtr(obj));
}

// The (counters, data, capacity, width) arguments that name one ring, as push_many and pop_all take them.
struct Ring {
    int64_t* counters;
    int64_t* data;
    int64_t capacity;
    int64_t width;
};

bool parse_ring(PyObject* const* args, Ring* ring) {
    ring->counters = as_ptr<int64_t>(args[0]);
    ring->data = as_ptr<int64_t>(args[1]);
    ring->capacity = PyLong_AsLongLong(args[2]);
    ring->width = PyLong_AsLongLong(args[3]);
    return !PyErr_Occurred();
}

// FASTCALL functions take a fixed number of arguments; `usage` is the error text otherwise.
bool expect_args(Py_ssize_t nargs, Py_ssize_t wanted, const char* usage) {
    if (nargs == wanted) return true;
    PyErr_SetString(PyExc_TypeError, usage);
    return false;
}

void bell_ring(Bell* bell) {
    __atomic_fetch_add(&bell->seq, 1u, __ATOMIC_SEQ_CST);  // a full fence on x86: orders the load below
    if (__atomic_load_n(&bell->waiters, __ATOMIC_SEQ_CST) != 0) {
        syscall(SYS_futex, &bell->seq, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
    }
}

// Sleep on `bell` unless it moved past `seen`; the GIL is released while asleep.
void bell_wait(Bell* bell, uint32_t seen, double timeout_s) {
    if (timeout_s <= 0) return;
    timespec ts;
    ts.tv_sec = static_cast<time_t>(timeout_s);
    ts.tv_nsec = static_cast<long>((timeout_s - static_cast<double>(ts.tv_sec)) * 1e9);
    __atomic_store_n(&bell->waiters, 1u, __ATOMIC_SEQ_CST);
    Py_BEGIN_ALLOW_THREADS
    syscall(SYS_futex, &bell->seq, FUTEX_WAIT, seen, &ts, nullptr, 0);
    Py_END_ALLOW_THREADS
    __atomic_store_n(&bell->waiters, 0u, __ATOMIC_RELAXED);
}

// push_many(counters, data, capacity, width, bell, records) -> None
PyObject* py_push_many(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (!expect_args(nargs, 6, "push_many(counters, data, capacity, width, bell, records)")) return nullptr;
    Ring ring;
    if (!parse_ring(args, &ring)) return nullptr;
    auto [counters, data, capacity, width] = ring;
    auto* bell = as_ptr<Bell>(args[4]);
    if (PyErr_Occurred()) return nullptr;
    PyObject* seq = PySequence_Fast(args[5], "records must be a sequence of tuples");
    if (!seq) return nullptr;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const int64_t head = counters[0];  // only this producer writes head
    const int64_t tail = load_acquire(&counters[1]);
    if (head - tail + n > capacity) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_OverflowError, "ring full: more records in flight than it was sized for");
        return nullptr;
    }
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; ++k) {
        int64_t* row = data + ((head + k) % capacity) * width;
        if (width == 1 && !PyTuple_Check(items[k]) && !PyList_Check(items[k])) {  // a bare slot index
            row[0] = PyLong_AsLongLong(items[k]);
            if (PyErr_Occurred()) { Py_DECREF(seq); return nullptr; }
            continue;
        }
        PyObject* rec = PySequence_Fast(items[k], "each record must be a sequence of ints");
        if (!rec) { Py_DECREF(seq); return nullptr; }
        if (PySequence_Fast_GET_SIZE(rec) != width) {
            Py_DECREF(rec); Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "record of %zd fields for a ring of width %lld",
                         PySequence_Fast_GET_SIZE(rec), static_cast<long long>(width));
            return nullptr;
        }
        PyObject** fields = PySequence_Fast_ITEMS(rec);
        for (int64_t j = 0; j < width; ++j) row[j] = PyLong_AsLongLong(fields[j]);
        Py_DECREF(rec);
        if (PyErr_Occurred()) { Py_DECREF(seq); return nullptr; }  // nothing published yet
    }
    Py_DECREF(seq);
    store_release(&counters[0], head + n);  // publish after the records are written
    bell_ring(bell);
    Py_RETURN_NONE;
}

// pop_all(counters, data, capacity, width, max_records) -> list of tuples, oldest first
PyObject* py_pop_all(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (!expect_args(nargs, 5, "pop_all(counters, data, capacity, width, max_records)")) return nullptr;
    Ring ring;
    if (!parse_ring(args, &ring)) return nullptr;
    auto [counters, data, capacity, width] = ring;
    const int64_t max_records = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return nullptr;
    const int64_t head = load_acquire(&counters[0]);
    const int64_t tail = counters[1];  // only this consumer writes tail
    int64_t n = head - tail;
    if (n > max_records) n = max_records;
    if (n < 0) n = 0;
    PyObject* out = PyList_New(n);
    if (!out) return nullptr;
    for (int64_t k = 0; k < n; ++k) {
        const int64_t* row = data + ((tail + k) % capacity) * width;
        PyObject* rec = PyTuple_New(width);
        if (!rec) { Py_DECREF(out); return nullptr; }
        for (int64_t j = 0; j < width; ++j) {
            PyObject* v = PyLong_FromLongLong(row[j]);
            if (!v) { Py_DECREF(rec); Py_DECREF(out); return nullptr; }
            PyTuple_SET_ITEM(rec, j, v);
        }
        PyList_SET_ITEM(out, k, rec);
    }
    if (n > 0) store_release(&counters[1], tail + n);  // the records are copied out: free their cells
    return out;
}

// ring(bell) -> None
PyObject* py_ring(PyObject*, PyObject* arg) {
    auto* bell = as_ptr<Bell>(arg);
    if (PyErr_Occurred()) return nullptr;
    bell_ring(bell);
    Py_RETURN_NONE;
}

// wait(bell, seen, timeout_s) -> None
PyObject* py_wait(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (!expect_args(nargs, 3, "wait(bell, seen, timeout_s)")) return nullptr;
    auto* bell = as_ptr<Bell>(args[0]);
    const unsigned long seen = PyLong_AsUnsignedLongMask(args[1]);
    const double timeout_s = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) return nullptr;
    bell_wait(bell, static_cast<uint32_t>(seen), timeout_s);
    Py_RETURN_NONE;
}

// wait_any(bell, counters_addresses, timeout_s) -> bool: True if a ring had records on entry
PyObject* py_wait_any(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (!expect_args(nargs, 3, "wait_any(bell, counters_addresses, timeout_s)")) return nullptr;
    auto* bell = as_ptr<Bell>(args[0]);
    const double timeout_s = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) return nullptr;
    PyObject* seq = PySequence_Fast(args[1], "counters_addresses must be a sequence");
    if (!seq) return nullptr;
    // seq is read before the rings: a push landing after the check moves it, so the wait returns
    const uint32_t seen = __atomic_load_n(&bell->seq, __ATOMIC_SEQ_CST);
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t k = 0; k < n; ++k) {
        auto* counters = as_ptr<int64_t>(items[k]);
        if (!counters) { Py_DECREF(seq); return nullptr; }
        if (load_acquire(&counters[0]) != counters[1]) {
            Py_DECREF(seq);
            Py_RETURN_TRUE;
        }
    }
    Py_DECREF(seq);
    bell_wait(bell, seen, timeout_s);
    Py_RETURN_FALSE;
}

PyMethodDef methods[] = {
    {"push_many", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_push_many)), METH_FASTCALL,
     "push_many(counters, data, capacity, width, bell, records): publish records with one head update and "
     "at most one wake-up."},
    {"pop_all", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_pop_all)), METH_FASTCALL,
     "pop_all(counters, data, capacity, width, max_records) -> list of tuples."},
    {"ring", py_ring, METH_O, "ring(bell): bump the doorbell; FUTEX_WAKE only if its consumer sleeps."},
    {"wait", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_wait)), METH_FASTCALL,
     "wait(bell, seen, timeout_s): sleep until rung unless it moved past seen."},
    {"wait_any", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_wait_any)), METH_FASTCALL,
     "wait_any(bell, counters_addresses, timeout_s) -> bool: return at once if a ring has records, "
     "else sleep until the bell rings or the timeout."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rings",
                      "fastrl's shared-memory ring and doorbell operations (see fastrl.ipc.rings).", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__rings(void) { return PyModule_Create(&module); }
