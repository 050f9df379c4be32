/* The exposition fast path's tokenizer: one pass over a dcgm-exporter / Prometheus text file.
 *
 * Each line is split as gpu_pipeline.lib.ingest.formats.exposition._scan splits it with Polars'
 * CSV reader (separator '}', no quoting, ragged lines truncated): the series is the text before
 * the first '}' (the whole line when there is none; empty: none), the rest is the text after it
 * up to a second '}' or the end (empty: none), split at spaces as `str.splitn(" ", 3)` splits:
 * the value is the second field, the timestamp the third. Distinct series get codes (a hash
 * table; each distinct series' bytes copied into it once); values and timestamps are parsed where the text
 * is plain (a decimal within the exactly-rounded range, nan / inf, an integer of up to 18 digits)
 * and listed otherwise, for the caller to cast with Polars: every number equals Polars' cast.
 *
 * The file is cut in `threads` parts at line ends, each part scanned by its own thread with its
 * own table; the parts' codes are merged in file order when the caller fills its arrays.
 * Built by `make install` (see gpu_pipeline/native/__init__.py); no Python API is used.
 */
#include <math.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* the interface's version: gpu_pipeline/native/__init__.py loads only a library that says this
 * (one built from an older exposition.c is not used, the parse takes its Polars path) */
#define EXPO_VERSION 3
int expo_version(void) { return EXPO_VERSION; }

#define NONE UINT32_MAX
#define RELEASE_EVERY (16 << 20)
enum { NO_SERIES = 1, LEAD = 2, HAS_TS = 4, VALUE = 8, TS = 16 };

/* a distinct series: its bytes at `off` in its table's arena (a copy: the file's pages can go) */
typedef struct { int64_t off; int64_t len; uint64_t hash; } series_t;
typedef struct { int64_t line; int64_t off; int64_t len; } token_t;

typedef struct {
    series_t *items; int64_t n, cap;
    uint32_t *slots; uint64_t mask;   /* index + 1; 0: empty */
    char *arena; int64_t used, room;  /* the series' bytes, one after another */
} table_t;

/* each part on cache lines of its own: two threads writing one line would take turns at it */
typedef struct {
    _Alignas(128) const char *buf; int64_t start, end;  /* the part: whole lines */
    int release;  /* buf maps a file: hand back its pages once read (see expo_scan) */
    int64_t n, cap;
    uint32_t *code; double *value; int64_t *ts; uint8_t *flags;
    token_t *odd_v; int64_t n_odd_v, cap_odd_v;
    token_t *odd_t; int64_t n_odd_t, cap_odd_t;
    table_t table;
    uint64_t bits;  /* every byte of the part OR-ed */
    int failed;
    char pad[128];
} part_t;

typedef struct {
    const char *buf; int nparts; part_t parts[8];
    table_t *global; uint32_t *remap[8]; int64_t n_lines, n_odd_v, n_odd_t;
    uint64_t bits;
} scan_t;

/* the hash of p[0, n), four words at a time in independent lanes (a chain of multiplies, one
 * per word, would wait on itself); every byte is OR-ed into *bits (non-ASCII shows in the high
 * bits) */
static uint64_t hash_bytes(const char *p, int64_t n, uint64_t *bits) {
    const uint64_t K = 0x9E3779B97F4A7C15ull;
    uint64_t a = K ^ (uint64_t)n, b = 0xBF58476D1CE4E5B9ull, c = 0x94D049BB133111EBull, d = K + 1,
             acc = 0;
    while (n >= 32) {
        uint64_t w[4]; memcpy(w, p, 32);
        acc |= w[0] | w[1] | w[2] | w[3];
        a = (a ^ w[0]) * K; b = (b ^ w[1]) * K; c = (c ^ w[2]) * K; d = (d ^ w[3]) * K;
        a ^= a >> 29; b ^= b >> 29; c ^= c >> 29; d ^= d >> 29;
        p += 32; n -= 32;
    }
    while (n >= 8) {
        uint64_t w; memcpy(&w, p, 8);
        acc |= w;
        a = (a ^ w) * K; a ^= a >> 29;
        p += 8; n -= 8;
    }
    uint64_t w = 0; memcpy(&w, p, (size_t)n);
    acc |= w;
    uint64_t h = (a ^ w) * K;
    h ^= (b * 0xBF58476D1CE4E5B9ull) ^ (c * 0x94D049BB133111EBull) ^ (d * K);
    h ^= h >> 31; h *= 0xBF58476D1CE4E5B9ull; h ^= h >> 29;
    *bits |= acc;
    return h;
}

