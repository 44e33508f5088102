/* A chunk of Chrome-trace events (a JSON array of objects) -> the event table's raw columns.

   The compiled counterpart of msgspec's decode into diagnostics.trace.columns.Event plus
   diagnostics.trace.columns.columns(): the same rows and values, without a Python object
   per event. It reads only the usual case and declines everything else, which the Python
   path then reads as before (diagnostics.trace.event_scan): a decline is never an error.

   Declined (scan() returns None): anything that is not strictly valid JSON, a value of a
   type the Struct would refuse or the Python path would convert in a way not copied here
   (a signed or zero-led numeric string where an integer may be, an integer beyond 18
   digits, a timestamp beyond 2^53, a float inside a re-encoded list), a kept string or any
   compared key with an escape, a category that is not ASCII, a key set twice, B/E (paired
   across chunks) and the other phase spellings pair() rewrites, nesting deeper than
   MAX_DEPTH. Read as polars reads them: canonical digits in a string ("25738") where an
   integer may be, and label strings ("Spans", "stream 7") there as null. Declining is always safe; accepting must give exactly what the
   Python path gives, so every check errs on the side of declining.

   The per-kind reading of args mirrors columns._KIND_FIELDS: a kernel's row keeps its
   stream, a CPU op's row does not, whatever its args hold. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mremap */
#endif
#include <sys/mman.h>
#include <pthread.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../arrow_c_data.h"

#define MAX_DEPTH 64
#define EXACT_FLOAT_LIMIT 9007199254740992.0 /* 2^53 */
#define EXACT_INT_LIMIT ((int64_t)1 << 53)

enum { OK = 0, DECLINE = 1, NOMEM = 2 };

/* ---- growable byte buffers ------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} Buf;

/* Buffers from this size on are mapped pages of their own, given back to the system when
   freed (past the spares below). From malloc, the freed columns of one chunk after another
   stayed in glibc's heap: the 1 GB trace's load ended with 660 MB more resident than its
   tables. */
#define MAPPED_BYTES ((Py_ssize_t)1 << 16)

/* Mapped blocks that polars lets go of (a chunk's raw columns, once normalised) are kept
   as spares for the next chunks' columns, up to SPARE_BYTES in all, while a load keeps
   them (keep_spare to release_spare, counted: loads may overlap): a fresh mapping is pages the kernel faults in and zeroes one at a time,
   and the scanner's were a fifth of the 1 GB load's page faults. Mapped sizes are powers of
   two (buf_grow doubles from 4096): one list per size, linked through the blocks' first
   bytes. polars frees columns from its own threads, hence the lock. */
#define SPARE_BYTES ((Py_ssize_t)32 << 20)
#define SPARE_SIZES 48

static pthread_mutex_t spare_lock = PTHREAD_MUTEX_INITIALIZER;
static void *spare_lists[SPARE_SIZES];
static Py_ssize_t spare_bytes;
/* loads under way that keep spares; with none, a freed block goes back to the system (an
   event table dropped later, or a refused load's chunks freed with its exception) */
static Py_ssize_t spare_keepers;

/* the list of blocks of ``cap`` bytes, or -1 where none are kept */
static int spare_list(Py_ssize_t cap) {
    if (cap < MAPPED_BYTES || (cap & (cap - 1)) != 0) return -1;
    int k = 0;
    while (((Py_ssize_t)1 << k) < cap) k++;
    return k < SPARE_SIZES ? k : -1;
}

static void *spare_take(Py_ssize_t cap) {
    int k = spare_list(cap);
    if (k < 0) return NULL;
    pthread_mutex_lock(&spare_lock);
    void *block = spare_lists[k];
    if (block != NULL) {
        spare_lists[k] = *(void **)block;
        spare_bytes -= cap;
    }
    pthread_mutex_unlock(&spare_lock);
    return block;
}

static int spare_keep(void *block, Py_ssize_t cap) {
    int k = spare_list(cap);
    if (k < 0) return 0;
    int kept = 0;
    pthread_mutex_lock(&spare_lock);
    if (spare_keepers > 0 && spare_bytes + cap <= SPARE_BYTES) {
        *(void **)block = spare_lists[k];
        spare_lists[k] = block;
        spare_bytes += cap;
        kept = 1;
    }
    pthread_mutex_unlock(&spare_lock);
    return kept;
}

static void block_free(void *data, Py_ssize_t cap) {
    if (data == NULL) return;
    if (cap < MAPPED_BYTES)
        free(data);
    else if (!spare_keep(data, cap))
        munmap(data, (size_t)cap);
}

static int buf_grow(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return OK;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    /* not PyMem: polars frees the columns (through the Arrow release callbacks) from its
       own threads, without the GIL */
    char *data;
    if (cap < MAPPED_BYTES) {
        data = realloc(b->data, (size_t)cap);
        if (data == NULL) return NOMEM;
    } else if (b->cap >= MAPPED_BYTES) {
        data = spare_take(cap);
        if (data != NULL) {
            memcpy(data, b->data, (size_t)b->len);
            block_free(b->data, b->cap);
        } else {
            data = mremap(b->data, (size_t)b->cap, (size_t)cap, MREMAP_MAYMOVE);
            if (data == MAP_FAILED) return NOMEM;
        }
    } else {
        data = spare_take(cap);
        if (data == NULL) {
            data = mmap(NULL, (size_t)cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
            if (data == MAP_FAILED) return NOMEM;
        }
        if (b->len) memcpy(data, b->data, (size_t)b->len);
        free(b->data);
    }
    b->data = data;
    b->cap = cap;
    return OK;
}

static inline int buf_room(Buf *b, Py_ssize_t extra) {
    return b->len + extra <= b->cap ? OK : buf_grow(b, extra);
}

static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_room(b, n) != OK) return NOMEM;
    memcpy(b->data + b->len, src, (size_t)n);
    b->len += n;
    return OK;
}

static inline int buf_byte(Buf *b, char c) {
    if (buf_room(b, 1) != OK) return NOMEM;
    b->data[b->len++] = c;
    return OK;
}

