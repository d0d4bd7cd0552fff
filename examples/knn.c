/*
 * knn.c — exact k-nearest neighbours with symred's builder API.
 *
 * For each query q_i, the indices of the k points p_j nearest to it (squared Euclidean
 * distance), computed as the reduction ArgKMin_j SqDist(q_i, p_j) without building the
 * nq × np distance matrix. The same formula is then run as KMin_ArgKMin through
 * sr_kernel_run_ex, which returns the k distances and the k indices together.
 *
 * Usage: knn [options] [nq [np [D]]]
 *   nq, np, D             queries, points, dimension (default 1000 × 10000, D = 16); random
 *                         points uniform in [0, 1)^D
 *   --k K                 neighbours per query (default 10)
 *   --f64                 compute in float64 (default float32)
 *   --device NAME         auto, cpu, reference or cuda (default auto)
 *   --seed S              seed of the random points (default 1)
 *   --fashion-mnist N     use real data: the first N Fashion-MNIST training images as points
 *                         and the first nq test images as queries (D = 784, default nq = 100);
 *                         needs /usr/share/datasets/fashion-mnist (Debian package
 *                         dataset-fashion-mnist) and gzip
 *   --check               compare with a brute-force sort (all queries when nq*np <= 4e6, else
 *                         a sample); exit 1 on a mismatch
 *   --tol T               tolerance of --check, relative to |q|^2 + |p|^2 (default 1e-4 for
 *                         float32, 1e-12 for float64)
 *   --quiet               do not print the kernel's explain text
 *
 * Exit status: 0 on success, 1 on a symred error or a failed check, 2 on a usage error.
 */
#define _POSIX_C_SOURCE 200809L

#include <symred.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *prog = "knn";

#include "example.h"

#define FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

static void usage(void)
{
    fprintf(stderr,
            "usage: %s [--k K] [--f64] [--device auto|cpu|reference|cuda] [--seed S]\n"
            "       [--fashion-mnist N] [--check] [--tol T] [--quiet] [nq [np [D]]]\n",
            prog);
    exit(2);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/*
 * Reads the first n images of a gzip-compressed IDX file (the MNIST format: a big-endian header
 * magic 0x00000803, count, rows, cols, then count*rows*cols bytes) into a, scaled to [0, 1].
 * gzip does the decompression, so the example needs no zlib. Returns the dimension rows*cols,
 * or 0 after printing why it failed.
 */
static int64_t read_idx_images(const char *path, int64_t n, void **a, int f64)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "gzip -dc '%s'", path);
    FILE *fp = popen(cmd, "r");
    if (!fp) {
        fprintf(stderr, "%s: cannot run gzip on %s\n", prog, path);
        return 0;
    }
    unsigned char hdr[16];
    int64_t dim = 0;
    if (fread(hdr, 1, sizeof hdr, fp) != sizeof hdr || be32(hdr) != 0x803) {
        fprintf(stderr, "%s: %s is not an IDX image file\n", prog, path);
    } else if ((int64_t)be32(hdr + 4) < n) {
        fprintf(stderr, "%s: %s holds %u images, %lld were asked for\n", prog, path, be32(hdr + 4),
                (long long)n);
    } else {
        dim = (int64_t)be32(hdr + 8) * (int64_t)be32(hdr + 12);
        size_t bytes = (size_t)(n * dim);
        unsigned char *raw = xmalloc(bytes);
        if (fread(raw, 1, bytes, fp) != bytes) {
            fprintf(stderr, "%s: %s is truncated\n", prog, path);
            dim = 0;
        } else {
            *a = xmalloc(bytes * (f64 ? sizeof(double) : sizeof(float)));
            for (size_t t = 0; t < bytes; t++)
                set(*a, f64, (int64_t)t, raw[t] / 255.0);
        }
        free(raw);
    }
    /* The header and n images may be only part of the file: gzip may then die of SIGPIPE, which
     * is expected, so pclose's status is not checked. */
    pclose(fp);
    return dim;
}

