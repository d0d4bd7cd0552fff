/*
 * test-mpi.c — symred_mpi against single-process symred, run by ctest under mpirun with 1, 2
 * and 3 ranks (tests/CMakeLists.txt).
 *
 * Every rank makes the whole data set from one seed, keeps its shard (uneven sizes, some of
 * them empty), runs the sharded kernel, and compares its own rows with a single-process kernel
 * of the same reduction on the whole data: values within a per-dtype tolerance (float64:
 * 1e-12 relative), indices equal (ties included: both sides pick the lowest global index). Then
 * the error paths: an error on one rank must come back, with its message, on every rank.
 *
 * This is a plain MPI program, not a Criterion one (Criterion runs tests in forked workers,
 * which MPI does not allow). Each check prints both values when it fails; the exit status is
 * the number of failed checks (capped), so mpirun fails when any rank does.
 */
#include <symred_mpi.h>

#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks, failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "rank %d: %s:%d: CHECK FAILED: ", rank, __FILE__, __LINE__);           \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return p;
}

/* The first row and the row count of rank p's shard of n rows: uneven (rank p gets a share
 * growing with p), or everything on the last rank when `last_only`. (check_case numbers y's
 * shards from the other end, so "last" is rank 0 for y.) */
static void shard(int64_t n, int p, int last_only, int64_t *first, int64_t *count)
{
    int64_t P = nranks;
    if (last_only) {
        *first = p == P - 1 ? 0 : n;
        *count = p == P - 1 ? n : 0;
        return;
    }
    int64_t lo = n * p * (p + 1) / (P * (P + 1)), hi = n * (p + 1) * (p + 2) / (P * (P + 1));
    *first = lo;
    *count = hi - lo;
}

/* One data set: x (i-variable, dim 3), y (j-variable, dim 3), b (j-variable, dim 2), g. */
typedef struct data {
    sr_dtype dtype;
    int64_t nx, ny;
    void *x, *y, *b, *g;
} data;

static size_t esz(sr_dtype dt) { return dt == SR_F64 ? sizeof(double) : sizeof(float); }

/* ties: 1 for points on an integer grid (exactly equal distances); 2 for NaN and infinities
 * in a few coordinates as well. */
static void data_make(data *d, sr_dtype dt, int64_t nx, int64_t ny, int ties, uint64_t seed)
{
    d->dtype = dt;
    d->nx = nx;
    d->ny = ny;
    d->x = xcalloc((size_t)nx * 3, esz(dt));
    d->y = xcalloc((size_t)ny * 3, esz(dt));
    d->b = xcalloc((size_t)ny * 2, esz(dt));
    d->g = xcalloc(1, esz(dt));
    tu_fill(d->x, dt, nx * 3, ties ? 0.0 : -1.0, ties ? 3.0 : 1.0, &seed);
    tu_fill(d->y, dt, ny * 3, ties ? 0.0 : -1.0, ties ? 3.0 : 1.0, &seed);
    tu_fill(d->b, dt, ny * 2, 0.5, 1.5, &seed);
    tu_fill(d->g, dt, 1, 0.5, 1.5, &seed);
    /* With `ties`, points on a coarse integer grid: many exactly equal distances. */
    for (int64_t e = 0; ties && e < nx * 3; e++)
        dt == SR_F64 ? (((double *)d->x)[e] = floor(((double *)d->x)[e]))
                     : (((float *)d->x)[e] = floorf(((float *)d->x)[e]));
    for (int64_t e = 0; ties && e < ny * 3; e++)
        dt == SR_F64 ? (((double *)d->y)[e] = floor(((double *)d->y)[e]))
                     : (((float *)d->y)[e] = floorf(((float *)d->y)[e]));
    /* IEEE specials in rows that land in different shards: NaN and +-inf distances, NaN
     * products, -inf and NaN LogSumExp terms. */
    static const struct {
        int y; /* 1: y, 0: x */
        int64_t row;
        double v;
    } specials[] = {
        {0, 2, NAN}, {1, 4, INFINITY}, {1, 9, NAN}, {1, 30, -INFINITY}, {0, 20, INFINITY}};
    for (size_t t = 0; ties == 2 && t < sizeof specials / sizeof *specials; t++) {
        void *a = specials[t].y ? d->y : d->x;
        int64_t n = specials[t].y ? ny : nx, e = specials[t].row * 3 + 1;
        if (specials[t].row < n)
            dt == SR_F64 ? (((double *)a)[e] = specials[t].v)
                         : (((float *)a)[e] = (float)specials[t].v);
    }
}