static void buf_free(Buf *b) {
    block_free(b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}

/* ---- columns -------------------------------------------------------------------------- */

enum { K_STR, K_I64, K_F64 };

/* A column is written row by row where rows have a value; the rows between are nulls,
   added in bulk when the next value (or the end) comes: most args are absent from most
   rows. */
typedef struct {
    int kind;
    Buf values;  /* int64 / double per row, or the strings' bytes */
    Buf offsets; /* strings: int64 start of each row, and the end */
    Buf valid;   /* one byte per row */
    Py_ssize_t rows;
    Py_ssize_t nulls;
} Col;

static int col_init(Col *c, int kind) {
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    if (kind == K_STR) {
        int64_t zero = 0;
        return buf_put(&c->offsets, &zero, sizeof(zero));
    }
    return OK;
}

static void col_free(Col *c) {
    buf_free(&c->values);
    buf_free(&c->offsets);
    buf_free(&c->valid);
}

/* nulls up to row ``row`` (not included) */
static int col_pad(Col *c, Py_ssize_t row) {
    Py_ssize_t gap = row - c->rows;
    if (gap <= 0) return OK;
    if (buf_room(&c->valid, gap) != OK) return NOMEM;
    memset(c->valid.data + c->valid.len, 0, (size_t)gap);
    c->valid.len += gap;
    if (c->kind == K_STR) {
        if (buf_room(&c->offsets, gap * 8) != OK) return NOMEM;
        int64_t end = (int64_t)c->values.len;
        char *at = c->offsets.data + c->offsets.len;
        for (Py_ssize_t i = 0; i < gap; i++) memcpy(at + i * 8, &end, 8);
        c->offsets.len += gap * 8;
    } else {
        if (buf_room(&c->values, gap * 8) != OK) return NOMEM;
        memset(c->values.data + c->values.len, 0, (size_t)(gap * 8));
        c->values.len += gap * 8;
    }
    c->nulls += gap;
    c->rows = row;
    return OK;
}

static inline int col_word(Col *c, Py_ssize_t row, const void *word) {
    if (c->rows < row && col_pad(c, row) != OK) return NOMEM;
    if (buf_room(&c->values, 8) != OK || buf_room(&c->valid, 1) != OK) return NOMEM;
    memcpy(c->values.data + c->values.len, word, 8);
    c->values.len += 8;
    c->valid.data[c->valid.len++] = 1;
    c->rows++;
    return OK;
}

static inline int col_i64(Col *c, Py_ssize_t row, int64_t v) { return col_word(c, row, &v); }
static inline int col_f64(Col *c, Py_ssize_t row, double v) { return col_word(c, row, &v); }

static int col_str(Col *c, Py_ssize_t row, const char *text, Py_ssize_t n) {
    if (c->rows < row && col_pad(c, row) != OK) return NOMEM;
    if (buf_put(&c->values, text, n) != OK) return NOMEM;
    int64_t end = (int64_t)c->values.len;
    if (buf_put(&c->offsets, &end, 8) != OK || buf_byte(&c->valid, 1) != OK) return NOMEM;
    c->rows++;
    return OK;
}

/* ---- the columns made, in diagnostics.trace.columns.RAW_EVENT_SCHEMA's order ---------- */

enum {
    E_PH, E_NAME, E_CAT, E_TS, E_DUR, E_PID, E_TID,
    /* the args fields, in the same order as the ARGS table below */
    E_DEVICE, E_STREAM, E_CORRELATION, E_EXTERNAL_ID, E_EXTERNAL_ID_LEGACY, E_BYTES,
    E_MEMORY_BYTES, E_TOTAL_ALLOCATED, E_TOTAL_RESERVED, E_DEVICE_TYPE, E_DEVICE_ID,
    E_INPUT_TYPES, E_DTYPE, E_INPUT_DIMS, E_BLOCKS_PER_SM, E_OCCUPANCY_PCT,
    E_COLLECTIVE_NAME, E_IN_MSG_NELEMS, E_OUT_MSG_NELEMS, E_GROUP_SIZE,
    E_PROCESS_GROUP_NAME, E_PROCESS_GROUP_RANKS, E_CONCRETE_INPUTS, E_SEQUENCE_NUMBER,
    E_FWD_THREAD_ID, E_INPUT_TYPE_TEXTS,
    E_COLUMNS
};

/* RAW_FLOW_SCHEMA's order */
enum { F_PH, F_NAME, F_CAT, F_TS, F_PID, F_TID, F_ID, F_COLUMNS };

/* kinds of event (columns._KIND_FIELDS), as bits */
#define MEM 1
#define GPU 2
#define RT 4
#define CPU 8
#define UNK 16

/* how an args value is read */
enum {
    T_INT,   /* an integer or null (int | None) */
    T_COUNT, /* an integer, a string as polars reads it into Int64, or null (int | str, and
                the Any-typed counts) */
    T_FLOAT, /* a number or null (float | None) */
    T_TEXT,  /* a string or null (the Any-typed collective names: text) */
    T_HALF,  /* Any: the 16-bit float dtypes it names (columns._half_of) */
    T_LIST,  /* list | None: kept as compact JSON text (columns._raw_texts) */
    T_SKIP,  /* Any, not a column (M events' name: read from the event itself) */
};

typedef struct {
    const char *key;
    Py_ssize_t len;
    int type;
    int kinds; /* the kinds of event whose rows keep it */
} ArgField;

#define ARG(k, t, m) {k, sizeof(k) - 1, t, m}
static const ArgField ARGS[] = {
    ARG("device", T_INT, GPU | UNK),
    ARG("stream", T_INT, GPU | UNK),
    ARG("correlation", T_INT, GPU | RT | UNK),
    ARG("External id", T_INT, GPU | RT | CPU | UNK),
    ARG("external id", T_INT, GPU | RT | CPU | UNK),
    ARG("bytes", T_COUNT, MEM | GPU | UNK),
    ARG("Bytes", T_COUNT, MEM | UNK),
    ARG("Total Allocated", T_INT, MEM | UNK),
    ARG("Total Reserved", T_INT, MEM | UNK),
    ARG("Device Type", T_INT, MEM | UNK),
    ARG("Device Id", T_INT, MEM | UNK),
    ARG("Input type", T_HALF, CPU | UNK),
    ARG("dtype", T_HALF, CPU | UNK),
    ARG("Input Dims", T_LIST, CPU | UNK),
    ARG("blocks per SM", T_FLOAT, GPU | UNK),
    ARG("est. achieved occupancy %", T_FLOAT, GPU | UNK),
    ARG("Collective name", T_TEXT, GPU | CPU | UNK),
    ARG("In msg nelems", T_COUNT, GPU | CPU | UNK),
    ARG("Out msg nelems", T_COUNT, GPU | CPU | UNK),
    ARG("Group size", T_COUNT, GPU | CPU | UNK),
    ARG("Process Group Name", T_TEXT, GPU | CPU | UNK),
    ARG("Process Group Ranks", T_TEXT, GPU | CPU | UNK),
    ARG("Concrete Inputs", T_LIST, CPU | UNK),
    ARG("Sequence number", T_COUNT, CPU | UNK),
    ARG("Fwd thread id", T_COUNT, CPU | UNK),
    ARG("name", T_SKIP, 0),
};
#define N_ARGS ((int)(sizeof(ARGS) / sizeof(ARGS[0])))
#define N_ARG_COLUMNS (E_INPUT_TYPE_TEXTS - E_DEVICE)
#define A_INPUT_TYPES (E_INPUT_TYPES - E_DEVICE)
#define A_INPUT_DIMS (E_INPUT_DIMS - E_DEVICE)
#define A_CONCRETE_INPUTS (E_CONCRETE_INPUTS - E_DEVICE)

/* columns._GPU_CATS, _RUNTIME_CATS, _CPU_CATS: compared lower-cased */
typedef struct {
    const char *name;
    Py_ssize_t len;
    int kind;
} Category;
#define CAT(k, m) {k, sizeof(k) - 1, m}
static const Category CATEGORIES[] = {
    CAT("kernel", GPU), CAT("memcpy", GPU), CAT("gpu_memcpy", GPU), CAT("memset", GPU),
    CAT("gpu_memset", GPU), CAT("cuda_sync", GPU), CAT("runtime", RT), CAT("cuda_runtime", RT),
    CAT("cuda_driver", RT), CAT("driver", RT), CAT("operator", CPU), CAT("cpu_op", CPU),
    CAT("user_annotation", CPU), CAT("python_function", CPU),
};
#define N_CATEGORIES ((int)(sizeof(CATEGORIES) / sizeof(CATEGORIES[0])))

/* ---- one event's values, until its row is written ------------------------------------- */

enum { V_ABSENT = 0, V_NULL, V_INT, V_FLOAT, V_STR, V_TEXT, V_HALF };

typedef struct {
    int state;
    int half;     /* V_HALF: bit 1 Half, bit 2 BFloat16 */
    int has_text; /* "Input type" that is a list: its text is in the scan's texts too */
    int64_t i;
    double f;
    const char *s; /* V_STR: the string's bytes in the input (it has no escape) */
    Py_ssize_t n;
} Value;

typedef struct {
    Value ph, name, cat, ts, dur, pid, tid, id;
    Value args[N_ARGS];
    uint32_t seen;      /* top-level keys read, to decline a key given twice */
    uint64_t args_seen; /* the same for args keys */
} Event;

typedef struct {
    const unsigned char *start, *p, *end;
    Col events[E_COLUMNS];
    Col flows[F_COLUMNS];
    Buf spans; /* M events: (start, end) byte offsets, int64 pairs */
    Buf texts[3]; /* the event being read: its Input Dims, Concrete Inputs, Input type */
    Py_ssize_t n_events, n_flows;
} Scan;

/* ---- JSON ----------------------------------------------------------------------------- */

static inline void skip_ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static inline int hex(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Bytes a string holds as they are: printable ASCII but the quote and the backslash. */
static unsigned char PLAIN[256];

static void plain_bytes(void) {
    for (int c = 0x20; c < 0x80; c++) PLAIN[c] = c != '"' && c != '\\';
}

/* One UTF-8 sequence at s->p (a lead byte >= 0x80), strictly as Python's decoder reads it. */
static int utf8_sequence(Scan *s) {
    const unsigned char *p = s->p;
    unsigned char c = p[0];
    int more;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        more = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        more = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        more = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return DECLINE;
    }
    if (s->end - p <= more) return DECLINE;
    if (p[1] < lo || p[1] > hi) return DECLINE;
    for (int k = 2; k <= more; k++)
        if ((p[k] & 0xC0) != 0x80) return DECLINE;
    s->p = p + more + 1;
    return OK;
}

/* A string at s->p (at its opening quote): its bytes between the quotes, whether it holds
   an escape (then the bytes are not its text) and whether it is all ASCII. */
static int string(Scan *s, const char **text, Py_ssize_t *len, int *escaped, int *ascii) {
    if (s->p >= s->end || *s->p != '"') return DECLINE;
    const unsigned char *from = ++s->p;
    *escaped = 0;
    *ascii = 1;
    for (;;) {
        while (s->p < s->end && PLAIN[*s->p]) s->p++;
        if (s->p >= s->end) return DECLINE;
        unsigned char c = *s->p;
        if (c == '"') break;
        if (c < 0x20) return DECLINE; /* JSON strings escape control characters */
        if (c == '\\') {
            *escaped = 1;
            if (s->end - s->p < 2) return DECLINE;
            unsigned char e = s->p[1];
            if (e == 'u') {
                if (s->end - s->p < 6) return DECLINE;
                int code = 0;
                for (int k = 2; k < 6; k++) {
                    int h = hex(s->p[k]);
                    if (h < 0) return DECLINE;
                    code = code * 16 + h;
                }
                if (code >= 0xD800 && code <= 0xDFFF) return DECLINE; /* surrogates: Python's */
                s->p += 6;
            } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' ||
                       e == 'r' || e == 't') {
                s->p += 2;
            } else {
                return DECLINE;
            }
            continue;
        }
        *ascii = 0;
        if (utf8_sequence(s) != OK) return DECLINE;
    }
    *text = (const char *)from;
    *len = (Py_ssize_t)(s->p - from);
    s->p++; /* the closing quote */
    return OK;
}

