/* Operator nesting in one pass per thread: each operator's depth and parent, and each call's
   innermost enclosing operator, exactly as diagnostics.facts.linking computes them with its
   sweep and as-of joins (the reference, kept for where this module is not built or declines).

   Per thread, operators in start order (longest first at equal starts, then file order):
   a min-heap holds the ends of the operators open so far; ends at or before a start are
   dropped first (at equal times ends come first), and an operator's depth is the heap's size
   once its own end is in. That is the sweep's running count, malformed nesting included. The
   latest-starting operator at each depth is kept (the as-of join's match: operators that
   start together open one deeper each, so no two of them share a depth); an operator's
   parent is the one at its depth - 1, a call's operator the one at the count of operators
   open at its start, each kept only if it really contains the child or call. O(n log depth), where the sweep sorts and joins 1.5 M rows in 0.7 s.

   Declined (nest() returns None; the Python path then runs): a column of another type, in
   several chunks or with nulls, a NaN, operators or calls not in start order, over 2^32 rows.
   Columns come in through the Arrow C stream interface and go out through the Arrow C data
   interface (https://arrow.apache.org/docs/format/CDataInterface.html), without a copy. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../arrow_c_data.h"

#define NONE UINT32_MAX

enum { TAKEN = 1, DECLINED = 0, FAILED = -1 };

/* ---- in: one column of a stream ------------------------------------------------------- */

typedef struct {
    struct ArrowArray array; /* released by release_column */
    const void *values;
    int64_t length;
} Column;

static void release_column(Column *c) {
    if (c->array.release != NULL) c->array.release(&c->array);
}

/* The stream's one chunk, of ``format`` ("l": int64, "g": float64) and no nulls. */
static int read_column(PyObject *capsule, const char *format, size_t width, Column *c) {
    struct ArrowArrayStream *stream = PyCapsule_GetPointer(capsule, "arrow_array_stream");
    if (stream == NULL) return FAILED;
    struct ArrowSchema schema;
    memset(&schema, 0, sizeof(schema));
    if (stream->get_schema(stream, &schema) != 0) return DECLINED;
    int same = schema.format != NULL && strcmp(schema.format, format) == 0;
    if (schema.release != NULL) schema.release(&schema);
    if (!same || stream->get_next(stream, &c->array) != 0) return DECLINED;
    if (c->array.release == NULL) return TAKEN; /* no chunk: an empty column */
    struct ArrowArray more;
    memset(&more, 0, sizeof(more));
    if (stream->get_next(stream, &more) != 0) return DECLINED;
    if (more.release != NULL) {
        more.release(&more);
        return DECLINED; /* several chunks */
    }
    struct ArrowArray *a = &c->array;
    if (a->null_count != 0 || a->n_buffers != 2 || (a->length > 0 && a->buffers[1] == NULL))
        return DECLINED;
    c->length = a->length;
    c->values = (const char *)a->buffers[1] + (size_t)a->offset * width;
    return TAKEN;
}

/* ---- out: one column, its buffers owned by the array ----------------------------------- */

typedef struct {
    const void *buffers[2];
} Owned;

static void array_release(struct ArrowArray *array) {
    Owned *owned = array->private_data;
    if (owned != NULL) {
        free((void *)owned->buffers[0]);
        free((void *)owned->buffers[1]);
        free(owned);
    }
    array->private_data = NULL;
    array->release = NULL;
}

/* (schema capsule, array capsule) owning ``values`` and ``valid`` (a bitmap, or NULL for
   none), which it frees: also on failure. */
static PyObject *exported(const char *name, const char *format, void *values,
                          unsigned char *valid, int64_t n, int64_t nulls) {
    struct ArrowSchema *schema = calloc(1, sizeof(*schema));
    struct ArrowArray *array = calloc(1, sizeof(*array));
    Owned *owned = calloc(1, sizeof(*owned));
    if (schema == NULL || array == NULL || owned == NULL) {
        free(schema);
        free(array);
        free(owned);
        free(values);
        free(valid);
        return PyErr_NoMemory();
    }
    schema->format = format;
    schema->name = name;
    schema->flags = ARROW_FLAG_NULLABLE;
    schema->release = schema_release;
    owned->buffers[0] = valid;
    owned->buffers[1] = values;
    array->length = n;
    array->null_count = nulls;
    array->n_buffers = 2;
    array->buffers = owned->buffers;
    array->release = array_release;
    array->private_data = owned;
    PyObject *schema_capsule = PyCapsule_New(schema, "arrow_schema", schema_capsule_free);
    if (schema_capsule == NULL) {
        free(schema);
        array_release(array);
        free(array);
        return NULL;
    }
    PyObject *array_capsule = PyCapsule_New(array, "arrow_array", array_capsule_free);
    if (array_capsule == NULL) {
        Py_DECREF(schema_capsule);
        array_release(array);
        free(array);
        return NULL;
    }
    return Py_BuildValue("(NN)", schema_capsule, array_capsule);
}

