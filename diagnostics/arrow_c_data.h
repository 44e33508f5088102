/* The Arrow C data and stream interfaces
   (https://arrow.apache.org/docs/format/CDataInterface.html), as this project's compiled
   modules hand columns to polars and take them from it: the structs, and the capsules that
   carry them (the Arrow PyCapsule interface). */

#ifndef PIPELINE_DOCTOR_ARROW_C_DATA_H
#define PIPELINE_DOCTOR_ARROW_C_DATA_H

#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* the C stream interface: how polars hands out a column (Series.__arrow_c_stream__) */
struct ArrowArrayStream {
    int (*get_schema)(struct ArrowArrayStream *, struct ArrowSchema *);
    int (*get_next)(struct ArrowArrayStream *, struct ArrowArray *);
    const char *(*get_last_error)(struct ArrowArrayStream *);
    void (*release)(struct ArrowArrayStream *);
    void *private_data;
};

#define ARROW_FLAG_NULLABLE 2

/* a schema whose strings are static: nothing to free */
static inline void schema_release(struct ArrowSchema *schema) { schema->release = NULL; }

static inline void schema_capsule_free(PyObject *capsule) {
    struct ArrowSchema *schema = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (schema == NULL) return;
    if (schema->release != NULL) schema->release(schema);
    free(schema);
}

static inline void array_capsule_free(PyObject *capsule) {
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (array == NULL) return;
    if (array->release != NULL) array->release(array);
    free(array);
}

#endif
