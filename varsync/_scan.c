/* varsync._scan: the loops of element patches (varsync/_elements.py) that touch every
 * element, or every changed one: the scan for changed elements, the gap varints and
 * bitmaps both ways, and apply's writes in place.
 *
 * The exact scan of an element patch (varsync/_elements.py): numpy's comparison is at
 * copy speed, but np.flatnonzero over its mask costs about 12 ns per changed element
 * (a branch per element that the CPU cannot predict at 1 % changed), which made the
 * scan 1.6 x a copy of the leaf. Here 32 bytes of each buffer are XORed at a time;
 * only a group that differs is looked into, without branches: each of its elements'
 * positions is stored and the count advanced by whether it differs. 200 MB of bf16 with
 * 1 % changed at random: 14 ms on two threads, 0.82 x a copy of the leaf (numpy's scan
 * 25 ms; benchmarks/RESULTS.md, section 12).
 *
 * The gaps between those positions are a patch's usual form, LEB128 varints: numpy
 * encoded them at about 19 ns per position, which made a push at 3 % changed slower
 * than a whole one; here one or two bytes are written without a branch. Denser patches
 * are a bitmap. A reader decodes either (ungaps, unbits: every field of a patch from
 * the wire checked as it is read) and writes the new values in place, keeping the old
 * ones to undo a patch that does not verify (swap): numpy's gathers and scatters took
 * about 10 ns per element each, its bitmap decoding 2 ns per element of the leaf.
 *
 * Built by setuptools where a C compiler is (setup.py, optional): without it varsync
 * scans and encodes with numpy, to the same bytes. Only the buffer protocol is used, so
 * one build serves numpy 1 and 2. The GIL is released while scanning: the caller's
 * threads scan runs of blocks side by side.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define GROUP 32 /* bytes compared before looking at elements: four 64-bit words */

static inline uint64_t load(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v); /* one unaligned load; no alignment is assumed */
    return v;
}

/* Whether lane `l` (of `lanes` in a word, `bits` wide) of the XOR `x` is nonzero: the
 * lane of element `l` in memory order, whatever the byte order. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define LANE(x, l, lanes, bits, mask) ((((x) >> ((((lanes) - 1 - (l)) * (bits)) % 64)) & (mask)) != 0)
#else
#define LANE(x, l, lanes, bits, mask) ((((x) >> (((l) * (bits)) % 64)) & (mask)) != 0)
#endif

/* Elements of W bytes (1, 2, 4 or 8): writes the positions of those that differ to
 * `out` and returns how many, or -1 once more than `most` differ. `out` holds `most` +
 * GROUP positions: a group's positions are stored before the count is checked. */
#define DEFINE_SCAN(W)                                                                   \
    static Py_ssize_t scan_##W(const unsigned char *a, const unsigned char *b,           \
                               Py_ssize_t n, int64_t *out, Py_ssize_t most)              \
    {                                                                                    \
        const int lanes = 8 / (W), bits = 8 * (W);                                       \
        const uint64_t mask = (W) == 8 ? ~(uint64_t)0 : (((uint64_t)1 << ((bits) % 64)) - 1); \
        const Py_ssize_t per = GROUP / (W), groups = n / per;                            \
        Py_ssize_t k = 0;                                                                \
        for (Py_ssize_t g = 0; g < groups; g++) {                                        \
            const unsigned char *pa = a + g * GROUP, *pb = b + g * GROUP;                \
            uint64_t x[4] = {load(pa) ^ load(pb), load(pa + 8) ^ load(pb + 8),           \
                             load(pa + 16) ^ load(pb + 16), load(pa + 24) ^ load(pb + 24)}; \
            if ((x[0] | x[1] | x[2] | x[3]) == 0)                                        \
                continue;                                                                \
            const int64_t base = (int64_t)(g * per);                                     \
            for (int q = 0; q < 4; q++) {                                                \
                for (int l = 0; l < lanes; l++) {                                        \
                    out[k] = base + q * lanes + l;                                       \
                    k += LANE(x[q], l, lanes, bits, mask);                               \
                }                                                                        \
            }                                                                            \
            if (k > most)                                                                \
                return -1;                                                               \
        }                                                                                \
        for (Py_ssize_t i = groups * per; i < n; i++) {                                  \
            if (memcmp(a + i * (W), b + i * (W), (W)) != 0) {                            \
                out[k++] = (int64_t)i;                                                   \
                if (k > most)                                                            \
                    return -1;                                                           \
            }                                                                            \
        }                                                                                \
        return k;                                                                        \
    }