/* row numbers (NONE: null) as a nullable UInt32 column; frees ``rows`` */
static PyObject *row_column(const char *name, uint32_t *rows, int64_t n) {
    int64_t nulls = 0;
    for (int64_t i = 0; i < n; i++) nulls += rows[i] == NONE;
    unsigned char *valid = NULL;
    if (nulls > 0) {
        valid = calloc((size_t)(n + 7) / 8 + 1, 1);
        if (valid == NULL) {
            free(rows);
            return PyErr_NoMemory();
        }
        for (int64_t i = 0; i < n; i++) {
            if (rows[i] != NONE) valid[i >> 3] |= (unsigned char)(1u << (i & 7));
            else rows[i] = 0;
        }
    }
    return exported(name, "I", rows, valid, n, nulls);
}

/* ---- threads: each (pid, tid) its own state ------------------------------------------ */

/* A thread's operators open so far: a min-heap of their ends, and by depth the
   latest-starting operator (NONE: none yet); ``latest`` has cap + 1 entries. */
typedef struct {
    double *ends;
    uint32_t *latest;
    int64_t size, cap;
} Thread;

typedef struct {
    int64_t pid, tid;
    uint32_t index; /* NONE: empty slot */
} Slot;

typedef struct {
    Slot *slots;
    size_t cap; /* a power of two */
    Thread *threads;
    uint32_t count, room;
} Threads;

static size_t slot_of(const Threads *t, int64_t pid, int64_t tid) {
    uint64_t h = (uint64_t)pid * 0x9E3779B97F4A7C15ull ^ (uint64_t)tid * 0xC2B2AE3D27D4EB4Full;
    h ^= h >> 29;
    size_t at = (size_t)h & (t->cap - 1);
    while (t->slots[at].index != NONE && (t->slots[at].pid != pid || t->slots[at].tid != tid))
        at = (at + 1) & (t->cap - 1);
    return at;
}

static int slots_grow(Threads *t) {
    size_t cap = t->cap * 2;
    Slot *slots = malloc(cap * sizeof(Slot));
    if (slots == NULL) return -1;
    for (size_t k = 0; k < cap; k++) slots[k].index = NONE;
    Slot *old = t->slots;
    size_t old_cap = t->cap;
    t->slots = slots;
    t->cap = cap;
    for (size_t k = 0; k < old_cap; k++)
        if (old[k].index != NONE) t->slots[slot_of(t, old[k].pid, old[k].tid)] = old[k];
    free(old);
    return 0;
}

/* The thread's state; NULL when it has none and ``add`` is 0, or out of memory (``*failed``). */
static Thread *thread_of(Threads *t, int64_t pid, int64_t tid, int add, int *failed) {
    size_t at = slot_of(t, pid, tid);
    if (t->slots[at].index != NONE) return &t->threads[t->slots[at].index];
    if (!add) return NULL;
    if ((size_t)(t->count + 1) * 2 > t->cap) {
        if (slots_grow(t) != 0) goto failed;
        at = slot_of(t, pid, tid);
    }
    if (t->count == t->room) {
        uint32_t room = t->room ? t->room * 2 : 16;
        Thread *threads = realloc(t->threads, room * sizeof(Thread));
        if (threads == NULL) goto failed;
        t->threads = threads;
        t->room = room;
    }
    t->slots[at] = (Slot){pid, tid, t->count};
    t->threads[t->count] = (Thread){NULL, NULL, 0, 0};
    return &t->threads[t->count++];
failed:
    *failed = 1;
    return NULL;
}

static void threads_free(Threads *t) {
    for (uint32_t k = 0; k < t->count; k++) {
        free(t->threads[k].ends);
        free(t->threads[k].latest);
    }
    free(t->threads);
    free(t->slots);
}

/* ---- a thread's heap of open operators' ends ------------------------------------------ */

static int heap_push(Thread *h, double end) {
    if (h->size == h->cap) {
        int64_t cap = h->cap ? h->cap * 2 : 16;
        double *ends = realloc(h->ends, (size_t)cap * sizeof(double));
        if (ends == NULL) return -1;
        h->ends = ends;
        uint32_t *latest = realloc(h->latest, (size_t)(cap + 1) * sizeof(uint32_t));
        if (latest == NULL) return -1;
        for (int64_t d = h->cap ? h->cap + 1 : 0; d <= cap; d++) latest[d] = NONE;
        h->latest = latest;
        h->cap = cap;
    }
    int64_t at = h->size++;
    while (at > 0) {
        int64_t up = (at - 1) / 2;
        if (h->ends[up] <= end) break;
        h->ends[at] = h->ends[up];
        at = up;
    }
    h->ends[at] = end;
    return 0;
}