static void data_free(data *d)
{
    free(d->x);
    free(d->y);
    free(d->b);
    free(d->g);
}

static double get(const void *a, sr_dtype dt, int64_t i)
{
    return dt == SR_F64 ? ((const double *)a)[i] : (double)((const float *)a)[i];
}

/* The formula of each reduction: vector-valued (dimension 2) where the reduction allows, so
 * that components are reduced separately. */
static sr_expr *formula(sr_ctx *ctx, sr_reduction red, sr_expr **weight)
{
    sr_expr *x = sr_vi(ctx, 0, 3), *y = sr_vj(ctx, 1, 3), *b = sr_vj(ctx, 2, 2);
    sr_expr *g = sr_pm(ctx, 3, 1), *d2 = sr_sqdist(ctx, x, y);
    *weight = NULL;
    switch (red) {
    case SR_SUM:
    case SR_LOGSUMEXP: /* Exp(-g |x-y|^2) * b, and LogSumExp of -g |x-y|^2 * b */
        return red == SR_SUM ? sr_mul(ctx, sr_exp(ctx, sr_neg(ctx, sr_mul(ctx, d2, g))), b)
                             : sr_mul(ctx, sr_neg(ctx, sr_mul(ctx, d2, g)), b);
    case SR_SUMSOFTMAXWEIGHT: /* softmax of -|x-y|^2 b_0 over the values (b, y_0 x_1 g): the
                                 weight alone uses the last index, g */
        *weight =
            sr_concat(ctx, b, sr_mul(ctx, sr_mul(ctx, sr_elem(ctx, y, 0), sr_elem(ctx, x, 1)), g));
        return sr_neg(ctx, sr_mul(ctx, d2, sr_elem(ctx, b, 0)));
    default: /* (|x-y|^2, -(x|y) * b_0) for the Min/Max/K families */
        return sr_concat(ctx, d2,
                         sr_neg(ctx, sr_mul(ctx, sr_scalprod(ctx, x, y), sr_elem(ctx, b, 0))));
    }
}

static int has_values(sr_reduction r)
{
    return r != SR_ARGMIN && r != SR_ARGMAX && r != SR_ARGKMIN;
}

static int has_indices(sr_reduction r)
{
    return r == SR_ARGMIN || r == SR_ARGMAX || r == SR_ARGKMIN || r == SR_MIN_ARGMIN ||
           r == SR_MAX_ARGMAX || r == SR_KMIN_ARGKMIN;
}

