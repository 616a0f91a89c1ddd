// fastrl_ext: a C-contiguous buffer (a numpy view of a CPU tensor) held for the duration of one call.
// Shared by the learner's native pieces (vtrace.cpp, appo_loss.cpp), which take their arrays through
// the buffer protocol without copies, with the dtype checks both make before dispatching on float/double.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstring>
#include <initializer_list>

namespace fastrl_ext {

struct BufferView {
    Py_buffer buf{};
    bool held = false;
    BufferView() = default;
    BufferView(const BufferView&) = delete;
    BufferView& operator=(const BufferView&) = delete;
    ~BufferView() {
        if (held) PyBuffer_Release(&buf);
    }
    // `caller` and `name` go into the TypeError, e.g. "vtrace: rewards must be a C-contiguous buffer"
    bool get(PyObject* obj, bool writable, const char* caller, const char* name) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj, &buf, flags) != 0) {
            PyErr_Format(PyExc_TypeError, "%s: %s must be a C-contiguous%s buffer", caller, name,
                         writable ? " writable" : "");
            return false;
        }
        held = true;
        return true;
    }
    // the struct-module type code: 'f' float32, 'd' float64, '?' bool
    char kind() const { return buf.format ? buf.format[std::strlen(buf.format) - 1] : 'B'; }
    Py_ssize_t dim(int i) const { return buf.ndim > i ? buf.shape[i] : -1; }
    Py_ssize_t items() const { return buf.itemsize > 0 ? buf.len / buf.itemsize : 0; }
};

// Holds `obj` as a float32 buffer in `v`; false with a TypeError set when it is not one (the MLP and
// policy-head kernels take float32 only).
inline bool float32_view(BufferView& v, PyObject* obj, bool writable, const char* caller, const char* name) {
    if (!v.get(obj, writable, caller, name)) return false;
    if (v.kind() != 'f') {
        PyErr_Format(PyExc_TypeError, "%s: %s must be float32", caller, name);
        return false;
    }
    return true;
}

// The float dtype the views at `floats` share, 'f' (float32) or 'd' (float64); 0 with a TypeError set
// when they differ or are neither.
inline char shared_float_kind(const BufferView* views, std::initializer_list<int> floats, const char* caller) {
    const char kind = views[*floats.begin()].kind();
    for (int k : floats) {
        if (views[k].kind() != kind) {
            PyErr_Format(PyExc_TypeError, "%s: the float arrays must share one dtype", caller);
            return 0;
        }
    }
    if (kind != 'f' && kind != 'd') {
        PyErr_Format(PyExc_TypeError, "%s: float32 or float64 arrays only", caller);
        return 0;
    }
    return kind;
}

// Whether the views at `flags` are bool arrays; a TypeError naming the first that is not, otherwise.
inline bool all_bool(const BufferView* views, std::initializer_list<int> flags, const char* caller,
                     const char* const* names) {
    for (int k : flags) {
        if (views[k].kind() != '?') {
            PyErr_Format(PyExc_TypeError, "%s: %s must be bool", caller, names[k]);
            return false;
        }
    }
    return true;
}

}  // namespace fastrl_ext