DEFINE_SCAN(1)
DEFINE_SCAN(2)
DEFINE_SCAN(4)
DEFINE_SCAN(8)

/* 16-byte elements (complex128, two 8-byte lanes): two per group. */
static Py_ssize_t scan_16(const unsigned char *a, const unsigned char *b, Py_ssize_t n,
                          int64_t *out, Py_ssize_t most)
{
    const Py_ssize_t groups = n / 2;
    Py_ssize_t k = 0;
    for (Py_ssize_t g = 0; g < groups; g++) {
        const unsigned char *pa = a + g * GROUP, *pb = b + g * GROUP;
        uint64_t first = (load(pa) ^ load(pb)) | (load(pa + 8) ^ load(pb + 8));
        uint64_t second = (load(pa + 16) ^ load(pb + 16)) | (load(pa + 24) ^ load(pb + 24));
        if ((first | second) == 0)
            continue;
        out[k] = (int64_t)(2 * g);
        k += first != 0;
        out[k] = (int64_t)(2 * g + 1);
        k += second != 0;
        if (k > most)
            return -1;
    }
    if (n % 2 && memcmp(a + (n - 1) * 16, b + (n - 1) * 16, 16) != 0) {
        out[k++] = (int64_t)(n - 1);
        if (k > most)
            return -1;
    }
    return k;
}

/* The end of every function here: release the buffers it took (up to four; NULL for
 * none), then raise ValueError(error) if there is one, else return `count` (or None
 * where `counted` is 0). */