/* Runs one case: reduction, axis, dtype, device, K, sizes, shard layout; compares rank's rows. */
static void check_case(sr_ctx *ctx, sr_mpi *m, sr_reduction red, int axis, sr_dtype dt,
                       sr_device dev, int k, int64_t nx, int64_t ny, int last_only, int ties)
{
    char what[160];
    snprintf(what, sizeof what, "%s axis %d %s %s k %d nx %lld ny %lld%s%s%s%s",
             sr_reduction_name(red), axis, dt == SR_F64 ? "f64" : "f32",
             dev == SR_DEVICE_REFERENCE ? "reference" : "default device", k, (long long)nx,
             (long long)ny, last_only ? " (one rank holds all)" : "",
             last_only == 2 ? " (x and y)" : "", ties ? " (ties)" : "",
             ties == 2 ? " (NaN, inf)" : "");
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = red;
    desc.axis = axis;
    desc.dtype = dt;
    desc.device = dev;
    desc.k = k;
    sr_expr *f = formula(ctx, red, &desc.weight);

    data all;
    data_make(&all, dt, nx, ny, ties, 42);
    /* The single-process answer on all the data. */
    sr_kernel *ref = NULL;
    sr_status st = sr_kernel_new(ctx, f, &desc, &ref);
    CHECK(st == SR_OK, "%s: sr_kernel_new: %s", what, sr_ctx_error(ctx));
    int od = sr_kernel_out_dim(ref), nargs = sr_kernel_nargs(ref);
    int64_t nout = axis == 1 ? nx : ny;
    void *want = xcalloc((size_t)(nout * od), esz(dt));
    int64_t *want_idx = xcalloc((size_t)(nout * od), sizeof(int64_t));
    const void *args[] = {all.x, all.y, all.b, all.g};
    sr_run_desc run = {
        nx, ny, nargs, args, has_values(red) ? want : NULL, has_indices(red) ? want_idx : NULL};
    st = sr_kernel_run_ex(ref, &run);
    CHECK(st == SR_OK, "%s: sr_kernel_run_ex: %s", what, sr_ctx_error(ctx));
    sr_kernel_free(ref);

    /* This rank's shard: rows of x and of y (and b). */
    int64_t x0, xn, y0, yn;
    shard(nx, rank, last_only == 2 || (last_only && axis == 0), &x0, &xn);
    shard(ny, nranks - 1 - rank, last_only == 2 || (last_only && axis == 1), &y0, &yn);
    /* y is sharded in reverse rank order: y's shard of rank r is not x's, so the ring's
     * global indices are checked against a layout where ranks hold different shares. The
     * global index of a y row is its position in the concatenation by rank, so the data are
     * rearranged into that order. */
    int64_t yfirst = 0;
    for (int p = 0; p < rank; p++) {
        int64_t a, c;
        shard(ny, nranks - 1 - p, last_only == 2 || (last_only && axis == 1), &a, &c);
        yfirst += c;
    }
    (void)y0;
    data mine;
    mine.dtype = dt;
    size_t e = esz(dt);
    mine.x = (char *)all.x + (size_t)x0 * 3 * e;
    /* Rows [yfirst, yfirst + yn) of the concatenation by rank order are the global rows. */
    mine.y = (char *)all.y + (size_t)yfirst * 3 * e;
    mine.b = (char *)all.b + (size_t)yfirst * 2 * e;
    mine.g = rank == 0 ? all.g : NULL; /* parameters come from rank 0 */
    int64_t own0 = axis == 1 ? x0 : yfirst, nown = axis == 1 ? xn : yn;

    sr_mpi_kernel *mk = NULL;
    st = sr_mpi_kernel_new(m, f, &desc, &mk);
    CHECK(st == SR_OK, "%s: sr_mpi_kernel_new: %s", what, sr_mpi_error(m));
    void *got = xcalloc((size_t)(nown * od), e);
    int64_t *got_idx = xcalloc((size_t)(nown * od), sizeof(int64_t));
    const void *margs[] = {mine.x, mine.y, mine.b, mine.g};
    sr_run_desc mrun = {
        xn, yn, nargs, margs, has_values(red) ? got : NULL, has_indices(red) ? got_idx : NULL};
    if (mk) {
        CHECK(sr_mpi_kernel_out_dim(mk) == od, "%s: out_dim %d, want %d", what,
              sr_mpi_kernel_out_dim(mk), od);
        st = sr_mpi_kernel_run(mk, &mrun);
        CHECK(st == SR_OK, "%s: sr_mpi_kernel_run: %s", what, sr_mpi_error(m));
    }
    double rtol = dt == SR_F64 ? 1e-12 : 2e-5, atol = dt == SR_F64 ? 1e-12 : 2e-5;
    int bad = 0;
    for (int64_t t = 0; mk && st == SR_OK && t < nown * od && bad < 3; t++) {
        int64_t w = own0 * od + t;
        if (has_values(red)) {
            double a = get(got, dt, t), b = get(want, dt, w);
            if (!tu_close(a, b, rtol, atol)) {
                bad++;
                CHECK(0, "%s: value %lld (row %lld): got %.17g, want %.17g", what, (long long)t,
                      (long long)(own0 + t / od), a, b);
            }
        }
        if (has_indices(red) && got_idx[t] != want_idx[w]) {
            bad++;
            CHECK(0, "%s: index %lld (row %lld): got %lld, want %lld", what, (long long)t,
                  (long long)(own0 + t / od), (long long)got_idx[t], (long long)want_idx[w]);
        }
    }
    sr_mpi_kernel_free(mk);
    free(got);
    free(got_idx);
    free(want);
    free(want_idx);
    data_free(&all);
}

