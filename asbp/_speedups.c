/*
 * asbp._speedups: an optional C accelerator for asbp.codec.decode.
 *
 * One function, decode_fast(frame, max_frame_bytes, max_header_bytes,
 * max_keys, max_list_items), returns (header, body) for the frames it is
 * sure about and None for every other frame. asbp.codec.decode builds the
 * Command from (header, body) with _trusted(); on None the pure-Python fast
 * path and then the reference path (_decode_reference) decide, so every
 * refusal, fault code and offset still comes from the reference.
 *
 * The invariant, checked by tests/asbp/test_speedups.py with Hypothesis:
 * whatever this accepts, _decode_reference accepts with the same header
 * (same keys in the same order, str values or tuples of str) and the same
 * body. It is a subset of the reference, never a second opinion.
 *
 * What it accepts, and nothing else (the grammar is in asbp/grammar.py):
 *
 *   frame   exact bytes, at most max_frame_bytes long;
 *   header  ASCII, no leading "+" (the UTF-8 marker), at most
 *           max_header_bytes before the ";" that ends it, at most max_keys
 *           pairs, no key twice;
 *   pair    key "=" value, the key a bare token (a quoted key is refused);
 *   value   a token, or "[" token *("," token) "]" with 1..max_list_items
 *           items (the empty list, valid for some keys, is left to Python);
 *   token   bare: 1* of 0x21-0x7E except ; = , ' [ ] +
 *           quoted: "'" 1* of any byte below 0x80 except ', CR and LF "'"
 *           (the empty quoted token, valid for some keys, is left to
 *           Python; a ";" inside quotes is read as text, as the reference
 *           reads it);
 *   reserved keys (asbp/header.py, draft section 1.3.4.2):
 *           a b c x  one value (never a list), non-empty;
 *           g        one or more non-empty values, a single token or a list;
 *           d        one or more Channel-Identifiers, 32 lowercase hex each;
 *           i s      one Channel/Subject-Identifier, 32 lowercase hex;
 *           u        one integer 0..65535 without leading zeros;
 *           p        one Conversation-Address local*domain, ASCII: printable
 *                    (0x21-0x7E) but "'", one "*" with text on both sides;
 *           r        one or more such addresses, a single token or a list
 *                    (every Command that crosses a Course carries both);
 *           e f m o t z  rare, with costlier rules: left to Python.
 *   Any other key (longer keys, other letters) takes any value above.
 *
 * Every token here is non-empty, so the "non-empty" rules hold by
 * construction. Anything else (a "+" header, a byte >= 0x80 before the
 * header's end, CR or LF in quotes, a limit reached, a duplicate key, a
 * grammar error, the wrong type of frame) returns None: "not sure".
 *
 * Safety: the scanner reads buf[pos] only after checking pos < end, where
 * end <= len(frame); no pointer is formed past the buffer. The bytes object
 * is immutable and held by the caller for the whole call (no Python code runs
 * in between), so the buffer cannot change under the scan. Objects are made
 * only once their bytes are validated; every path out releases what it holds
 * (see the labels at the end of decode_fast). There is no module state. It
 * raises only for wrong argument types or counts (TypeError) and for
 * allocation failures (MemoryError), never because of what a frame holds.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* How decode_fast treats a key's values. */
typedef enum {
    KEY_ANY,        /* unknown keys, and g: any non-empty token, lists too */
    KEY_TEXT,       /* a b c x: one token, never a list */
    KEY_ID,         /* i s: one token of 32 lowercase hex digits */
    KEY_IDS,        /* d: one or more such tokens */
    KEY_COMMAND_ID, /* u: one integer 0..65535 without leading zeros */
    KEY_ADDRESS,    /* p: one Conversation-Address */
    KEY_ADDRESSES,  /* r: one or more of them */
    KEY_RARE        /* e f m o t z: left to Python */
} key_kind;

static key_kind
classify(const unsigned char *key, Py_ssize_t size)
{
    if (size != 1) {
        return KEY_ANY; /* every reserved key is one letter */
    }
    switch (key[0]) {
    case 'a': case 'b': case 'c': case 'x':
        return KEY_TEXT;
    case 'd':
        return KEY_IDS;
    case 'i': case 's':
        return KEY_ID;
    case 'u':
        return KEY_COMMAND_ID;
    case 'p':
        return KEY_ADDRESS;
    case 'r':
        return KEY_ADDRESSES;
    case 'e': case 'f': case 'm': case 'o': case 't': case 'z':
        return KEY_RARE;
    default:
        return KEY_ANY; /* g, and letters the draft does not reserve */
    }
}

/* A byte a bare token may hold: printable ASCII, no reserved character. */
static int
is_bare(unsigned char c)
{
    return c >= 0x21 && c <= 0x7E && c != ';' && c != '=' && c != ','
           && c != '\'' && c != '[' && c != ']' && c != '+';
}