/* A number at s->p: its text, and whether it is an integer (no fraction, no exponent). */
static int number(Scan *s, const char **text, Py_ssize_t *len, int *integer) {
    const unsigned char *from = s->p, *p = s->p, *end = s->end;
    if (p < end && *p == '-') p++;
    if (p >= end) return DECLINE;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return DECLINE;
    }
    *integer = 1;
    if (p < end && *p == '.') {
        *integer = 0;
        p++;
        if (p >= end || *p < '0' || *p > '9') return DECLINE;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return DECLINE;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    *text = (const char *)from;
    *len = (Py_ssize_t)(p - from);
    s->p = p;
    return OK;
}

/* An integer's text -> int64; declined past 18 digits (beyond int64 the Python path
   turns the value null, which is not worth copying here). */
static int to_int64(const char *text, Py_ssize_t len, int64_t *out) {
    int negative = text[0] == '-';
    Py_ssize_t digits = len - negative;
    if (digits > 18) return DECLINE;
    int64_t v = 0;
    for (Py_ssize_t k = negative; k < len; k++) v = v * 10 + (text[k] - '0');
    *out = negative ? -v : v;
    return OK;
}

static const double POWERS_OF_TEN[] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* A string where an integer may be (pid, tid, a flow's id, "bytes", the Any-typed
   counts) -> what polars' non-strict Int64 cast makes of it: canonical digits are the
   number, a string with no digit or with a space is null ("Spans", "stream 7"); anything
   else (a sign, a leading zero, "1e3", which polars parses too) is declined. */