/* drops every end at or before ``t`` */
static void heap_close(Thread *h, double t) {
    while (h->size > 0 && h->ends[0] <= t) {
        double last = h->ends[--h->size];
        int64_t at = 0;
        for (;;) {
            int64_t child = 2 * at + 1;
            if (child >= h->size) break;
            if (child + 1 < h->size && h->ends[child + 1] < h->ends[child]) child++;
            if (h->ends[child] >= last) break;
            h->ends[at] = h->ends[child];
            at = child;
        }
        if (h->size > 0) h->ends[at] = last;
    }
}

/* ---- the pass ------------------------------------------------------------------------ */

typedef struct {
    Thread *thread;
    double end;
    uint32_t row;
} Opening;

/* by thread, then longest first, then file order: how the sweep opens operators that start
   together on one thread */
static int opening_order(const void *a, const void *b) {
    const Opening *x = a, *y = b;
    if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
    if (x->end != y->end) return x->end > y->end ? -1 : 1;
    return (x->row > y->row) - (x->row < y->row);
}

typedef struct {
    const double *end;
    int64_t *depth;
    uint32_t *parent;
} Pass;

/* One thread's operators ``run[0..k)``, which start together at ``at``, in opening order:
   depths, then parents; 0, or -1 when out of memory. */
static int open_run(Pass *p, Thread *h, const Opening *run, int64_t k, double at) {
    heap_close(h, at);
    for (int64_t j = 0; j < k; j++) {
        uint32_t row = run[j].row;
        if (p->end[row] > at) { /* zero-length operators are outside the sweep: depth 0 */
            if (heap_push(h, p->end[row]) != 0) return -1;
            p->depth[row] = h->size;
        }
    }
    /* operators starting together each open one deeper: one per depth */
    for (int64_t j = 0; j < k; j++)
        if (p->depth[run[j].row] > 0) h->latest[p->depth[run[j].row]] = run[j].row;
    for (int64_t j = 0; j < k; j++) {
        uint32_t row = run[j].row;
        if (p->depth[row] < 2) continue;
        uint32_t up = h->latest[p->depth[row] - 1];
        if (up != NONE && p->end[up] >= p->end[row]) p->parent[row] = up;
    }
    return 0;
}

static int sorted_finite(const double *start, const double *end, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (isnan(start[i]) || isnan(end[i])) return 0;
        if (i > 0 && start[i] < start[i - 1]) return 0;
    }
    return 1;
}

typedef struct {
    Column pid, tid, start, end;
} Rows;

static int read_rows(PyObject *const *capsules, Rows *r) {
    int got;
    if ((got = read_column(capsules[0], "l", 8, &r->pid)) != TAKEN) return got;
    if ((got = read_column(capsules[1], "l", 8, &r->tid)) != TAKEN) return got;
    if ((got = read_column(capsules[2], "g", 8, &r->start)) != TAKEN) return got;
    if ((got = read_column(capsules[3], "g", 8, &r->end)) != TAKEN) return got;
    int64_t n = r->pid.length;
    if (r->tid.length != n || r->start.length != n || r->end.length != n) return DECLINED;
    if (n >= (int64_t)NONE) return DECLINED;
    if (!sorted_finite(r->start.values, r->end.values, n)) return DECLINED;
    return TAKEN;
}

static void release_rows(Rows *r) {
    release_column(&r->pid);
    release_column(&r->tid);
    release_column(&r->start);
    release_column(&r->end);
}

/* The pass over rows read, in time order: operators that start together (on any thread)
   open before a call at that time; 0, or -1 when out of memory. */