static PyObject *reply(const char *error, Py_ssize_t count, int counted, Py_buffer *a,
                       Py_buffer *b, Py_buffer *c, Py_buffer *d)
{
    Py_buffer *views[] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if (views[i] != NULL)
            PyBuffer_Release(views[i]);
    if (error != NULL) {
        PyErr_SetString(PyExc_ValueError, error);
        return NULL;
    }
    if (counted)
        return PyLong_FromSsize_t(count);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(changed_doc,
"changed(old, new, width, out, most) -> int\n\n"
"Write the positions of the elements of `width` bytes (1, 2, 4, 8 or 16) that differ\n"
"bitwise between the equal-length buffers `old` and `new` into the writable buffer\n"
"`out` (int64, room for `most` + 32 positions, in native byte order), in ascending\n"
"order; return how many, or -1 once more than `most` differ.");

static PyObject *changed(PyObject *self, PyObject *args)
{
    Py_buffer old, new, out;
    int width;
    Py_ssize_t most, found = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*iw*n", &old, &new, &width, &out, &most))
        return NULL;
    const char *error = NULL;
    if (old.len != new.len)
        error = "old and new differ in length";
    else if (width != 1 && width != 2 && width != 4 && width != 8 && width != 16)
        error = "width must be 1, 2, 4, 8 or 16";
    else if (old.len % width != 0)
        error = "the buffers' length is not a multiple of width";
    else if (most < 0)
        error = "most must be at least 0";
    if (error == NULL && most > old.len / width)
        most = old.len / width; /* never more than every element */
    if (error == NULL && out.len / (Py_ssize_t)sizeof(int64_t) < most + GROUP)
        error = "out has no room for most + 32 positions";
    if (error != NULL)
        return reply(error, 0, 0, &old, &new, &out, NULL);
    const unsigned char *a = old.buf, *b = new.buf;
    int64_t *positions = out.buf;
    Py_ssize_t n = old.len / width;
    Py_BEGIN_ALLOW_THREADS
    switch (width) {
    case 1: found = scan_1(a, b, n, positions, most); break;
    case 2: found = scan_2(a, b, n, positions, most); break;
    case 4: found = scan_4(a, b, n, positions, most); break;
    case 8: found = scan_8(a, b, n, positions, most); break;
    default: found = scan_16(a, b, n, positions, most); break;
    }
    Py_END_ALLOW_THREADS
    return reply(NULL, found, 1, &old, &new, &out, NULL);
}

PyDoc_STRVAR(gaps_doc,
"gaps(positions, out) -> int\n\n"
"Write the gaps between the strictly ascending int64 `positions` (the first one's from\n"
"-1, each less one) as LEB128 varints into the writable buffer `out`; return the bytes\n"
"written. ValueError if the positions do not ascend or `out` is too small.");

static PyObject *gaps(PyObject *self, PyObject *args)
{
    Py_buffer given, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*", &given, &out))
        return NULL;
    const char *error = NULL;
    Py_ssize_t k = 0;
    if (given.len % (Py_ssize_t)sizeof(int64_t) != 0) {
        error = "positions are not whole int64s";
    } else {
        const unsigned char *p = given.buf;
        unsigned char *o = out.buf;
        const Py_ssize_t n = given.len / (Py_ssize_t)sizeof(int64_t), room = out.len;
        int64_t previous = -1;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t position;
            memcpy(&position, p + i * sizeof position, sizeof position);
            if (position <= previous) {
                error = "positions do not ascend";
                break;
            }
            uint64_t gap = (uint64_t)position - (uint64_t)previous - 1;
            previous = position;
            if (gap < 16384 && k + 2 <= room) {
                /* one or two bytes, without a branch on which (at 1 % changed at random
                   over a quarter of the gaps take two): the second is written either
                   way, and the next varint starts on it when it is not this one's */
                const int two = gap >= 128;
                o[k] = (unsigned char)((gap & 0x7F) | (two << 7));
                o[k + 1] = (unsigned char)(gap >> 7);
                k += 1 + two;
                continue;
            }
            do {
                if (k >= room) {
                    error = "out is too small for the varints";
                    break;
                }
                unsigned char byte = gap & 0x7F;
                gap >>= 7;
                o[k++] = byte | (gap ? 0x80 : 0);
            } while (gap);
            if (error != NULL)
                break;
        }
        Py_END_ALLOW_THREADS
    }
    return reply(error, k, 1, &given, &out, NULL, NULL);
}

PyDoc_STRVAR(ungaps_doc,
"ungaps(data, changed, count, out) -> None\n\n"
"Decode `changed` LEB128 gap varints from `data` (gaps()'s form) into int64 positions\n"
"in the writable buffer `out` (room for `changed`). ValueError unless `data` holds\n"
"exactly `changed` complete varints of at most 9 bytes whose positions stay below\n"
"`count`: a patch from the wire is never trusted.");

static PyObject *ungaps(PyObject *self, PyObject *args)
{
    Py_buffer data, out;
    Py_ssize_t changed, count;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnw*", &data, &changed, &count, &out))
        return NULL;
    const char *error = NULL;
    if (changed < 0 || count < 0)
        error = "changed and count must be at least 0";
    else if (out.len / (Py_ssize_t)sizeof(int64_t) < changed)
        error = "out has no room for the positions";
    else {
        const unsigned char *d = data.buf;
        unsigned char *o = out.buf;
        const Py_ssize_t size = data.len;
        Py_ssize_t k = 0;
        uint64_t next = 0; /* the least the next position can be */
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < changed; i++) {
            uint64_t gap = 0;
            int shift = 0;
            for (;;) {
                if (k >= size) {
                    error = "the gaps end inside a varint or before the last";
                    break;
                }
                const unsigned char byte = d[k++];
                gap |= (uint64_t)(byte & 0x7F) << shift;
                if (!(byte & 0x80))
                    break;
                shift += 7;
                if (shift > 56) { /* a tenth byte: gaps() writes at most nine */
                    error = "a gap varint over 9 bytes";
                    break;
                }
            }
            if (error != NULL)
                break;
            if (gap >= (uint64_t)count || next + gap >= (uint64_t)count) {
                error = "a position past the last element";
                break;
            }
            const int64_t position = (int64_t)(next + gap);
            memcpy(o + i * sizeof position, &position, sizeof position);
            next = (uint64_t)position + 1;
        }
        if (error == NULL && k != size)
            error = "bytes left after the last gap";
        Py_END_ALLOW_THREADS
    }
    return reply(error, 0, 0, &data, &out, NULL, NULL);
}