static int int_of_string(const char *text, Py_ssize_t len, Value *v) {
    int digits = 0, other = 0, space = 0;
    for (Py_ssize_t k = 0; k < len; k++) {
        unsigned char c = (unsigned char)text[k];
        if (c >= '0' && c <= '9') digits++;
        else if (c == ' ') space = 1;
        else other = 1;
    }
    if (digits == 0 || space) {
        v->state = V_NULL;
        return OK;
    }
    if (other || (text[0] == '0' && len > 1) || to_int64(text, len, &v->i) != OK) return DECLINE;
    v->state = V_INT;
    return OK;
}

/* A number's text -> double, rounded correctly (as msgspec does, so the same double).
   Most trace numbers (1669783687759332.0, 12.5) are an integer of at most 53 bits times a
   power of ten of at most 22: both exact as doubles, so one division or product rounds
   correctly (Clinger's fast path); the others go through Python's own correctly rounded
   parser. */
static int to_double(const char *text, Py_ssize_t len, int integer, double *out) {
    if (integer) {
        int64_t v;
        if (to_int64(text, len, &v) != OK) return DECLINE;
        *out = (double)v;
        return OK;
    }
    {
        const char *p = text, *end = text + len;
        int negative = *p == '-';
        p += negative;
        uint64_t mantissa = 0;
        int digits = 0, exponent = 0;
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (digits || *p != '0') digits++;
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            if (digits > 19) goto slow;
        }
        if (p < end && *p == '.') {
            for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
                if (digits || *p != '0') digits++;
                if (digits > 19) goto slow;
                mantissa = mantissa * 10 + (uint64_t)(*p - '0');
                exponent--;
            }
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            p++;
            int negative_exp = *p == '-';
            if (*p == '+' || *p == '-') p++;
            int e = 0;
            for (; p < end && *p >= '0' && *p <= '9'; p++) {
                e = e * 10 + (*p - '0');
                if (e > 1000) goto slow;
            }
            exponent += negative_exp ? -e : e;
        }
        while (exponent < 0 && mantissa != 0 && mantissa % 10 == 0) {
            mantissa /= 10;
            exponent++;
        }
        if (mantissa > ((uint64_t)1 << 53) || exponent < -22 || exponent > 22) goto slow;
        double v = (double)mantissa;
        v = exponent < 0 ? v / POWERS_OF_TEN[-exponent] : v * POWERS_OF_TEN[exponent];
        *out = negative ? -v : v;
        return OK;
    }
slow:;
    char copy[64];
    if (len >= (Py_ssize_t)sizeof(copy)) return DECLINE;
    memcpy(copy, text, (size_t)len);
    copy[len] = '\0';
    char *stop = NULL;
    double v = PyOS_string_to_double(copy, &stop, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return DECLINE;
    }
    if (stop != copy + len || !isfinite(v)) return DECLINE;
    *out = v;
    return OK;
}

static int literal(Scan *s, const char *word, Py_ssize_t len) {
    if (s->end - s->p < len || memcmp(s->p, word, (size_t)len) != 0) return DECLINE;
    s->p += len;
    return OK;
}

/* The walk through objects and arrays, shared by every reader below. */

/* At a container's opening bracket: steps over it; ``empty`` when the container closes at
   once (its closing bracket is stepped over too). */
static void opened(Scan *s, char close, int *empty) {
    s->p++;
    skip_ws(s);
    *empty = s->p < s->end && *s->p == close;
    if (*empty) s->p++;
}

/* After a member: steps over the comma before the next one (``last`` 0) or over the
   closing bracket (``last`` 1). */
static int after_member(Scan *s, char close, int *last) {
    skip_ws(s);
    if (s->p >= s->end) return DECLINE;
    if (*s->p == close) {
        s->p++;
        *last = 1;
        return OK;
    }
    if (*s->p != ',') return DECLINE;
    s->p++;
    skip_ws(s);
    *last = 0;
    return OK;
}

/* An object's key and its colon, up to its value (which must follow). A key with an
   escape is declined where keys are compared (``plain``): its bytes are not its text. */
static int object_key(Scan *s, const char **key, Py_ssize_t *len, int plain) {
    int escaped, ascii;
    if (string(s, key, len, &escaped, &ascii) != OK || (plain && escaped)) return DECLINE;
    skip_ws(s);
    if (s->p >= s->end || *s->p != ':') return DECLINE;
    s->p++;
    skip_ws(s);
    return s->p < s->end ? OK : DECLINE;
}

/* Any JSON value, read and dropped (but still checked: what the Python path would refuse
   must not be accepted here). */
static int skip_value(Scan *s, int depth) {
    if (depth > MAX_DEPTH || s->p >= s->end) return DECLINE;
    const char *text;
    Py_ssize_t len;
    int a, b, last;
    switch (*s->p) {
    case '"':
        return string(s, &text, &len, &a, &b);
    case 't':
        return literal(s, "true", 4);
    case 'f':
        return literal(s, "false", 5);
    case 'n':
        return literal(s, "null", 4);
    case '[':
        opened(s, ']', &last);
        while (!last)
            if (skip_value(s, depth + 1) != OK || after_member(s, ']', &last) != OK)
                return DECLINE;
        return OK;
    case '{':
        opened(s, '}', &last);
        while (!last)
            if (object_key(s, &text, &len, 0) != OK || skip_value(s, depth + 1) != OK ||
                after_member(s, '}', &last) != OK)
                return DECLINE;
        return OK;
    default:
        return number(s, &text, &len, &a);
    }
}

/* A value written again as msgspec's compact JSON (columns._raw_texts): lists, integers,
   strings without escapes, true/false/null. Floats (written shortest-first by msgspec) and
   objects are declined. */