static int nest_rows(const Rows *ops, const Rows *calls, int64_t *depth, uint32_t *parent,
                     uint32_t *call_op) {
    int64_t n = ops->pid.length, m = calls != NULL ? calls->pid.length : 0;
    const int64_t *pid = ops->pid.values, *tid = ops->tid.values;
    const double *start = ops->start.values;
    const int64_t *call_pid = m ? calls->pid.values : NULL, *call_tid = m ? calls->tid.values : NULL;
    const double *call_start = m ? calls->start.values : NULL;
    const double *call_end = m ? calls->end.values : NULL;
    Pass p = {ops->end.values, depth, parent};
    Threads threads = {malloc(64 * sizeof(Slot)), 64, NULL, 0, 0};
    Opening *run = NULL;
    int64_t run_room = 0;
    int failed = threads.slots == NULL;
    if (!failed)
        for (size_t k = 0; k < threads.cap; k++) threads.slots[k].index = NONE;
    for (int64_t i = 0; i < n; i++) depth[i] = 0, parent[i] = NONE;
    int64_t i = 0, c = 0;
    while (!failed && (i < n || c < m)) {
        if (i < n && (c == m || start[i] <= call_start[c])) {
            int64_t k = 1;
            while (i + k < n && start[i + k] == start[i]) k++;
            if (k > run_room) {
                Opening *bigger = realloc(run, (size_t)k * sizeof(Opening));
                if (bigger == NULL) break;
                run = bigger;
                run_room = k;
            }
            for (int64_t j = 0; j < k; j++) {
                Thread *h = thread_of(&threads, pid[i + j], tid[i + j], 1, &failed);
                run[j] = (Opening){h, p.end[i + j], (uint32_t)(i + j)};
            }
            if (failed) break;
            if (k > 1) qsort(run, (size_t)k, sizeof(Opening), opening_order);
            for (int64_t j = 0, next; j < k && !failed; j = next) {
                for (next = j + 1; next < k && run[next].thread == run[j].thread; next++) {
                }
                failed = open_run(&p, run[j].thread, run + j, next - j, start[i]) != 0;
            }
            i += k;
            continue;
        }
        /* a call: the operators open on its thread at its start (all that started by then) */
        call_op[c] = NONE;
        Thread *h = thread_of(&threads, call_pid[c], call_tid[c], 0, &failed);
        if (h != NULL) {
            heap_close(h, call_start[c]);
            if (h->size > 0) {
                uint32_t op = h->latest[h->size];
                if (op != NONE && p.end[op] >= call_end[c]) call_op[c] = op;
            }
        }
        c++;
    }
    int status = failed || i < n || c < m ? -1 : 0;
    threads_free(&threads);
    free(run);
    return status;
}

/* nest(op_pid, op_tid, op_start, op_end[, call_pid, call_tid, call_start, call_end]) */
static PyObject *nest(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "nest() takes 4 or 8 Arrow stream capsules");
        return NULL;
    }
    Rows ops, calls;
    memset(&ops, 0, sizeof(ops));
    memset(&calls, 0, sizeof(calls));
    PyObject *result = NULL;
    int64_t *depth = NULL;
    uint32_t *parent = NULL, *call_op = NULL;
    int got = read_rows(args, &ops);
    if (got == TAKEN && nargs == 8) got = read_rows(args + 4, &calls);
    if (got != TAKEN) {
        if (got == DECLINED) result = Py_NewRef(Py_None);
        goto done;
    }
    int64_t n = ops.pid.length, m = nargs == 8 ? calls.pid.length : 0;
    depth = malloc(sizeof(int64_t) * (size_t)(n + 1));
    parent = malloc(sizeof(uint32_t) * (size_t)(n + 1));
    call_op = malloc(sizeof(uint32_t) * (size_t)(m + 1));
    if (depth == NULL || parent == NULL || call_op == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = nest_rows(&ops, nargs == 8 ? &calls : NULL, depth, parent, call_op);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyErr_NoMemory();
        goto done;
    }
    /* each column owns its buffer from here, freed with it (or at once, on failure) */
    PyObject *depth_column = exported("depth", "l", depth, NULL, n, 0);
    PyObject *parent_column = NULL, *call_column = NULL;
    if (depth_column != NULL) parent_column = row_column("parent_id", parent, n);
    else free(parent);
    if (parent_column != NULL && nargs == 8) call_column = row_column("op_id", call_op, m);
    else free(call_op);
    if (parent_column != NULL && nargs == 4) call_column = Py_NewRef(Py_None);
    depth = NULL, parent = NULL, call_op = NULL;
    if (call_column != NULL)
        result = PyTuple_Pack(3, depth_column, parent_column, call_column);
    Py_XDECREF(depth_column);
    Py_XDECREF(parent_column);
    Py_XDECREF(call_column);
done:
    release_rows(&ops);
    release_rows(&calls);
    free(depth);
    free(parent);
    free(call_op);
    return result;
}

static PyMethodDef METHODS[] = {
    {"nest", (PyCFunction)(void (*)(void))nest, METH_FASTCALL,
     "nest(op_pid, op_tid, op_start, op_end[, call_pid, call_tid, call_start, call_end]) -> "
     "((depth), (parent_id), (op_id of each call) or None) as Arrow (schema, array) capsule "
     "pairs; None when declined"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_op_nesting",
                                    "Operator nesting in one pass (op_nesting.c).", -1, METHODS,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__op_nesting(void) { return PyModule_Create(&MODULE); }