static int
is_uuid_hex(const unsigned char *text, Py_ssize_t size)
{
    Py_ssize_t k;
    if (size != 32) {
        return 0;
    }
    for (k = 0; k < size; k++) {
        unsigned char c = text[k];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
            return 0;
        }
    }
    return 1;
}

static int
is_command_id(const unsigned char *text, Py_ssize_t size)
{
    Py_ssize_t k;
    long value = 0;
    if (size < 1 || size > 5 || (size > 1 && text[0] == '0')) {
        return 0;
    }
    for (k = 0; k < size; k++) {
        if (text[k] < '0' || text[k] > '9') {
            return 0;
        }
        value = value * 10 + (text[k] - '0');
    }
    return value <= 65535;
}

/*
 * asbp/header.py's _ADDRESS on ASCII text: one "*" between two non-empty
 * parts that hold no "*", no "'", no whitespace and no controls, which on
 * ASCII leaves 0x21-0x7E but "*" and "'". Other bytes never get here (a
 * token holds none at or above 0x80), and the same rule holds inside quotes.
 */
static int
is_address(const unsigned char *text, Py_ssize_t size)
{
    Py_ssize_t k, star = -1;
    for (k = 0; k < size; k++) {
        unsigned char c = text[k];
        if (c < 0x21 || c > 0x7E || c == '\'') {
            return 0;
        }
        if (c == '*') {
            if (star >= 0) {
                return 0;
            }
            star = k;
        }
    }
    return star > 0 && star < size - 1;
}

static int
value_ok(key_kind kind, const unsigned char *text, Py_ssize_t size)
{
    switch (kind) {
    case KEY_ADDRESS:
    case KEY_ADDRESSES:
        return is_address(text, size);
    case KEY_ID:
    case KEY_IDS:
        return is_uuid_hex(text, size);
    case KEY_COMMAND_ID:
        return is_command_id(text, size);
    default:
        return 1;
    }
}

/*
 * Reads the token at *pos, reading no byte at or past end. On success,
 * stores where its text starts (inside the quotes for a quoted token) and
 * its size, moves *pos past it and returns 1. Returns 0, leaving *pos as it
 * was, for anything else: an empty token, CR, LF or a byte >= 0x80 inside
 * quotes, or quotes not closed before end.
 */
static int
scan_token(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos,
           Py_ssize_t *start, Py_ssize_t *size)
{
    Py_ssize_t p = *pos;
    Py_ssize_t first;
    if (p < end && buf[p] == '\'') {
        first = ++p;
        while (p < end && buf[p] != '\'') {
            if (buf[p] == '\r' || buf[p] == '\n' || buf[p] >= 0x80) {
                return 0;
            }
            p++;
        }
        if (p >= end || p == first) {
            return 0; /* never closed, or '' */
        }
        *start = first;
        *size = p - first;
        *pos = p + 1;
        return 1;
    }
    first = p;
    while (p < end && is_bare(buf[p])) {
        p++;
    }
    if (p == first) {
        return 0;
    }
    *start = first;
    *size = p - first;
    *pos = p;
    return 1;
}

static PyObject *
ascii_text(const unsigned char *buf, Py_ssize_t start, Py_ssize_t size)
{
    /* Only bytes below 0x80 get here, so this never fails but for memory. */
    return PyUnicode_DecodeASCII((const char *)buf + start, size, NULL);
}

/*
 * Converts a limit, which must be an int. Limits has no upper bound, so an
 * int too large for Py_ssize_t is read as PY_SSIZE_T_MAX (no frame is that
 * long); a negative one (Limits refuses them) as -1, which refuses all.
 */
static int
read_limit(PyObject *obj, Py_ssize_t *limit)
{
    int overflow;
    long long value;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "limits must be int, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow > 0 || value > (long long)PY_SSIZE_T_MAX) {
        *limit = PY_SSIZE_T_MAX;
    }
    else if (overflow < 0 || value < 0) {
        *limit = -1;
    }
    else {
        *limit = (Py_ssize_t)value;
    }
    return 0;
}

PyDoc_STRVAR(decode_fast_doc,
"decode_fast($module, frame, max_frame_bytes, max_header_bytes, max_keys,\n"
"            max_list_items, /)\n"
"--\n"
"\n"
"Return (header, body) as asbp.codec's reference decoder reads frame, or\n"
"None when not sure (the frame may be valid or not).\n"
"\n"
"Never raises because of what the frame holds; a frame that is not exactly\n"
"bytes gives None. Raises TypeError for a wrong number of arguments or a\n"
"limit that is not an int.");