static int compact(Scan *s, Buf *out, int depth) {
    if (depth > MAX_DEPTH || s->p >= s->end) return DECLINE;
    const char *text;
    Py_ssize_t len;
    int escaped, ascii, integer, last, rc;
    switch (*s->p) {
    case '"':
        if (string(s, &text, &len, &escaped, &ascii) != OK || escaped) return DECLINE;
        if (buf_byte(out, '"') || buf_put(out, text, len) || buf_byte(out, '"')) return NOMEM;
        return OK;
    case 't':
        if (literal(s, "true", 4) != OK) return DECLINE;
        return buf_put(out, "true", 4);
    case 'f':
        if (literal(s, "false", 5) != OK) return DECLINE;
        return buf_put(out, "false", 5);
    case 'n':
        if (literal(s, "null", 4) != OK) return DECLINE;
        return buf_put(out, "null", 4);
    case '[':
        if (buf_byte(out, '[') != OK) return NOMEM;
        opened(s, ']', &last);
        if (last) return buf_byte(out, ']');
        while (!last) {
            if ((rc = compact(s, out, depth + 1)) != OK) return rc;
            if (after_member(s, ']', &last) != OK) return DECLINE;
            if (buf_byte(out, last ? ']' : ',') != OK) return NOMEM;
        }
        return OK;
    case '{':
        return DECLINE;
    default: {
        int64_t v;
        if (number(s, &text, &len, &integer) != OK || !integer) return DECLINE;
        if (to_int64(text, len, &v) != OK) return DECLINE;
        if (v == 0 && text[0] == '-') return DECLINE; /* -0 is written back as 0 */
        return buf_put(out, text, len);
    }
    }
}

/* columns._HALF_DTYPE_ARG */
static int half_of_name(const char *text, Py_ssize_t len) {
#define IS(w) (len == (Py_ssize_t)sizeof(w) - 1 && memcmp(text, w, (size_t)len) == 0)
    if (IS("Half") || IS("c10::Half") || IS("torch.float16")) return 1;
    if (IS("BFloat16") || IS("c10::BFloat16") || IS("torch.bfloat16")) return 2;
    return 0;
#undef IS
}

/* "Input type" / "dtype" (Any): the 16-bit float dtypes a list holds ("c10::Half" or
   "c10::BFloat16" among its items) or a string names; any other value names none. With
   ``text``, a list is also written as compact JSON (input_type_texts). */
static int half_value(Scan *s, Value *v, Buf *text) {
    const char *str;
    Py_ssize_t len;
    int escaped, ascii;
    v->state = V_HALF;
    v->half = 0;
    v->has_text = 0;
    if (s->p >= s->end) return DECLINE;
    if (*s->p == '"') {
        if (string(s, &str, &len, &escaped, &ascii) != OK || escaped) return DECLINE;
        v->half = half_of_name(str, len);
        return OK;
    }
    if (*s->p != '[') return skip_value(s, 1); /* a number, null, an object: none */
    /* the items: strings are compared, and everything is written when text is wanted */
    int last;
    if (text != NULL && buf_byte(text, '[') != OK) return NOMEM;
    opened(s, ']', &last);
    if (last && text != NULL && buf_byte(text, ']') != OK) return NOMEM;
    while (!last) {
        if (s->p >= s->end) return DECLINE;
        if (*s->p == '"') {
            const unsigned char *at = s->p;
            if (string(s, &str, &len, &escaped, &ascii) != OK || escaped) return DECLINE;
            if (len == 9 && memcmp(str, "c10::Half", 9) == 0) v->half |= 1;
            if (len == 13 && memcmp(str, "c10::BFloat16", 13) == 0) v->half |= 2;
            if (text != NULL && buf_put(text, at, (Py_ssize_t)(s->p - at)) != OK) return NOMEM;
        } else {
            int rc = text != NULL ? compact(s, text, 2) : skip_value(s, 2);
            if (rc != OK) return rc;
        }
        if (after_member(s, ']', &last) != OK) return DECLINE;
        if (text != NULL && buf_byte(text, last ? ']' : ',') != OK) return NOMEM;
    }
    v->has_text = text != NULL;
    return OK;
}

/* A value of the given type into v. */
static int typed_value(Scan *s, Value *v, int type, Buf *text) {
    const char *str;
    Py_ssize_t len;
    int escaped, ascii, integer;
    if (s->p >= s->end) return DECLINE;
    if (type == T_SKIP) return skip_value(s, 1);
    if (type == T_HALF) return half_value(s, v, text);
    if (*s->p == 'n') {
        if (literal(s, "null", 4) != OK) return DECLINE;
        v->state = V_NULL;
        return OK;
    }
    switch (type) {
    case T_COUNT:
        if (*s->p == '"') {
            if (string(s, &str, &len, &escaped, &ascii) != OK || escaped) return DECLINE;
            return int_of_string(str, len, v);
        }
        /* fall through: a number */
    case T_INT:
        if (number(s, &str, &len, &integer) != OK || !integer) return DECLINE;
        if (to_int64(str, len, &v->i) != OK) return DECLINE;
        v->state = V_INT;
        return OK;
    case T_FLOAT:
        if (number(s, &str, &len, &integer) != OK) return DECLINE;
        if (to_double(str, len, integer, &v->f) != OK) return DECLINE;
        v->state = V_FLOAT;
        return OK;
    case T_TEXT:
        if (string(s, &str, &len, &escaped, &ascii) != OK || escaped) return DECLINE;
        v->s = str;
        v->n = len;
        v->state = V_STR;
        return OK;
    case T_LIST: {
        if (*s->p != '[') return DECLINE;
        int rc = compact(s, text, 1);
        if (rc != OK) return rc;
        v->state = V_TEXT;
        return OK;
    }
    }
    return DECLINE;
}

static int args_object(Scan *s, Event *ev) {
    const char *key;
    Py_ssize_t len;
    int last;
    if (s->p >= s->end || *s->p != '{') return DECLINE; /* Args is not optional: null refused */
    opened(s, '}', &last);
    while (!last) {
        if (object_key(s, &key, &len, 1) != OK) return DECLINE;
        int field = -1;
        for (int k = 0; k < N_ARGS; k++) {
            if (ARGS[k].len == len && memcmp(ARGS[k].key, key, (size_t)len) == 0) {
                field = k;
                break;
            }
        }
        int rc;
        if (field < 0) {
            rc = skip_value(s, 2);
        } else {
            if (ev->args_seen & ((uint64_t)1 << field)) return DECLINE;
            ev->args_seen |= (uint64_t)1 << field;
            Buf *text = NULL;
            if (field == A_INPUT_DIMS) text = &s->texts[0];
            if (field == A_CONCRETE_INPUTS) text = &s->texts[1];
            if (field == A_INPUT_TYPES) text = &s->texts[2];
            if (text != NULL) text->len = 0;
            rc = typed_value(s, &ev->args[field], ARGS[field].type, text);
        }
        if (rc != OK) return rc;
        if (after_member(s, '}', &last) != OK) return DECLINE;
    }
    return OK;
}