PyDoc_STRVAR(swap_doc,
"swap(target, positions, values, width, saved) -> None\n\n"
"For each i, copy element positions[i] (int64) of `target` (elements of `width` bytes:\n"
"1, 2, 4, 8 or 16) into element i of `saved`, then element i of `values` into it: a\n"
"patch's values written in place, what they overwrote kept to undo it (swap again with\n"
"the saved values). ValueError if a position is outside `target` or a buffer's length\n"
"does not fit; checked before anything is written.");

#define SWAP_LOOP(W)                                                                     \
    for (Py_ssize_t i = 0; i < n; i++) {                                                 \
        int64_t p;                                                                       \
        memcpy(&p, pos + i * sizeof p, sizeof p);                                        \
        memcpy(s + i * (W), t + p * (W), (W));                                           \
        memcpy(t + p * (W), v + i * (W), (W));                                           \
    }

static PyObject *swap(PyObject *self, PyObject *args)
{
    Py_buffer target, positions, values, saved;
    int width;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*y*iw*", &target, &positions, &values, &width, &saved))
        return NULL;
    const char *error = NULL;
    const Py_ssize_t n = positions.len / (Py_ssize_t)sizeof(int64_t);
    if (width != 1 && width != 2 && width != 4 && width != 8 && width != 16)
        error = "width must be 1, 2, 4, 8 or 16";
    else if (positions.len % (Py_ssize_t)sizeof(int64_t) != 0)
        error = "positions are not whole int64s";
    else if (target.len % width != 0)
        error = "target's length is not a multiple of width";
    else if (values.len != n * width || saved.len != n * width)
        error = "values and saved must hold one element per position";
    else {
        const unsigned char *pos = positions.buf;
        const int64_t elements = target.len / width;
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t p;
            memcpy(&p, pos + i * sizeof p, sizeof p);
            if (p < 0 || p >= elements) {
                error = "a position outside target";
                break;
            }
        }
    }
    if (error == NULL) {
        unsigned char *t = target.buf, *s = saved.buf;
        const unsigned char *pos = positions.buf, *v = values.buf;
        Py_BEGIN_ALLOW_THREADS
        switch (width) {
        case 1: SWAP_LOOP(1) break;
        case 2: SWAP_LOOP(2) break;
        case 4: SWAP_LOOP(4) break;
        case 8: SWAP_LOOP(8) break;
        default: SWAP_LOOP(16) break;
        }
        Py_END_ALLOW_THREADS
    }
    return reply(error, 0, 0, &target, &positions, &values, &saved);
}

/* The 8 bytes at p as a word whose bit b is bit b % 8 of byte b / 8 (numpy's
 * packbits(bitorder="little")), whatever the machine's byte order. */
static inline uint64_t little_word(const unsigned char *p)
{
    uint64_t w = 0;
    for (int i = 7; i >= 0; i--)
        w = (w << 8) | p[i];
    return w;
}

static inline int lowest_bit(uint64_t w) /* w != 0 */
{
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(w);
#else
    int b = 0;
    while (!(w & 1)) {
        w >>= 1;
        b++;
    }
    return b;
#endif
}