static PyObject *
decode_fast(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t max_frame_bytes, max_header_bytes, max_keys, max_list_items;
    const unsigned char *buf;
    Py_ssize_t size, end, pos, keys, dict_size;
    PyObject *header = NULL, *key = NULL, *value = NULL, *body = NULL;
    PyObject *result;

    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "decode_fast() takes exactly 5 positional arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (read_limit(args[1], &max_frame_bytes) < 0
        || read_limit(args[2], &max_header_bytes) < 0
        || read_limit(args[3], &max_keys) < 0
        || read_limit(args[4], &max_list_items) < 0) {
        return NULL;
    }
    if (!PyBytes_CheckExact(args[0])) {
        Py_RETURN_NONE; /* bytearray, memoryview, subclasses, wrong types */
    }
    buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    size = PyBytes_GET_SIZE(args[0]);
    if (size > max_frame_bytes || size == 0 || buf[0] == '+') {
        Py_RETURN_NONE;
    }
    /* The header's ";" may sit at index max_header_bytes at most: nothing
       past it is ever read. max_header_bytes < size keeps the sum small. */
    end = max_header_bytes < size ? max_header_bytes + 1 : size;

    header = PyDict_New();
    if (header == NULL) {
        return NULL;
    }
    pos = 0;
    keys = 0;
    for (;;) {
        Py_ssize_t key_start = pos, key_size, start, text_size;
        key_kind kind;

        while (pos < end && is_bare(buf[pos])) {
            pos++;
        }
        key_size = pos - key_start;
        if (key_size == 0 || pos >= end || buf[pos] != '=') {
            goto not_sure;
        }
        pos++;
        kind = classify(buf + key_start, key_size);
        if (kind == KEY_RARE || ++keys > max_keys) {
            goto not_sure;
        }

        if (pos < end && buf[pos] == '[') {
            Py_ssize_t p, items, k;
            if (kind != KEY_ANY && kind != KEY_IDS && kind != KEY_ADDRESSES) {
                goto not_sure; /* a list where one value goes */
            }
            /* First pass: check the whole list and count its items. */
            p = pos + 1;
            items = 0;
            for (;;) {
                if (!scan_token(buf, end, &p, &start, &text_size)
                    || !value_ok(kind, buf + start, text_size)
                    || ++items > max_list_items
                    || p >= end) {
                    goto not_sure;
                }
                if (buf[p] == ']') {
                    break;
                }
                if (buf[p] != ',') {
                    goto not_sure;
                }
                p++;
            }
            /* Second pass over the same checked bytes: build the tuple. */
            value = PyTuple_New(items);
            if (value == NULL) {
                goto error;
            }
            p = pos + 1;
            for (k = 0; k < items; k++) {
                PyObject *item;
                if (!scan_token(buf, end, &p, &start, &text_size)) {
                    goto not_sure; /* unreachable: the first pass read these */
                }
                item = ascii_text(buf, start, text_size);
                if (item == NULL) {
                    goto error;
                }
                PyTuple_SET_ITEM(value, k, item); /* steals item */
                p++; /* the "," or "]" the first pass found */
            }
            pos = p;
        }
        else {
            if (!scan_token(buf, end, &pos, &start, &text_size)
                || !value_ok(kind, buf + start, text_size)) {
                goto not_sure;
            }
            value = ascii_text(buf, start, text_size);
            if (value == NULL) {
                goto error;
            }
        }

        key = ascii_text(buf, key_start, key_size);
        if (key == NULL) {
            goto error;
        }
        dict_size = PyDict_GET_SIZE(header);
        if (PyDict_SetItem(header, key, value) < 0) {
            goto error;
        }
        Py_CLEAR(key);
        Py_CLEAR(value);
        if (PyDict_GET_SIZE(header) == dict_size) {
            goto not_sure; /* a duplicate key replaced a value */
        }

        if (pos >= end) {
            goto not_sure; /* no ";" within the header limit */
        }
        if (buf[pos] == ';') {
            break;
        }
        if (buf[pos] != ',') {
            goto not_sure;
        }
        pos++;
    }

    /* pos < end <= size, so the body (possibly empty) lies inside the frame. */
    body = PyBytes_FromStringAndSize((const char *)buf + pos + 1, size - pos - 1);
    if (body == NULL) {
        goto error;
    }
    result = PyTuple_New(2);
    if (result == NULL) {
        goto error;
    }
    PyTuple_SET_ITEM(result, 0, header); /* steals both */
    PyTuple_SET_ITEM(result, 1, body);
    return result;

not_sure:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_DECREF(header);
    Py_RETURN_NONE;

error:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(body);
    Py_DECREF(header);
    return NULL;
}

static PyMethodDef speedups_methods[] = {
    {"decode_fast", (PyCFunction)(void (*)(void))decode_fast, METH_FASTCALL,
     decode_fast_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot speedups_slots[] = {
    {0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asbp._speedups",
    .m_doc = "An optional C accelerator for asbp.codec.decode (see decode_fast).",
    .m_size = 0,
    .m_methods = speedups_methods,
    .m_slots = speedups_slots,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
