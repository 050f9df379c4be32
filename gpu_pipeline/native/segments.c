/* Segment reductions of the staging pass's minute runs (gpu_pipeline.lib.staging.minute_runs):
 * per run of consecutive rows, the sum of a float column, the count of true values of a boolean
 * column, the count of each code of a category column, the maximum of an integer or float
 * column. Runs are given by their first rows `at` (strictly increasing, at[0] = 0; the last run
 * ends at row n).
 *
 * Each result equals its numpy.ufunc.reduceat to the bit: a run's float sum is its first value
 * plus numpy's pairwise sum of the others (numpy/_core/src/umath/loops_utils.h.src), in the same
 * order, so the marts do not change by a last bit with the library present or absent. What it
 * saves is numpy's per-run call (a run is about 60 rows) and a pass per category.
 * Built with exposition.c into one library (Makefile); no Python API is used.
 */
#include <math.h>
#include <stdint.h>

/* the interface's version: gpu_pipeline/native/__init__.py uses these functions only from a
 * library that says this */
#define SEG_VERSION 1
int seg_version(void) { return SEG_VERSION; }

#define PW_BLOCKSIZE 128

static double pairwise_sum(const double *a, int64_t n) {
    if (n < 8) {
        double res = 0.;
        for (int64_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= PW_BLOCKSIZE) {
        double r[8];
        int64_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

static inline int64_t run_end(const int64_t *at, int64_t k, int64_t nseg, int64_t n) {
    return k + 1 < nseg ? at[k + 1] : n;
}

void seg_sum_f64(const double *x, const int64_t *at, int64_t nseg, int64_t n, double *out) {
    for (int64_t k = 0; k < nseg; k++) {
        int64_t s = at[k], len = run_end(at, k, nseg, n) - s;
        out[k] = len > 1 ? x[s] + pairwise_sum(x + s + 1, len - 1) : x[s];
    }
}

/* true values of a boolean column (numpy's bools: one byte, 0 or 1) */
void seg_count_u8(const uint8_t *x, const int64_t *at, int64_t nseg, int64_t n, uint32_t *out) {
    for (int64_t k = 0; k < nseg; k++) {
        uint32_t c = 0;
        for (int64_t i = at[k], e = run_end(at, k, nseg, n); i < e; i++) c += x[i] != 0;
        out[k] = c;
    }
}

/* rows of each code 0..ncodes-1 (a code >= ncodes counts in none): out[c * nseg + k] */
void seg_count_codes(const uint8_t *codes, const int64_t *at, int64_t nseg, int64_t n,
                     int32_t ncodes, uint32_t *out) {
    uint32_t c[256];
    for (int64_t k = 0; k < nseg; k++) {
        for (int j = 0; j < 256; j++) c[j] = 0;
        for (int64_t i = at[k], e = run_end(at, k, nseg, n); i < e; i++) c[codes[i]]++;
        for (int32_t j = 0; j < ncodes; j++) out[(int64_t)j * nseg + k] = c[j];
    }
}

void seg_max_i64(const int64_t *x, const int64_t *at, int64_t nseg, int64_t n, int64_t *out) {
    for (int64_t k = 0; k < nseg; k++) {
        int64_t m = x[at[k]];
        for (int64_t i = at[k] + 1, e = run_end(at, k, nseg, n); i < e; i++)
            if (x[i] > m) m = x[i];
        out[k] = m;
    }
}

/* numpy.fmax: NaN is passed over unless every value of the run is NaN */
void seg_fmax_f64(const double *x, const int64_t *at, int64_t nseg, int64_t n, double *out) {
    for (int64_t k = 0; k < nseg; k++) {
        double m = x[at[k]];
        for (int64_t i = at[k] + 1, e = run_end(at, k, nseg, n); i < e; i++)
            m = fmax(m, x[i]);
        out[k] = m;
    }
}