enum { K_PH, K_NAME, K_CAT, K_TS, K_DUR, K_PID, K_TID, K_ID, K_ARGS };

static int top_key(const char *key, Py_ssize_t len) {
#define IS(w) (len == (Py_ssize_t)sizeof(w) - 1 && memcmp(key, w, (size_t)len) == 0)
    if (IS("ph")) return K_PH;
    if (IS("name")) return K_NAME;
    if (IS("cat")) return K_CAT;
    if (IS("ts")) return K_TS;
    if (IS("dur")) return K_DUR;
    if (IS("pid")) return K_PID;
    if (IS("tid")) return K_TID;
    if (IS("id")) return K_ID;
    if (IS("args")) return K_ARGS;
    return -1;
#undef IS
}

static int event_object(Scan *s, Event *ev) {
    const char *key, *str;
    Py_ssize_t len, slen;
    int escaped, ascii, integer, last;
    if (s->p >= s->end || *s->p != '{') return DECLINE;
    opened(s, '}', &last);
    while (!last) {
        if (object_key(s, &key, &len, 1) != OK) return DECLINE;
        int which = top_key(key, len);
        int rc = OK;
        if (which >= 0) {
            if (ev->seen & (1u << which)) return DECLINE;
            ev->seen |= 1u << which;
        }
        Value *v = NULL;
        switch (which) {
        case K_PH: v = &ev->ph; break;
        case K_NAME: v = &ev->name; break;
        case K_CAT: v = &ev->cat; break;
        case K_TS: v = &ev->ts; break;
        case K_DUR: v = &ev->dur; break;
        case K_PID: v = &ev->pid; break;
        case K_TID: v = &ev->tid; break;
        case K_ID: v = &ev->id; break;
        }
        if (which == K_ARGS) {
            rc = args_object(s, ev);
        } else if (which < 0) {
            rc = skip_value(s, 1);
        } else if (*s->p == 'n') {
            rc = literal(s, "null", 4);
            v->state = V_NULL;
        } else if (which == K_PH || which == K_NAME || which == K_CAT) {
            /* str | None */
            rc = string(s, &str, &slen, &escaped, &ascii);
            if (rc == OK && (escaped || (which == K_CAT && !ascii))) rc = DECLINE;
            v->s = str;
            v->n = slen;
            v->state = V_STR;
        } else if (which == K_TS || which == K_DUR) {
            /* int | float | None, float | None: both made float64; ts beyond 2^53 is
               TsClock's (a base, or rounded values counted as lossy) */
            rc = number(s, &str, &slen, &integer);
            if (rc == OK && which == K_TS && integer) {
                /* compared as an integer: 2^53 + 1 rounds to 2^53 as a double */
                int64_t exact;
                rc = to_int64(str, slen, &exact);
                if (rc == OK && (exact > EXACT_INT_LIMIT || exact < -EXACT_INT_LIMIT)) rc = DECLINE;
            }
            if (rc == OK) rc = to_double(str, slen, integer, &v->f);
            if (rc == OK && which == K_TS && fabs(v->f) > EXACT_FLOAT_LIMIT) rc = DECLINE;
            v->state = V_FLOAT;
        } else if (*s->p == '"') {
            /* pid, tid, id: int | str | None; polars reads the strings (non-flow rows
               have no id column) */
            rc = string(s, &str, &slen, &escaped, &ascii);
            if (rc == OK && escaped) rc = DECLINE;
            if (rc == OK) rc = int_of_string(str, slen, v);
        } else {
            /* pid, tid, id: an int here; a numeric or label string is the Python path's */
            rc = number(s, &str, &slen, &integer);
            if (rc == OK && !integer) rc = DECLINE;
            if (rc == OK) rc = to_int64(str, slen, &v->i);
            v->state = V_INT;
        }
        if (rc != OK) return rc;
        if (after_member(s, '}', &last) != OK) return DECLINE;
    }
    return OK;
}

static inline int is(const Value *v, const char *word) {
    Py_ssize_t len = (Py_ssize_t)strlen(word);
    return v->state == V_STR && v->n == len && memcmp(v->s, word, (size_t)len) == 0;
}

static int kind_of(const Event *ev) {
    if (is(&ev->name, "[memory]")) return MEM;
    if (ev->name.state != V_STR || ev->cat.state != V_STR) return UNK;
    for (int k = 0; k < N_CATEGORIES; k++) {
        const Category *c = &CATEGORIES[k];
        if (c->len != ev->cat.n) continue;
        Py_ssize_t i = 0;
        for (; i < c->len; i++) {
            char ch = ev->cat.s[i];
            if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
            if (ch != c->name[i]) break;
        }
        if (i == c->len) return c->kind;
    }
    return UNK;
}

static inline int put_str(Col *c, Py_ssize_t row, const Value *v) {
    return v->state == V_STR ? col_str(c, row, v->s, v->n) : OK;
}
static inline int put_f64(Col *c, Py_ssize_t row, const Value *v) {
    return v->state == V_FLOAT ? col_f64(c, row, v->f) : OK;
}
static inline int put_i64(Col *c, Py_ssize_t row, const Value *v) {
    return v->state == V_INT ? col_i64(c, row, v->i) : OK;
}

static const char *const HALF_NAMES[] = {NULL, "c10::Half", "c10::BFloat16",
                                         "c10::Half,c10::BFloat16"};