/* the first '}' or line end in [p, e), else e: one pass where two memchr calls would take two */
static const char *brace_or_nl(const char *p, const char *e) {
#ifdef __SSE2__
    const __m128i nl = _mm_set1_epi8('\n'), br = _mm_set1_epi8('}');
    for (; e - p >= 16; p += 16) {
        __m128i x = _mm_loadu_si128((const __m128i *)p);
        int m = _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(x, nl), _mm_cmpeq_epi8(x, br)));
        if (m) return p + __builtin_ctz((unsigned)m);
    }
#endif
    for (; p < e; p++)
        if (*p == '\n' || *p == '}') return p;
    return e;
}

static int table_init(table_t *t) {
    t->n = 0; t->cap = 1024; t->mask = 2047;
    t->items = malloc(sizeof(series_t) * (size_t)t->cap);
    t->slots = calloc(t->mask + 1, sizeof(uint32_t));
    t->used = 0; t->room = 1 << 18;
    t->arena = malloc((size_t)t->room);
    return t->items && t->slots && t->arena;
}

static void table_free(table_t *t) { free(t->items); free(t->slots); free(t->arena); }

static int table_grow(table_t *t) {
    uint64_t mask = t->mask * 2 + 1;
    uint32_t *slots = calloc(mask + 1, sizeof(uint32_t));
    if (!slots) return 0;
    for (int64_t i = 0; i < t->n; i++) {
        uint64_t s = t->items[i].hash & mask;
        while (slots[s]) s = (s + 1) & mask;
        slots[s] = (uint32_t)(i + 1);
    }
    free(t->slots); t->slots = slots; t->mask = mask;
    return 1;
}

/* the code of series bytes[0, len) (inserted when new); NONE when out of memory */
static uint32_t table_code(table_t *t, const char *bytes, int64_t len, uint64_t h) {
    uint64_t s = h & t->mask;
    for (;;) {
        uint32_t k = t->slots[s];
        if (!k) break;
        series_t *it = &t->items[k - 1];
        if (it->hash == h && it->len == len && memcmp(t->arena + it->off, bytes, (size_t)len) == 0)
            return k - 1;
        s = (s + 1) & t->mask;
    }
    if (t->n >= (int64_t)NONE - 1) return NONE;
    if (t->n == t->cap) {
        series_t *items = realloc(t->items, sizeof(series_t) * (size_t)t->cap * 2);
        if (!items) return NONE;
        t->items = items; t->cap *= 2;
    }
    if (t->used + len > t->room) {
        int64_t room = t->room;
        while (t->used + len > room) room *= 2;
        char *arena = realloc(t->arena, (size_t)room);
        if (!arena) return NONE;
        t->arena = arena; t->room = room;
    }
    memcpy(t->arena + t->used, bytes, (size_t)len);
    t->items[t->n] = (series_t){t->used, len, h};
    t->used += len;
    t->slots[s] = (uint32_t)(t->n + 1);
    t->n++;
    if ((uint64_t)t->n * 2 > t->mask && !table_grow(t)) return NONE;
    return (uint32_t)(t->n - 1);
}