struct cand {
    double d;
    int64_t j;
};

static int cand_cmp(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    if (a->d != b->d)
        return a->d < b->d ? -1 : 1;
    return (a->j > b->j) - (a->j < b->j);
}

static double sqdist(const void *q, const void *p, int f64, int64_t i, int64_t j, int64_t dim)
{
    double s = 0.0;
    for (int64_t c = 0; c < dim; c++) {
        double t = get(q, f64, i * dim + c) - get(p, f64, j * dim + c);
        s += t * t;
    }
    return s;
}

static double sqnorm(const void *a, int f64, int64_t i, int64_t dim)
{
    double s = 0.0;
    for (int64_t c = 0; c < dim; c++)
        s += get(a, f64, i * dim + c) * get(a, f64, i * dim + c);
    return s;
}

/*
 * Checks query i against a brute-force sort of all np distances in double precision. Exact
 * ranks can legitimately differ where two distances are closer than the rounding of the dtype,
 * so the check is on distances: the r-th returned index must be a valid, distinct point whose
 * true distance equals the true r-th smallest distance within tol·(|q|² + |p|²), and so must the
 * r-th returned value (vals may be NULL). Returns 0 if it holds, else prints why and returns 1.
 */
static int check_query(const void *q, const void *p, int f64, int64_t i, int64_t np, int64_t dim,
                       int k, const int64_t *idx, const void *vals, double tol, struct cand *work,
                       const char *what)
{
    for (int64_t j = 0; j < np; j++) {
        work[j].d = sqdist(q, p, f64, i, j, dim);
        work[j].j = j;
    }
    qsort(work, (size_t)np, sizeof *work, cand_cmp);
    double qn = sqnorm(q, f64, i, dim);
    for (int r = 0; r < k; r++) {
        int64_t j = idx[i * k + r];
        if (j < 0 || j >= np) {
            fprintf(stderr,
                    "%s: CHECK FAILED (%s): query %lld, neighbour %d: index %lld is out of "
                    "range [0, %lld)\n",
                    prog, what, (long long)i, r, (long long)j, (long long)np);
            return 1;
        }
        for (int s = 0; s < r; s++)
            if (idx[i * k + s] == j) {
                fprintf(stderr, "%s: CHECK FAILED (%s): query %lld: index %lld appears twice\n",
                        prog, what, (long long)i, (long long)j);
                return 1;
            }
        double want = work[r].d;
        double scale = qn + sqnorm(p, f64, work[r].j, dim);
        double got = sqdist(q, p, f64, i, j, dim);
        if (!(fabs(got - want) <= tol * scale)) {
            fprintf(stderr,
                    "%s: CHECK FAILED (%s): query %lld, neighbour %d: point %lld at "
                    "distance %.9g, but the %d-th nearest (point %lld) is at %.9g\n",
                    prog, what, (long long)i, r, (long long)j, got, r + 1, (long long)work[r].j,
                    want);
            return 1;
        }
        if (vals) {
            double v = get(vals, f64, i * k + r);
            if (!(fabs(v - want) <= tol * scale)) {
                fprintf(stderr,
                        "%s: CHECK FAILED (%s): query %lld, neighbour %d: distance %.9g, "
                        "brute force %.9g\n",
                        prog, what, (long long)i, r, v, want);
                return 1;
            }
            if (r > 0 && get(vals, f64, i * k + r - 1) > v) {
                fprintf(stderr,
                        "%s: CHECK FAILED (%s): query %lld: distances not ascending at "
                        "neighbour %d\n",
                        prog, what, (long long)i, r);
                return 1;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    int64_t nq = 1000, np = 10000, dim = 16, fashion = 0;
    int f64 = 0, check = 0, quiet = 0, npos = 0, k = 10;
    double tol = -1.0;
    uint64_t seed = 1;
    sr_device device = SR_DEVICE_AUTO;

    for (int a = 1; a < argc; a++) {
        const char *s = argv[a];
        if (strcmp(s, "--f64") == 0)
            f64 = 1;
        else if (strcmp(s, "--check") == 0)
            check = 1;
        else if (strcmp(s, "--quiet") == 0)
            quiet = 1;
        else if (strcmp(s, "--k") == 0 && a + 1 < argc) {
            int64_t v = parse_size(argv[++a]);
            if (v > 1 << 20) {
                fprintf(stderr, "%s: k = %lld is too large\n", prog, (long long)v);
                return 2;
            }
            k = (int)v; /* k = 0 is passed on: symred reports it */
        } else if (strcmp(s, "--tol") == 0 && a + 1 < argc)
            tol = parse_real(argv[++a]);
        else if (strcmp(s, "--seed") == 0 && a + 1 < argc)
            seed = (uint64_t)parse_size(argv[++a]);
        else if (strcmp(s, "--fashion-mnist") == 0 && a + 1 < argc)
            fashion = parse_size(argv[++a]);
        else if (strcmp(s, "--device") == 0 && a + 1 < argc) {
            if (!parse_device(argv[++a], &device)) {
                fprintf(stderr, "%s: unknown device '%s'\n", prog, argv[a]);
                usage();
            }
        } else if (s[0] == '-' && s[1] == '-')
            usage();
        else if (npos == 0) {
            nq = parse_size(s);
            npos++;
        } else if (npos == 1) {
            np = parse_size(s);
            npos++;
        } else if (npos == 2) {
            dim = parse_size(s);
            npos++;
        } else
            usage();
    }
    if (tol < 0)
        tol = f64 ? 1e-12 : 1e-4;
    size_t esz = f64 ? sizeof(double) : sizeof(float);

    void *q = NULL, *p = NULL;
    const char *source = "random points in the unit cube";
    if (fashion > 0) {
        if (npos == 0)
            nq = 100;
        np = fashion;
        int64_t dq = read_idx_images(FASHION_MNIST_DIR "/t10k-images-idx3-ubyte.gz", nq, &q, f64);
        int64_t dp =
            dq ? read_idx_images(FASHION_MNIST_DIR "/train-images-idx3-ubyte.gz", np, &p, f64) : 0;
        if (!dq || !dp) {
            fprintf(stderr,
                    "%s: could not read Fashion-MNIST from %s (apt-get install "
                    "dataset-fashion-mnist)\n",
                    prog, FASHION_MNIST_DIR);
            return 1;
        }
        dim = dp;
        source = "Fashion-MNIST: test images as queries, training images as points";
    } else {
        if (dim < 1 || dim > 1 << 20) {
            fprintf(stderr, "%s: the dimension must be in [1, %d], not %lld\n", prog, 1 << 20,
                    (long long)dim);
            return 2;
        }
        q = xmalloc((size_t)(nq * dim) * esz);
        p = xmalloc((size_t)(np * dim) * esz);
        for (int64_t t = 0; t < nq * dim; t++)
            set(q, f64, t, uniform01(&seed));
        for (int64_t t = 0; t < np * dim; t++)
            set(p, f64, t, uniform01(&seed));
    }

    sr_ctx *ctx = NULL;
    sr_status st = sr_ctx_new(&ctx);
    if (st != SR_OK) {
        fprintf(stderr, "%s: sr_ctx_new failed: %s\n", prog, sr_status_str(st));
        return 1;
    }

    /* The formula, by builder calls: a failure anywhere makes the chain NULL, and
     * sr_kernel_new then reports the first failing call with its message. */
    sr_expr *d = sr_sqdist(ctx, sr_vi(ctx, 0, (int)dim), sr_vj(ctx, 1, (int)dim));

    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.reduction = SR_ARGKMIN;
    desc.k = k;
    desc.dtype = f64 ? SR_F64 : SR_F32;
    desc.device = device;
    sr_kernel *kargk = NULL, *kboth = NULL;
    double t0 = now_s();
    st = sr_kernel_new(ctx, d, &desc, &kargk);
    if (st != SR_OK)
        fail(ctx, "sr_kernel_new (ArgKMin)", st);
    double t_new = now_s() - t0;
    desc.reduction = SR_KMIN_ARGKMIN;
    st = sr_kernel_new(ctx, d, &desc, &kboth);
    if (st != SR_OK)
        fail(ctx, "sr_kernel_new (KMin_ArgKMin)", st);

    int64_t *idx = xmalloc((size_t)(nq * k) * sizeof *idx);
    int64_t *idx2 = xmalloc((size_t)(nq * k) * sizeof *idx2);
    void *dist = xmalloc((size_t)(nq * k) * esz);
    const void *args[] = {q, p};

    /* Time the compiled kernels: wait for their background compiles (the first calls would
     * otherwise run on the tile interpreter while the modules compile). */
    t0 = now_s();
    sr_kernel_wait(kargk, -1);
    sr_kernel_wait(kboth, -1);
    double t_wait = now_s() - t0;

    /* ArgKMin has one output, the indices: sr_kernel_run. */
    t0 = now_s();
    st = sr_kernel_run(kargk, nq, np, args, idx);
    if (st != SR_OK)
        fail(ctx, "sr_kernel_run (ArgKMin)", st);
    double t_run = now_s() - t0;

    /* KMin_ArgKMin has two, values and indices: sr_kernel_run_ex, which also checks the number
     * of arrays. */
    sr_run_desc run = {.nx = nq, .ny = np, .nargs = 2, .args = args, .out = dist, .out_idx = idx2};
    t0 = now_s();
    st = sr_kernel_run_ex(kboth, &run);
    if (st != SR_OK)
        fail(ctx, "sr_kernel_run_ex (KMin_ArgKMin)", st);
    double t_run2 = now_s() - t0;

    double pairs = (double)nq * (double)np;
    printf("symred %s: %d nearest neighbours, %lld queries among %lld points, D = %lld, %s\n",
           sr_version(), k, (long long)nq, (long long)np, (long long)dim,
           f64 ? "float64" : "float32");
    printf("data: %s\n", source);
    if (!quiet)
        printf("---- sr_kernel_explain (ArgKMin) ----\n%s-------------------------------------\n",
               sr_kernel_explain(kargk));
    printf("kernel creation: %.3f ms, then %.3f s until the compiled modules were ready\n",
           1e3 * t_new, t_wait);
    printf("ArgKMin run: %.3f s, %.1f M pairs/s\n", t_run, t_run > 0 ? pairs / t_run * 1e-6 : 0.0);
    printf("KMin_ArgKMin run: %.3f s, %.1f M pairs/s\n", t_run2,
           t_run2 > 0 ? pairs / t_run2 * 1e-6 : 0.0);
    if (nq > 0 && k > 0)
        printf("query 0: nearest point %lld at squared distance %.6g\n", (long long)idx2[0],
               get(dist, f64, 0));

    int status = 0;
    if (check) {
        int64_t step = pairs <= 4e6 ? 1 : (nq + 99) / 100;
        struct cand *work = xmalloc((size_t)np * sizeof *work);
        int64_t checked = 0;
        for (int64_t i = 0; i < nq && status == 0; i += step) {
            status |= check_query(q, p, f64, i, np, dim, k, idx, NULL, tol, work, "ArgKMin");
            status |= check_query(q, p, f64, i, np, dim, k, idx2, dist, tol, work, "KMin_ArgKMin");
            checked++;
        }
        free(work);
        if (status == 0)
            printf("check: %lld queries match a brute-force sort (tolerance %.3g)\n",
                   (long long)checked, tol);
    }

    sr_kernel_free(kargk);
    sr_kernel_free(kboth);
    sr_ctx_free(ctx);
    free(q);
    free(p);
    free(idx);
    free(idx2);
    free(dist);
    return status;
}