static int event_row(Scan *s, const Event *ev, const unsigned char *from) {
    int rc;
    /* B/E pair across chunks; "x", "I", "m" are spellings pair() rewrites */
    if (is(&ev->ph, "B") || is(&ev->ph, "E") || is(&ev->ph, "x") || is(&ev->ph, "I") ||
        is(&ev->ph, "m"))
        return DECLINE;
    if (is(&ev->ph, "s") || is(&ev->ph, "f") || is(&ev->ph, "t")) {
        /* a flow: its own columns, no args */
        Col *f = s->flows;
        Py_ssize_t row = s->n_flows;
        if ((rc = put_str(&f[F_PH], row, &ev->ph)) || (rc = put_str(&f[F_NAME], row, &ev->name)) ||
            (rc = put_str(&f[F_CAT], row, &ev->cat)) || (rc = put_f64(&f[F_TS], row, &ev->ts)) ||
            (rc = put_i64(&f[F_PID], row, &ev->pid)) || (rc = put_i64(&f[F_TID], row, &ev->tid)) ||
            (rc = put_i64(&f[F_ID], row, &ev->id)))
            return rc;
        s->n_flows++;
        return OK;
    }
    if (is(&ev->ph, "M")) {
        int64_t span[2] = {(int64_t)(from - s->start), (int64_t)(s->p - s->start)};
        if (buf_put(&s->spans, span, sizeof(span)) != OK) return NOMEM;
    }
    Col *e = s->events;
    Py_ssize_t row = s->n_events;
    if ((rc = put_str(&e[E_PH], row, &ev->ph)) || (rc = put_str(&e[E_NAME], row, &ev->name)) ||
        (rc = put_str(&e[E_CAT], row, &ev->cat)) || (rc = put_f64(&e[E_TS], row, &ev->ts)) ||
        (rc = put_f64(&e[E_DUR], row, &ev->dur)) || (rc = put_i64(&e[E_PID], row, &ev->pid)) ||
        (rc = put_i64(&e[E_TID], row, &ev->tid)))
        return rc;
    uint64_t seen = ev->args_seen;
    if (seen != 0) {
        int kind = kind_of(ev);
        for (int k = 0; k < N_ARG_COLUMNS; k++) {
            if (!(seen & ((uint64_t)1 << k)) || !(ARGS[k].kinds & kind)) continue;
            const Value *v = &ev->args[k];
            Col *c = &e[E_DEVICE + k];
            switch (ARGS[k].type) {
            case T_INT:
        case T_COUNT: rc = put_i64(c, row, v); break;
            case T_FLOAT: rc = put_f64(c, row, v); break;
            case T_TEXT: rc = put_str(c, row, v); break;
            case T_LIST:
                rc = v->state == V_TEXT
                         ? col_str(c, row, s->texts[k == A_INPUT_DIMS ? 0 : 1].data,
                                   s->texts[k == A_INPUT_DIMS ? 0 : 1].len)
                         : OK;
                break;
            case T_HALF: {
                const char *half = v->state == V_HALF ? HALF_NAMES[v->half] : NULL;
                rc = half != NULL ? col_str(c, row, half, (Py_ssize_t)strlen(half)) : OK;
                if (rc == OK && k == A_INPUT_TYPES && v->state == V_HALF && v->has_text)
                    rc = col_str(&e[E_INPUT_TYPE_TEXTS], row, s->texts[2].data, s->texts[2].len);
                break;
            }
            }
            if (rc != OK) return rc;
        }
    }
    s->n_events++;
    return OK;
}

static int scan_array(Scan *s) {
    int last;
    skip_ws(s);
    if (s->p >= s->end || *s->p != '[') return DECLINE;
    opened(s, ']', &last);
    if (last) return DECLINE; /* no events: the Python path's */
    Event ev;
    while (!last) {
        /* a reset of what event_row reads: the args it reads only where args_seen says */
        ev.ph.state = ev.name.state = ev.cat.state = ev.ts.state = V_ABSENT;
        ev.dur.state = ev.pid.state = ev.tid.state = ev.id.state = V_ABSENT;
        ev.seen = 0;
        ev.args_seen = 0;
        const unsigned char *from = s->p;
        int rc = event_object(s, &ev);
        if (rc == OK) rc = event_row(s, &ev, from);
        if (rc != OK) return rc;
        if (after_member(s, ']', &last) != OK) return DECLINE;
    }
    skip_ws(s);
    return s->p == s->end ? OK : DECLINE;
}

/* ---- to Python: the columns through the Arrow C data interface ---------------------- */
/* https://arrow.apache.org/docs/format/CDataInterface.html: polars imports the columns
   without a copy and frees them through the release callbacks. */

static const char *const EVENT_NAMES[E_COLUMNS] = {
    "ph", "name", "cat", "ts", "dur", "pid", "tid", "device", "stream", "correlation",
    "external_id", "external_id_legacy", "bytes", "memory_bytes", "total_allocated",
    "total_reserved", "device_type", "device_id", "input_types", "dtype", "input_dims",
    "blocks_per_sm", "occupancy_pct", "collective_name", "in_msg_nelems", "out_msg_nelems",
    "group_size", "process_group_name", "process_group_ranks", "concrete_inputs",
    "sequence_number", "fwd_thread_id", "input_type_texts",
};
static const char *const FLOW_NAMES[F_COLUMNS] = {"ph", "name", "cat", "ts", "pid", "tid", "id"};

static const int EVENT_KINDS[E_COLUMNS] = {
    K_STR, K_STR, K_STR, K_F64, K_F64, K_I64, K_I64,                 /* ph .. tid */
    K_I64, K_I64, K_I64, K_I64, K_I64, K_I64, K_I64, K_I64, K_I64, K_I64, K_I64, /* ints */
    K_STR, K_STR, K_STR, K_F64, K_F64,                               /* types .. occupancy */
    K_STR, K_I64, K_I64, K_I64, K_STR, K_STR, K_STR, K_I64, K_I64,   /* collectives .. fwd */
    K_STR,                                                           /* input_type_texts */
};
static const int FLOW_KINDS[F_COLUMNS] = {K_STR, K_STR, K_STR, K_F64, K_I64, K_I64, K_I64};

/* Each column is exported on its own: polars keeps an imported array's whole allocation
   alive while any part of it is used, so one struct array of all the columns would pin a
   chunk's every column for as long as the table keeps its names. */

typedef struct {
    void *owned[3];
    Py_ssize_t sizes[3]; /* the blocks' allocated sizes (block_free) */
    const void *buffers[3];
} ColumnParts;

static void array_release(struct ArrowArray *array) {
    ColumnParts *parts = array->private_data;
    if (parts != NULL) {
        for (int k = 0; k < 3; k++) block_free(parts->owned[k], parts->sizes[k]);
        free(parts);
    }
    array->private_data = NULL;
    array->release = NULL;
}

/* One column (padded to n rows) as (schema capsule, array capsule); its buffers move into
   the array. */