PyDoc_STRVAR(unbits_doc,
"unbits(bitmap, changed, count, out) -> None\n\n"
"The positions of the set bits of a bitmap of `count` elements (numpy's\n"
"packbits(bitorder='little')) as int64 into the writable buffer `out` (room for\n"
"`changed`). ValueError unless the bitmap is (count + 7) // 8 bytes with no bit set\n"
"past the last element and exactly `changed` bits set.");

static PyObject *unbits(PyObject *self, PyObject *args)
{
    Py_buffer bitmap, out;
    Py_ssize_t count, changed;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnw*", &bitmap, &changed, &count, &out))
        return NULL;
    const char *error = NULL;
    if (count < 0 || changed < 0)
        error = "count and changed must be at least 0";
    else if (bitmap.len != count / 8 + (count % 8 != 0))
        error = "the bitmap is not (count + 7) // 8 bytes";
    else if (out.len / (Py_ssize_t)sizeof(int64_t) < changed)
        error = "out has no room for the positions";
    else if (count % 8 && ((const unsigned char *)bitmap.buf)[bitmap.len - 1] >> (count % 8))
        error = "bits set past the last element";
    else {
        const unsigned char *b = bitmap.buf;
        unsigned char *o = out.buf;
        const Py_ssize_t size = bitmap.len, words = size / 8;
        Py_ssize_t k = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t w = 0; w <= words && error == NULL; w++) {
            uint64_t word;
            if (w < words) {
                word = little_word(b + 8 * w);
            } else { /* the last bytes, fewer than 8 */
                word = 0;
                for (Py_ssize_t i = size - 1; i >= 8 * words; i--)
                    word = (word << 8) | b[i];
            }
            while (word) {
                if (k >= changed) {
                    error = "more bits set than the header's changed elements";
                    break;
                }
                const int64_t position = (int64_t)(64 * w + lowest_bit(word));
                memcpy(o + k * sizeof position, &position, sizeof position);
                k++;
                word &= word - 1;
            }
        }
        if (error == NULL && k != changed)
            error = "fewer bits set than the header's changed elements";
        Py_END_ALLOW_THREADS
    }
    return reply(error, 0, 0, &bitmap, &out, NULL, NULL);
}

PyDoc_STRVAR(bits_doc,
"bits(positions, out) -> None\n\n"
"Set the bits of the int64 `positions` in the zeroed writable bitmap `out` (numpy's\n"
"packbits(bitorder='little') form). ValueError if a position is outside it.");

static PyObject *bits(PyObject *self, PyObject *args)
{
    Py_buffer given, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*", &given, &out))
        return NULL;
    const char *error = NULL;
    if (given.len % (Py_ssize_t)sizeof(int64_t) != 0) {
        error = "positions are not whole int64s";
    } else {
        const unsigned char *p = given.buf;
        unsigned char *o = out.buf;
        const Py_ssize_t n = given.len / (Py_ssize_t)sizeof(int64_t);
        const int64_t room = (int64_t)out.len * 8;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            int64_t position;
            memcpy(&position, p + i * sizeof position, sizeof position);
            if (position < 0 || position >= room) {
                error = "a position outside the bitmap";
                break;
            }
            o[position >> 3] |= (unsigned char)(1u << (position & 7));
        }
        Py_END_ALLOW_THREADS
    }
    return reply(error, 0, 0, &given, &out, NULL, NULL);
}

static PyMethodDef methods[] = {
    {"unbits", unbits, METH_VARARGS, unbits_doc},
    {"bits", bits, METH_VARARGS, bits_doc},
    {"ungaps", ungaps, METH_VARARGS, ungaps_doc},
    {"swap", swap, METH_VARARGS, swap_doc},
    {"changed", changed, METH_VARARGS, changed_doc},
    {"gaps", gaps, METH_VARARGS, gaps_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "varsync._scan",
    "The compiled loops of element patches (varsync/_scan.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__scan(void)
{
    return PyModule_Create(&module);
}