static int push_token(token_t **a, int64_t *n, int64_t *cap, int64_t line, int64_t off, int64_t len) {
    if (*n == *cap) {
        int64_t c = *cap ? *cap * 2 : 64;
        token_t *b = realloc(*a, sizeof(token_t) * (size_t)c);
        if (!b) return 0;
        *a = b; *cap = c;
    }
    (*a)[(*n)++] = (token_t){line, off, len};
    return 1;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

static int lower_eq(const char *p, int64_t n, const char *word) {
    int64_t i = 0;
    for (; i < n && word[i]; i++)
        if ((p[i] | 0x20) != word[i]) return 0;
    return i == n && !word[i];
}

/* 1: *out is Polars' Float64 cast of p[0, n); 0: not plain (the caller asks Polars) */
static int parse_value(const char *p, int64_t n, double *out) {
    const char *e = p + n;
    int neg = 0, signed_ = 0;
    if (p < e && (*p == '+' || *p == '-')) { neg = *p == '-'; signed_ = 1; p++; }
    if (p < e && ((*p | 0x20) == 'n' || (*p | 0x20) == 'i')) {
        /* a signed nan is left to Polars (which NaN it makes is its own) */
        if (!signed_ && lower_eq(p, e - p, "nan")) { *out = NAN; return 1; }
        if (lower_eq(p, e - p, "inf") || lower_eq(p, e - p, "infinity")) {
            *out = neg ? -INFINITY : INFINITY; return 1;
        }
        return 0;
    }
    uint64_t w = 0; int64_t sig = 0, digits = 0, scale = 0;
    while (p < e && *p >= '0' && *p <= '9') {
        digits++;
        if (w || *p != '0') { if (++sig > 19) return 0; w = w * 10 + (uint64_t)(*p - '0'); }
        p++;
    }
    if (p < e && *p == '.') {
        p++;
        while (p < e && *p >= '0' && *p <= '9') {
            digits++; scale--;
            if (w || *p != '0') { if (++sig > 19) return 0; w = w * 10 + (uint64_t)(*p - '0'); }
            p++;
        }
    }
    if (!digits) return 0;
    if (p < e && (*p | 0x20) == 'e') {
        p++;
        int eneg = 0; int64_t x = 0; int xd = 0;
        if (p < e && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        while (p < e && *p >= '0' && *p <= '9') { if (++xd > 4) return 0; x = x * 10 + (*p - '0'); p++; }
        if (!xd) return 0;
        scale += eneg ? -x : x;
    }
    if (p != e) return 0;
    double v;
    if (w == 0) v = 0.0;
    else if (w > (1ull << 53) || scale < -22 || scale > 22) return 0;
    else v = scale < 0 ? (double)w / POW10[-scale] : (double)w * POW10[scale];
    *out = neg ? -v : v;
    return 1;
}

/* 1: *out is Polars' Int64 cast of p[0, n) (plain: an optional sign and up to 18 digits) */
static int parse_ts(const char *p, int64_t n, int64_t *out) {
    const char *e = p + n;
    int neg = 0;
    if (p < e && (*p == '+' || *p == '-')) { neg = *p == '-'; p++; }
    if (p == e || e - p > 18) return 0;
    int64_t x = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9') return 0;
        x = x * 10 + (*p - '0');
    }
    *out = neg ? -x : x;
    return 1;
}

/* room for more lines: at first as many as the part's bytes hold at the mean length of the
 * lines in its first 64 KiB (scrape files repeat their lines), then half as many again */
static int part_reserve(part_t *t) {
    int64_t c = t->cap + t->cap / 2;
    if (!t->cap) {
        int64_t size = t->end - t->start, head = size < 65536 ? size : 65536, lines = 1;
        for (const char *p = t->buf + t->start, *e = p + head; (p = memchr(p, '\n', (size_t)(e - p))); p++)
            lines++;
        c = size / (head / lines + 1) * 9 / 8 + 1024;
    }
    uint32_t *code = realloc(t->code, sizeof(uint32_t) * (size_t)c);
    if (code) t->code = code;
    double *value = realloc(t->value, sizeof(double) * (size_t)c);
    if (value) t->value = value;
    int64_t *ts = realloc(t->ts, sizeof(int64_t) * (size_t)c);
    if (ts) t->ts = ts;
    uint8_t *flags = realloc(t->flags, (size_t)c);
    if (flags) t->flags = flags;
    if (!code || !value || !ts || !flags) return 0;
    t->cap = c;
    return 1;
}

static void *scan_part(void *arg) {
    part_t *t = arg;
    const char *buf = t->buf;
    int64_t pos = t->start;
    uint64_t bits = 0;  /* kept here, not in *t, while the loop runs */
    uint64_t last = UINT64_MAX;  /* the code of the last line's series (none yet: +1 is 0) */
    const int64_t page = sysconf(_SC_PAGESIZE);
    int64_t released = (t->start + page - 1) / page * page;  /* pages before it: handed back */
    if (!table_init(&t->table)) { t->failed = 1; return NULL; }
    while (pos < t->end) {
        const char *part_end = buf + t->end, *hit = brace_or_nl(buf + pos, part_end);
        const char *brace = NULL, *nl = hit < part_end && *hit == '\n' ? hit : NULL;
        if (hit < part_end && *hit == '}') {
            brace = hit;
            nl = memchr(hit + 1, '\n', (size_t)(part_end - hit - 1));
        }
        int64_t stop = nl ? nl - buf : t->end, next = nl ? stop + 1 : t->end;
        if (stop > pos && buf[stop - 1] == '\r') stop--;
        if (t->n == t->cap && !part_reserve(t)) { t->failed = 1; return NULL; }
        int64_t i = t->n++;
        const char *line = buf + pos;
        int64_t len = stop - pos;
        int64_t s_len = brace ? brace - line : len;
        uint8_t f = 0;
        uint32_t code = NONE;
        if (s_len > 0) {
            /* a scrape lists its series in the order the first one did, which is the order
             * of their codes: the series after the last line's is tried first, by its bytes
             * (equal bytes: the same series, ASCII as when it was first seen and hashed) */
            const series_t *guess = last + 1 < (uint64_t)t->table.n ? &t->table.items[last + 1] : NULL;
            if (guess && guess->len == s_len && memcmp(t->table.arena + guess->off, line, (size_t)s_len) == 0)
                code = (uint32_t)(last + 1);
            else
                code = table_code(&t->table, line, s_len, hash_bytes(line, s_len, &bits));
            if (code == NONE) { t->failed = 1; return NULL; }
            last = code;
        } else if (!brace) {
            f |= NO_SERIES;  /* an empty line; one that starts with `}` is malformed, no blank */
        }
        double value = 0.0;
        int64_t ts = 0;
        if (brace) {
            const char *r = brace + 1, *end = line + len;
            for (const char *q = r; q < end; q++) bits |= (uint8_t)*q;
            const char *second = memchr(r, '}', (size_t)(end - r));
            if (second) end = second;
            if (end > r) {  /* the rest: fields as splitn(" ", 3) */
                if (*r == ' ') f |= LEAD;
                const char *sp1 = memchr(r, ' ', (size_t)(end - r));
                if (sp1) {
                    const char *v = sp1 + 1;
                    const char *sp2 = memchr(v, ' ', (size_t)(end - v));
                    const char *v_end = sp2 ? sp2 : end;
                    if (v_end > v) {
                        if (parse_value(v, v_end - v, &value)) f |= VALUE;
                        else if (!push_token(&t->odd_v, &t->n_odd_v, &t->cap_odd_v, i, v - buf, v_end - v)) {
                            t->failed = 1; return NULL;
                        }
                    }
                    if (sp2) {
                        const char *x = sp2 + 1;
                        f |= HAS_TS;
                        if (end > x) {
                            if (parse_ts(x, end - x, &ts)) f |= TS;
                            else if (!push_token(&t->odd_t, &t->n_odd_t, &t->cap_odd_t, i, x - buf, end - x)) {
                                t->failed = 1; return NULL;
                            }
                        }
                    }
                }
            }
        }
        t->code[i] = code; t->value[i] = value; t->ts[i] = ts; t->flags[i] = f;
        pos = next;
        if (t->release && pos - released >= RELEASE_EVERY) {
            int64_t upto = pos / page * page;
            if (upto > released) madvise((void *)(buf + released), (size_t)(upto - released), MADV_DONTNEED);
            released = upto;
        }
    }
    t->bits = bits;
    return NULL;
}

static void part_free(part_t *t) {
    free(t->code); free(t->value); free(t->ts); free(t->flags);
    free(t->odd_v); free(t->odd_t);
    table_free(&t->table);
}

void expo_free(scan_t *s) {
    if (!s) return;
    for (int k = 0; k < s->nparts; k++) { part_free(&s->parts[k]); free(s->remap[k]); }
    free(s);
}

/* Scan buf[0, len) in `threads` parts; NULL when out of memory. Then expo_counts, expo_fill.
 * `release`: buf is a read-only memory map of a file (page-aligned): the pages read are handed
 * back as the scan goes (MADV_DONTNEED; the page cache keeps them, a later read maps them
 * again), so a large file does not stay in the process's memory while the rest of the parse
 * runs. Never for memory of the process's own: there it would zero the text. */
scan_t *expo_scan(const char *buf, int64_t len, int threads, int release) {
    scan_t *s = aligned_alloc(128, (sizeof(scan_t) + 127) / 128 * 128);
    if (!s) return NULL;
    memset(s, 0, sizeof(scan_t));
    if (threads < 1) threads = 1;
    if (threads > 8) threads = 8;
    s->buf = buf;
    int64_t start = 0;
    for (int k = 0; k < threads && start < len; k++) {
        int64_t end = k == threads - 1 ? len : len / threads * (k + 1);
        if (end < start) end = start;
        if (end < len) {  /* cut after a line end */
            const char *nl = memchr(buf + end, '\n', (size_t)(len - end));
            end = nl ? nl - buf + 1 : len;
        }
        s->parts[k] = (part_t){.buf = buf, .start = start, .end = end, .release = release};
        s->nparts = k + 1;
        start = end;
    }
    pthread_t tid[8];
    int started[8] = {0};
    for (int k = 1; k < s->nparts; k++)
        started[k] = pthread_create(&tid[k], NULL, scan_part, &s->parts[k]) == 0;
    if (s->nparts) scan_part(&s->parts[0]);
    for (int k = 1; k < s->nparts; k++) {
        if (started[k]) pthread_join(tid[k], NULL);
        else scan_part(&s->parts[k]);
    }
    /* the parts' series, merged into the first part's table in file order */
    for (int k = 0; k < s->nparts; k++) {
        part_t *p = &s->parts[k];
        if (p->failed) { expo_free(s); return NULL; }
        s->n_lines += p->n; s->n_odd_v += p->n_odd_v; s->n_odd_t += p->n_odd_t;
        s->bits |= p->bits;
    }
    if (s->nparts) {
        s->global = &s->parts[0].table;
        for (int k = 1; k < s->nparts; k++) {
            table_t *t = &s->parts[k].table;
            s->remap[k] = malloc(sizeof(uint32_t) * (size_t)(t->n ? t->n : 1));
            if (!s->remap[k]) { expo_free(s); return NULL; }
            for (int64_t j = 0; j < t->n; j++) {
                series_t *it = &t->items[j];
                uint32_t c = table_code(s->global, t->arena + it->off, it->len, it->hash);
                if (c == NONE) { expo_free(s); return NULL; }
                s->remap[k][j] = c;
            }
        }
    }
    return s;
}

/* lines, distinct series, their bytes, values and timestamps left for Polars, and whether
 * any byte is not ASCII (then the caller reads the file with Polars, which checks UTF-8) */
void expo_counts(const scan_t *s, int64_t *out) {
    out[0] = s->n_lines;
    out[1] = s->global ? s->global->n : 0;
    out[2] = s->global ? s->global->used : 0;  /* the arena holds them in code order */
    out[3] = s->n_odd_v;
    out[4] = s->n_odd_t;
    out[5] = (s->bits & 0x8080808080808080ull) != 0;
}

/* Copy the scan into the caller's arrays: per line (code, value, ts, flags), the distinct
 * series as Arrow string offsets + bytes, and (line, offset, length) of each odd token. */
void expo_fill(const scan_t *s, uint32_t *code, double *value, int64_t *ts, uint8_t *flags,
               int64_t *series_offsets, char *series_bytes, int64_t *odd_v, int64_t *odd_t) {
    int64_t base = 0, nv = 0, nt = 0;
    for (int k = 0; k < s->nparts; k++) {
        const part_t *p = &s->parts[k];
        if (k == 0) memcpy(code, p->code, sizeof(uint32_t) * (size_t)p->n);
        else
            for (int64_t i = 0; i < p->n; i++)
                code[base + i] = p->code[i] == NONE ? NONE : s->remap[k][p->code[i]];
        memcpy(value + base, p->value, sizeof(double) * (size_t)p->n);
        memcpy(ts + base, p->ts, sizeof(int64_t) * (size_t)p->n);
        memcpy(flags + base, p->flags, (size_t)p->n);
        for (int64_t j = 0; j < p->n_odd_v; j++, nv++) {
            odd_v[3 * nv] = p->odd_v[j].line + base;
            odd_v[3 * nv + 1] = p->odd_v[j].off; odd_v[3 * nv + 2] = p->odd_v[j].len;
        }
        for (int64_t j = 0; j < p->n_odd_t; j++, nt++) {
            odd_t[3 * nt] = p->odd_t[j].line + base;
            odd_t[3 * nt + 1] = p->odd_t[j].off; odd_t[3 * nt + 2] = p->odd_t[j].len;
        }
        base += p->n;
    }
    /* the arena is already the Arrow layout: the series' bytes one after another, in code order */
    series_offsets[0] = 0;
    if (s->global) {
        memcpy(series_bytes, s->global->arena, (size_t)s->global->used);
        for (int64_t j = 0; j < s->global->n; j++)
            series_offsets[j + 1] = s->global->items[j].off + s->global->items[j].len;
    }
}

/* 1 when p[0, n) is plain text: no NUL byte and only ASCII (every byte in 1..127); 0 when some
 * byte is not. The common landing file is checked here in one pass, outside Python's lock (the
 * two passes of `bytes.isascii` and `b"\0" in` hold it: other files' parses waited on them). */
int expo_plain(const unsigned char *p, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        int64_t end = n - i > 65536 ? i + 65536 : n;
#ifdef __SSE2__
        const __m128i zero = _mm_setzero_si128();
        __m128i high = zero, nul = zero;
        for (; i + 16 <= end; i += 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)(p + i));
            high = _mm_or_si128(high, x);
            nul = _mm_or_si128(nul, _mm_cmpeq_epi8(x, zero));
        }
        if (_mm_movemask_epi8(high) | _mm_movemask_epi8(nul)) return 0;
#endif
        for (; i < end; i++)
            if (p[i] == 0 || p[i] >= 0x80) return 0;
    }
    return 1;
}