/* Errors on some ranks come back on all of them, with the failing rank's message. */
static void check_errors(sr_ctx *ctx, sr_mpi *m)
{
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = SR_ARGKMIN;
    desc.dtype = SR_F64;
    desc.device = SR_DEVICE_REFERENCE;
    desc.k = 4;
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2));
    double x[6 * 2] = {0}, y[2 * 2] = {0};
    int64_t idx[6 * 4];
    sr_mpi_kernel *mk = NULL;
    sr_status st = sr_mpi_kernel_new(m, f, &desc, &mk);
    CHECK(st == SR_OK, "sr_mpi_kernel_new: %s", sr_mpi_error(m));

    /* K larger than all the y rows together: every rank sees it. */
    const void *args[] = {x, y};
    int64_t ny = nranks == 1 ? 3 : 1; /* 3 or P rows in all, fewer than 4 when P <= 3 */
    sr_run_desc run = {6, ny, 2, args, NULL, idx};
    st = sr_mpi_kernel_run(mk, &run);
    CHECK(st == SR_EINVAL, "k > total rows: status %d, want SR_EINVAL", st);
    CHECK(strstr(sr_mpi_error(m), "k = 4") != NULL, "k > total rows: message '%s'",
          sr_mpi_error(m));

    /* A NULL array on the last rank only: the same error everywhere, naming that rank. */
    const void *bad_args[] = {rank == nranks - 1 ? NULL : x, y};
    run = (sr_run_desc){6, 2, 2, bad_args, NULL, idx};
    st = sr_mpi_kernel_run(mk, &run);
    char want[64];
    snprintf(want, sizeof want, "rank %d: ", nranks - 1);
    CHECK(st == SR_EINVAL, "NULL array on one rank: status %d, want SR_EINVAL", st);
    CHECK(strstr(sr_mpi_error(m), want) == sr_mpi_error(m) && strstr(sr_mpi_error(m), "NULL"),
          "NULL array on one rank: message '%s'", sr_mpi_error(m));

    /* The kernel still works after the failures: 2 rows per rank, K = 4 <= 2 * P when P >= 2. */
    run = (sr_run_desc){6, 2, 2, args, NULL, idx};
    st = sr_mpi_kernel_run(mk, &run);
    if (nranks >= 2)
        CHECK(st == SR_OK, "run after errors: %s", sr_mpi_error(m));
    sr_mpi_kernel_free(mk);

    /* A different formula on the last rank (when there are 2 or more). */
    sr_expr *g = nranks > 1 && rank == nranks - 1 ? sr_exp(ctx, f) : f;
    st = sr_mpi_kernel_new(m, g, &desc, &mk);
    CHECK(nranks == 1 ? st == SR_OK : st == SR_EINVAL, "different formulas: status %d", st);
    CHECK(nranks == 1 || strstr(sr_mpi_error(m), "differs from rank 0"),
          "different formulas: message '%s'", sr_mpi_error(m));
    sr_mpi_kernel_free(mk);

    /* A budget too small for any plan on rank 0 only: its kernel fails, everywhere. */
    sr_ctx *small = NULL;
    sr_mpi *ms = NULL;
    sr_ctx_new(&small);
    if (rank == 0)
        sr_ctx_set_mem_limit(small, 1);
    sr_mpi_new(small, MPI_COMM_WORLD, &ms);
    desc.device = SR_DEVICE_CPU;
    f = sr_sqdist(small, sr_vi(small, 0, 2), sr_vj(small, 1, 2));
    st = sr_mpi_kernel_new(ms, f, &desc, &mk);
    CHECK(st == SR_EBUDGET, "budget on rank 0: status %d (%s), want SR_EBUDGET", st,
          sr_mpi_error(ms));
    CHECK(strncmp(sr_mpi_error(ms), "rank 0: ", 8) == 0, "budget on rank 0: message '%s'",
          sr_mpi_error(ms));
    CHECK(mk == NULL, "a failed sr_mpi_kernel_new leaves *out NULL");
    sr_mpi_free(ms);
    sr_ctx_free(small);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    sr_ctx *ctx = NULL;
    sr_mpi *m = NULL;
    if (sr_ctx_new(&ctx) != SR_OK || sr_mpi_new(ctx, MPI_COMM_WORLD, &m) != SR_OK) {
        fprintf(stderr, "rank %d: cannot create the context\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    CHECK(sr_mpi_rank(m) == rank && sr_mpi_size(m) == nranks, "rank %d of %d", sr_mpi_rank(m),
          sr_mpi_size(m));

    /* Every reduction, both axes, both dtypes, on the reference interpreter (no compile). */
    for (int r = 0; r < SR_REDUCTION_COUNT; r++)
        for (int axis = 0; axis <= 1; axis++)
            for (int dt = SR_F32; dt <= SR_F64; dt++)
                check_case(ctx, m, (sr_reduction)r, axis, (sr_dtype)dt, SR_DEVICE_REFERENCE, 3, 37,
                           53, 0, 0);
    /* Exact ties: the lowest global index wins across blocks as within one. */
    sr_reduction tied[] = {SR_MIN_ARGMIN, SR_MAX_ARGMAX, SR_KMIN_ARGKMIN, SR_ARGKMIN};
    for (size_t t = 0; t < sizeof tied / sizeof *tied; t++)
        for (int axis = 0; axis <= 1; axis++)
            check_case(ctx, m, tied[t], axis, SR_F64, SR_DEVICE_REFERENCE, 5, 29, 41, 0, 1);
    /* NaN and infinities: NaN before numbers for Min/Max indices, after +inf in K-lists, -inf
     * and NaN terms of LogSumExp and SumSoftMaxWeight, as one process has them. */
    for (int r = 0; r < SR_REDUCTION_COUNT; r++)
        for (int axis = 0; axis <= 1; axis++)
            check_case(ctx, m, (sr_reduction)r, axis, SR_F64, SR_DEVICE_REFERENCE, 4, 31, 43, 0, 2);
    /* Blocks shorter than K (and empty blocks: one rank holds all the reduced rows). */
    check_case(ctx, m, SR_KMIN_ARGKMIN, 1, SR_F64, SR_DEVICE_REFERENCE, 7, 11, 9, 0, 0);
    check_case(ctx, m, SR_KMIN_ARGKMIN, 0, SR_F32, SR_DEVICE_REFERENCE, 4, 10, 13, 1, 0);
    check_case(ctx, m, SR_SUMSOFTMAXWEIGHT, 1, SR_F64, SR_DEVICE_REFERENCE, 1, 17, 12, 1, 0);
    check_case(ctx, m, SR_MAX_ARGMAX, 0, SR_F64, SR_DEVICE_REFERENCE, 1, 14, 10, 1, 0);
    /* No result rows on most ranks (x on the last rank, y on rank 0): they still pass blocks on. */
    check_case(ctx, m, SR_MIN_ARGMIN, 1, SR_F64, SR_DEVICE_REFERENCE, 1, 15, 22, 2, 0);
    check_case(ctx, m, SR_SUMSOFTMAXWEIGHT, 0, SR_F32, SR_DEVICE_REFERENCE, 1, 15, 22, 2, 0);
    /* The default (JIT) backend, with row chunks of its own (more than 1024 rows per rank). */
    check_case(ctx, m, SR_SUM, 1, SR_F64, SR_DEVICE_AUTO, 1, 3000, 700, 0, 0);
    check_case(ctx, m, SR_ARGKMIN, 0, SR_F32, SR_DEVICE_AUTO, 10, 900, 2600, 0, 0);
    check_case(ctx, m, SR_SUMSOFTMAXWEIGHT, 1, SR_F64, SR_DEVICE_AUTO, 1, 2500, 300, 0, 0);
    check_case(ctx, m, SR_LOGSUMEXP, 0, SR_F32, SR_DEVICE_AUTO, 1, 200, 400, 0, 0);

    check_errors(ctx, m);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test-mpi: %d ranks, %s (%d failed checks)\n", nranks, total ? "FAILED" : "passed",
               total);
    sr_mpi_free(m);
    sr_ctx_free(ctx);
    MPI_Finalize();
    return failures > 100 ? 100 : failures;
}