static PyObject *column_capsules(Col *c, const char *name, Py_ssize_t n) {
    if (col_pad(c, n) != OK) return PyErr_NoMemory();
    /* an empty column still gets a data buffer (consumers may read its pointer) */
    if (c->values.data == NULL && buf_grow(&c->values, 8) != OK) return PyErr_NoMemory();
    struct ArrowSchema *schema = calloc(1, sizeof(*schema));
    if (schema == NULL) return PyErr_NoMemory();
    schema->format = c->kind == K_STR ? "U" : c->kind == K_I64 ? "l" : "g";
    schema->name = name;
    schema->flags = ARROW_FLAG_NULLABLE;
    schema->release = schema_release;
    PyObject *schema_capsule = PyCapsule_New(schema, "arrow_schema", schema_capsule_free);
    if (schema_capsule == NULL) {
        free(schema);
        return NULL;
    }
    struct ArrowArray *array = calloc(1, sizeof(*array));
    ColumnParts *parts = calloc(1, sizeof(*parts));
    unsigned char *bits = NULL;
    if (c->nulls > 0) bits = calloc((size_t)((n + 7) / 8), 1);
    if (array == NULL || parts == NULL || (c->nulls > 0 && bits == NULL)) {
        free(array);
        free(parts);
        free(bits);
        Py_DECREF(schema_capsule);
        return PyErr_NoMemory();
    }
    if (bits != NULL) {
        const char *valid = c->valid.data;
        for (Py_ssize_t i = 0; i < n; i++)
            if (valid[i]) bits[i >> 3] |= (unsigned char)(1u << (i & 7));
    }
    parts->owned[0] = bits; /* n / 8 bytes: malloc's, below MAPPED_BYTES */
    parts->sizes[0] = 0;
    Buf *first = c->kind == K_STR ? &c->offsets : &c->values;
    parts->owned[1] = first->data;
    parts->sizes[1] = first->cap;
    parts->owned[2] = c->kind == K_STR ? c->values.data : NULL;
    parts->sizes[2] = c->kind == K_STR ? c->values.cap : 0;
    /* moved */
    c->offsets.data = c->kind == K_STR ? NULL : c->offsets.data;
    c->values.data = NULL;
    c->offsets.cap = c->kind == K_STR ? 0 : c->offsets.cap;
    c->values.cap = 0;
    for (int k = 0; k < 3; k++) parts->buffers[k] = parts->owned[k];
    array->length = n;
    array->null_count = c->nulls;
    array->n_buffers = c->kind == K_STR ? 3 : 2;
    array->buffers = parts->buffers;
    array->release = array_release;
    array->private_data = parts;
    PyObject *array_capsule = PyCapsule_New(array, "arrow_array", array_capsule_free);
    if (array_capsule == NULL) {
        array_release(array);
        free(array);
        Py_DECREF(schema_capsule);
        return NULL;
    }
    return Py_BuildValue("(NN)", schema_capsule, array_capsule);
}

/* [(schema capsule, array capsule)] per column: what __arrow_c_array__ returns */
static PyObject *table_capsules(Col *cols, const char *const *names, int count, Py_ssize_t n) {
    PyObject *list = PyList_New(count);
    if (list == NULL) return NULL;
    for (int k = 0; k < count; k++) {
        PyObject *pair = column_capsules(&cols[k], names[k], n);
        if (pair == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, k, pair);
    }
    return list;
}

static PyObject *scan(PyObject *module, PyObject *arg) {
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    Scan *s = calloc(1, sizeof(Scan));
    if (s == NULL) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    int rc = OK;
    for (int k = 0; k < E_COLUMNS && rc == OK; k++) rc = col_init(&s->events[k], EVENT_KINDS[k]);
    for (int k = 0; k < F_COLUMNS && rc == OK; k++) rc = col_init(&s->flows[k], FLOW_KINDS[k]);
    s->start = s->p = (const unsigned char *)view.buf;
    s->end = s->start + view.len;
    /* the GIL is kept: PyOS_string_to_double needs it */
    if (rc == OK) rc = scan_array(s);
    PyObject *result = NULL;
    if (rc == NOMEM) {
        PyErr_NoMemory();
    } else if (rc == DECLINE) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *events = table_capsules(s->events, EVENT_NAMES, E_COLUMNS, s->n_events);
        PyObject *flows = NULL;
        if (events != NULL) {
            flows = s->n_flows ? table_capsules(s->flows, FLOW_NAMES, F_COLUMNS, s->n_flows)
                               : Py_NewRef(Py_None);
        }
        PyObject *spans = flows ? PyBytes_FromStringAndSize(s->spans.data ? s->spans.data : "",
                                                            s->spans.len)
                                : NULL;
        if (spans != NULL) {
            result = Py_BuildValue("(NNN)", events, flows, spans);
        } else {
            Py_XDECREF(events);
            Py_XDECREF(flows);
        }
    }
    for (int k = 0; k < E_COLUMNS; k++) col_free(&s->events[k]);
    for (int k = 0; k < F_COLUMNS; k++) col_free(&s->flows[k]);
    buf_free(&s->spans);
    for (int k = 0; k < 3; k++) buf_free(&s->texts[k]);
    free(s);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *keep_spare(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    pthread_mutex_lock(&spare_lock);
    spare_keepers++;
    pthread_mutex_unlock(&spare_lock);
    Py_RETURN_NONE;
}

/* One load keeps spares no more; with none left keeping them, the spare blocks go back to
   the system. The bytes given back. */
static PyObject *release_spare(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    Py_ssize_t released = 0;
    pthread_mutex_lock(&spare_lock);
    if (spare_keepers > 0) spare_keepers--;
    for (int k = 0; spare_keepers == 0 && k < SPARE_SIZES; k++) {
        while (spare_lists[k] != NULL) {
            void *block = spare_lists[k];
            spare_lists[k] = *(void **)block;
            munmap(block, (size_t)1 << k);
            released += (Py_ssize_t)1 << k;
        }
    }
    spare_bytes -= released;
    pthread_mutex_unlock(&spare_lock);
    return PyLong_FromSsize_t(released);
}

static PyObject *spare(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    pthread_mutex_lock(&spare_lock);
    Py_ssize_t held = spare_bytes;
    pthread_mutex_unlock(&spare_lock);
    return PyLong_FromSsize_t(held);
}

static PyMethodDef METHODS[] = {
    {"scan", scan, METH_O,
     "scan(text) -> None (declined) or (event columns, flow columns or None, M-event "
     "spans): each column a pair of Arrow PyCapsules (schema, array), spans int64 pairs"},
    {"keep_spare", keep_spare, METH_NOARGS,
     "keep_spare() -> None: column blocks freed from now on are kept for reuse (up to 32 "
     "MiB) until the matching release_spare()"},
    {"release_spare", release_spare, METH_NOARGS,
     "release_spare() -> bytes of spare column blocks given back to the system (all of "
     "them once no keep_spare() is left unmatched)"},
    {"spare", spare, METH_NOARGS, "spare() -> bytes of spare column blocks held"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {
    PyModuleDef_HEAD_INIT, "_event_scan", NULL, -1, METHODS, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__event_scan(void) {
    plain_bytes();
    return PyModule_Create(&MODULE);
}
