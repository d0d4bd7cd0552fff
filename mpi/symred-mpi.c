/*
 * symred-mpi.c — symred kernels over blocks of rows spread over the ranks of a communicator:
 * the ring of blocks, the agreement on errors, and the kernels whose partial results combine
 * (combine.c). Only the public API of symred.h is used.
 */
#include <symred_mpi.h>

#include "combine.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MSG_MAX 1024

struct sr_mpi {
    MPI_Comm comm;
    int rank, size;
    sr_ctx *ctx;
    char msg[MSG_MAX];
};

/* A variable of the formula: its category (-1 when the index is not used) and dimension. */
typedef struct mpi_var {
    int cat;
    int dim;
} mpi_var;

/* A kernel of the K-reductions with a shorter list, for blocks with fewer rows than K. */
typedef struct short_kernel {
    int k;
    sr_kernel *kernel;
} short_kernel;

struct sr_mpi_kernel {
    sr_mpi *m;
    const sr_expr *f;
    sr_kernel_desc desc;  /* the user's */
    sr_kernel_desc inner; /* the kernel whose partial results combine */
    sr_kernel *main;      /* inner reduction, list length desc.k */
    sr_kernel *lse;       /* SumSoftMaxWeight: LogSumExp of F; else NULL */
    short_kernel *shorts; /* K-reductions: kernels for k < desc.k, made as blocks need them */
    int nshorts;
    int nargs;
    mpi_var *vars;
    int out_dim;              /* of the user's reduction */
    int fdim;                 /* values per list entry of the inner kernel */
    double compute_s, wait_s; /* of the last run on this rank */
};

/* ---- messages and agreement ------------------------------------------------------------ */

static sr_status fail(sr_mpi *m, sr_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->msg, sizeof m->msg, fmt, ap);
    va_end(ap);
    return st;
}

static sr_status fail_mpi(sr_mpi *m, int rc, const char *call)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    return fail(m, SR_EIO, "%s failed: %s", call, text);
}

/* A failure of a symred call, with the context's message. */
static sr_status fail_sr(sr_mpi *m, sr_status st, const char *what)
{
    return fail(m, st, "%s: %s: %s", what, sr_status_str(st), sr_ctx_error(m->ctx));
}

/*
 * Collective: every rank passes its local status and gets back the status of the lowest rank
 * that failed, with that rank's message ("rank R: ...") in m->msg; SR_OK if none failed. This
 * is what turns an error on one rank into the same error on all of them.
 */
static sr_status agree(sr_mpi *m, sr_status st)
{
    int mine = st != SR_OK ? m->rank : m->size, first = 0;
    int rc = MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, m->comm);
    if (rc != MPI_SUCCESS)
        return fail_mpi(m, rc, "MPI_Allreduce");
    if (first == m->size)
        return SR_OK;
    struct {
        int status;
        char msg[MSG_MAX];
    } what = {st, ""};
    if (m->rank == first)
        snprintf(what.msg, sizeof what.msg, "rank %d: %.1000s", first, m->msg);
    rc = MPI_Bcast(&what, (int)sizeof what, MPI_BYTE, first, m->comm);
    if (rc != MPI_SUCCESS)
        return fail_mpi(m, rc, "MPI_Bcast");
    memcpy(m->msg, what.msg, sizeof m->msg);
    m->msg[sizeof m->msg - 1] = '\0';
    return (sr_status)what.status;
}

/* ---- the communicator -------------------------------------------------------------------- */

sr_status sr_mpi_new(sr_ctx *ctx, MPI_Comm comm, sr_mpi **out)
{
    if (out)
        *out = NULL;
    if (!ctx || !out || comm == MPI_COMM_NULL)
        return SR_EINVAL;
    sr_mpi *m = calloc(1, sizeof *m);
    if (!m)
        return SR_ENOMEM;
    m->ctx = ctx;
    if (MPI_Comm_dup(comm, &m->comm) != MPI_SUCCESS) {
        free(m);
        return SR_EIO;
    }
    if (MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
        MPI_Comm_rank(m->comm, &m->rank) != MPI_SUCCESS ||
        MPI_Comm_size(m->comm, &m->size) != MPI_SUCCESS) {
        MPI_Comm_free(&m->comm);
        free(m);
        return SR_EIO;
    }
    *out = m;
    return SR_OK;
}

sr_status sr_mpi_new_f(sr_ctx *ctx, MPI_Fint comm, sr_mpi **out)
{
    return sr_mpi_new(ctx, MPI_Comm_f2c(comm), out);
}

void sr_mpi_free(sr_mpi *m)
{
    if (!m)
        return;
    /* Garbage-collected callers (Python) may free after MPI_Finalize: then only memory. */
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized)
        MPI_Comm_free(&m->comm);
    free(m);
}

const char *sr_mpi_error(const sr_mpi *m) { return m ? m->msg : "no sr_mpi (NULL)"; }

int sr_mpi_rank(const sr_mpi *m) { return m ? m->rank : 0; }

int sr_mpi_size(const sr_mpi *m) { return m ? m->size : 0; }

/* ---- kernels ------------------------------------------------------------------------------ */

/* The formula text of e (printed by symred, canonical), malloc'ed; NULL on out-of-memory. */
static char *print_expr(const sr_expr *e)
{
    size_t len = sr_expr_print(e, NULL, 0);
    char *text = malloc(len + 1);
    if (text)
        sr_expr_print(e, text, len + 1);
    return text;
}

/*
 * Records the category and dimension of every variable of e from its printed text, where
 * symred writes each variable as Var(index,dim,cat) (symred.h: sr_expr_print). This is how the
 * layer learns which arrays travel around the ring without a function of the core API for it.
 */
static sr_status scan_vars(sr_mpi *m, const sr_expr *e, mpi_var *vars, int nvars)
{
    char *text = print_expr(e);
    if (!text)
        return fail(m, SR_ENOMEM, "out of memory printing the formula");
    for (const char *p = strstr(text, "Var("); p; p = strstr(p + 4, "Var(")) {
        long long ind, dim, cat;
        if (sscanf(p, "Var(%lld,%lld,%lld)", &ind, &dim, &cat) != 3)
            continue;
        if (ind >= 0 && ind < nvars && cat >= 0 && cat <= 2) {
            vars[ind].cat = (int)cat;
            vars[ind].dim = (int)dim;
        }
    }
    free(text);
    return SR_OK;
}

/* rank 0's formula, weight and description as one string, to compare on every rank. */
static char *signature(const sr_expr *f, const sr_kernel_desc *d)
{
    char *ft = print_expr(f), *wt = d->weight ? print_expr(d->weight) : NULL;
    char *sig = NULL;
    if (ft && (wt || !d->weight)) {
        size_t len = strlen(ft) + (wt ? strlen(wt) : 0) + 128;
        sig = malloc(len);
        if (sig)
            snprintf(sig, len, "%s|%s|reduction %d axis %d k %d dtype %d device %d acc %d", ft,
                     wt ? wt : "", (int)d->reduction, d->axis, d->k, (int)d->dtype, (int)d->device,
                     (int)d->acc);
    }
    free(ft);
    free(wt);
    return sig;
}

/* Collective: SR_EINVAL on the ranks whose formula or description differs from rank 0's. sig
 * is NULL on a rank that already failed; rank 0 failing skips the comparison. */
static sr_status compare_with_rank0(sr_mpi *m, const char *sig)
{
    long long len = sig ? (long long)strlen(sig) + 1 : -1;
    int rc = MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, m->comm);
    if (rc != MPI_SUCCESS)
        return fail_mpi(m, rc, "MPI_Bcast");
    if (len < 0)
        return SR_OK;
    if (len > INT_MAX)
        return fail(m, SR_EOVERFLOW, "the formula text is too long to broadcast");
    char *root = m->rank == 0 ? (char *)sig : malloc((size_t)len);
    sr_status st = SR_OK;
    /* A rank without memory for rank 0's text still takes part in the broadcast. */
    char one = 0;
    rc = MPI_Bcast(root ? root : &one, root ? (int)len : 0, MPI_CHAR, 0, m->comm);
    if (rc != MPI_SUCCESS)
        st = fail_mpi(m, rc, "MPI_Bcast");
    else if (!root)
        st = fail(m, SR_ENOMEM, "out of memory comparing the formula with rank 0's");
    else if (sig && strcmp(root, sig) != 0)
        st = fail(m, SR_EINVAL,
                  "the formula or kernel description differs from rank 0's (rank 0: %.300s; "
                  "here: %.300s)",
                  root, sig);
    if (root != sig)
        free(root);
    return st;
}

/* Creates the inner kernels and learns the variables; local. */
static sr_status kernel_setup(sr_mpi_kernel *k)
{
    sr_mpi *m = k->m;
    sr_status st = sr_kernel_new(m->ctx, k->f, &k->desc, &k->main);
    if (st != SR_OK)
        return fail_sr(m, st, "sr_kernel_new");
    /* The user's reduction checked everything; its output width is what the user gets. */
    k->out_dim = sr_kernel_out_dim(k->main);
    k->nargs = sr_kernel_nargs(k->main);
    sr_kernel_free(k->main);
    k->main = NULL;
    k->inner = k->desc;
    k->inner.reduction = mpi_rules_of(k->desc.reduction)->partial;
    st = sr_kernel_new(m->ctx, k->f, &k->inner, &k->main);
    if (st != SR_OK)
        return fail_sr(m, st, "sr_kernel_new (partial states)");
    if (mpi_rules_of(k->desc.reduction)->family == SR_RED_FAM_SSMW) {
        sr_kernel_desc d = k->desc;
        d.reduction = SR_LOGSUMEXP;
        d.weight = NULL;
        st = sr_kernel_new(m->ctx, k->f, &d, &k->lse);
        if (st != SR_OK)
            return fail_sr(m, st, "sr_kernel_new (LogSumExp of the softmax)");
    }
    const enum sr_red_family fam = mpi_rules_of(k->desc.reduction)->family;
    k->fdim = fam == SR_RED_FAM_KSEL ? sr_kernel_out_dim(k->main) / k->desc.k
                                     : sr_kernel_out_dim(k->main);
    k->vars = malloc((size_t)k->nargs * sizeof *k->vars);
    if (!k->vars)
        return fail(m, SR_ENOMEM, "out of memory");
    for (int v = 0; v < k->nargs; v++)
        k->vars[v] = (mpi_var){-1, 0};
    st = scan_vars(m, k->f, k->vars, k->nargs);
    if (st == SR_OK && k->desc.weight)
        st = scan_vars(m, k->desc.weight, k->vars, k->nargs);
    return st;
}

sr_status sr_mpi_kernel_new(sr_mpi *m, const sr_expr *f, const sr_kernel_desc *desc,
                            sr_mpi_kernel **out)
{
    if (out)
        *out = NULL;
    if (!m)
        return SR_EINVAL; /* no communicator to agree on: a programming error, local */
    sr_status st = SR_OK;
    sr_mpi_kernel *k = NULL;
    char *sig = NULL;
    if (!desc || !out)
        st = fail(m, SR_EINVAL, "sr_mpi_kernel_new: desc and out must not be NULL");
    else if ((unsigned)desc->reduction >= SR_REDUCTION_COUNT)
        st = fail(m, SR_EINVAL, "sr_mpi_kernel_new: unknown reduction %d", (int)desc->reduction);
    else if (desc->dtype != SR_F32 && desc->dtype != SR_F64)
        st = fail(m, SR_ENOTSUP,
                  "sr_mpi_kernel_new: dtype must be SR_F32 or SR_F64, not %d (the ring exchanges "
                  "float32 or float64 blocks)",
                  (int)desc->dtype);
    else if (!(k = calloc(1, sizeof *k)))
        st = fail(m, SR_ENOMEM, "out of memory");
    if (st == SR_OK) {
        k->m = m;
        k->f = f;
        k->desc = *desc;
        st = kernel_setup(k);
    }
    if (st == SR_OK && !(sig = signature(f, desc)))
        st = fail(m, SR_ENOMEM, "out of memory");
    sr_status cmp = compare_with_rank0(m, st == SR_OK ? sig : NULL);
    free(sig);
    st = agree(m, st != SR_OK ? st : cmp);
    if (st != SR_OK) {
        sr_mpi_kernel_free(k);
        return st;
    }
    *out = k;
    return SR_OK;
}

void sr_mpi_kernel_free(sr_mpi_kernel *k)
{
    if (!k)
        return;
    sr_kernel_free(k->main);
    sr_kernel_free(k->lse);
    for (int s = 0; s < k->nshorts; s++)
        sr_kernel_free(k->shorts[s].kernel);
    free(k->shorts);
    free(k->vars);
    free(k);
}

int sr_mpi_kernel_out_dim(const sr_mpi_kernel *k) { return k ? k->out_dim : 0; }

int sr_mpi_kernel_nargs(const sr_mpi_kernel *k) { return k ? k->nargs : 0; }

/* The kernel for a block with list length kb (the K-reductions), made once; local. */
static sr_status short_kernel_get(sr_mpi_kernel *k, int kb, sr_kernel **out)
{
    if (kb >= k->desc.k || mpi_rules_of(k->desc.reduction)->family != SR_RED_FAM_KSEL) {
        *out = k->main;
        return SR_OK;
    }
    for (int s = 0; s < k->nshorts; s++)
        if (k->shorts[s].k == kb) {
            *out = k->shorts[s].kernel;
            return SR_OK;
        }
    short_kernel *grown = realloc(k->shorts, (size_t)(k->nshorts + 1) * sizeof *grown);
    if (!grown)
        return fail(k->m, SR_ENOMEM, "out of memory");
    k->shorts = grown;
    sr_kernel_desc d = k->inner;
    d.k = kb;
    sr_status st = sr_kernel_new(k->m->ctx, k->f, &d, out);
    if (st != SR_OK)
        return fail_sr(k->m, st, "sr_kernel_new (a block shorter than K)");
    k->shorts[k->nshorts++] = (short_kernel){kb, *out};
    return SR_OK;
}

/* ---- running ------------------------------------------------------------------------------ */

/* Everything one run needs; filled by run_prepare, released by run_release. */
typedef struct ring {
    int own_cat, ring_cat; /* category of the rows that stay, and of the rows that travel */
    int64_t n_own;         /* rows of the results on this rank */
    int64_t *counts;       /* rows of each rank's travelling block */
    int64_t *offsets;      /* their global index of the first row */
    int64_t max_count;
    size_t esz;
    int *ring_vars; /* indices of the travelling variables */
    int nring;
    size_t *var_off; /* their offsets in a ring buffer */
    size_t buf_bytes;
    char *buf[2];
    void **params; /* broadcast parameter values, per variable index (NULL otherwise) */
    void *tmp_val, *tmp_lse;
    int64_t *tmp_idx;
    int64_t chunk;     /* own rows per kernel call: MPI progresses between calls */
    const void **data; /* per variable index: the travelling block's array at this step */
    const void **args; /* per variable index: the arrays of one kernel call */
    MPI_Request *reqs; /* a send and a receive per travelling variable */
    mpi_state state;
} ring;

static void run_release(ring *r, int nargs)
{
    free(r->counts);
    free(r->offsets);
    free(r->ring_vars);
    free(r->var_off);
    free(r->buf[0]);
    free(r->buf[1]);
    for (int v = 0; r->params && v < nargs; v++)
        free(r->params[v]);
    free(r->params);
    free(r->tmp_val);
    free(r->tmp_lse);
    free(r->tmp_idx);
    free(r->data);
    free(r->args);
    free(r->reqs);
    mpi_state_free(&r->state);
}

/* The caller's arguments, checked locally. */
static sr_status run_check(sr_mpi_kernel *k, const sr_run_desc *run)
{
    sr_mpi *m = k->m;
    if (!run)
        return fail(m, SR_EINVAL, "sr_mpi_kernel_run: run must not be NULL");
    if (run->nx < 0 || run->ny < 0)
        return fail(m, SR_EINVAL, "sr_mpi_kernel_run: negative sizes nx = %lld, ny = %lld",
                    (long long)run->nx, (long long)run->ny);
    if (run->nargs != k->nargs || (!run->args && k->nargs > 0))
        return fail(m, SR_EINVAL, "sr_mpi_kernel_run: the formula takes %d arrays, %d given",
                    k->nargs, run->args ? run->nargs : 0);
    for (int v = 0; v < k->nargs; v++) {
        int cat = k->vars[v].cat;
        int64_t rows = cat == SR_CAT_I ? run->nx : cat == SR_CAT_J ? run->ny : 1;
        int needed = cat == SR_CAT_PARAM ? m->rank == 0 : cat >= 0 && rows > 0;
        if (needed && !run->args[v])
            return fail(m, SR_EINVAL, "sr_mpi_kernel_run: array %d (%s) is NULL", v,
                        cat == SR_CAT_PARAM ? "a parameter, needed on rank 0" : "a variable");
    }
    int64_t n_own = k->desc.axis == 1 ? run->nx : run->ny;
    if (n_own > 0 && mpi_rules_of(k->desc.reduction)->values && !run->out)
        return fail(m, SR_EINVAL, "sr_mpi_kernel_run: %s writes values: out must not be NULL",
                    sr_reduction_name(k->desc.reduction));
    if (n_own > 0 && mpi_rules_of(k->desc.reduction)->indices && !run->out_idx)
        return fail(m, SR_EINVAL, "sr_mpi_kernel_run: %s writes indices: out_idx must not be NULL",
                    sr_reduction_name(k->desc.reduction));
    return SR_OK;
}

static MPI_Datatype mpi_type(sr_dtype dtype) { return dtype == SR_F64 ? MPI_DOUBLE : MPI_FLOAT; }

/* Collective: the block sizes of every rank, and the checks that follow from them (the same
 * outcome on every rank, so no agreement is needed). */
static sr_status run_counts(sr_mpi_kernel *k, const sr_run_desc *run, ring *r)
{
    sr_mpi *m = k->m;
    int P = m->size;
    int64_t mine = k->desc.axis == 1 ? run->ny : run->nx;
    r->counts = malloc((size_t)P * sizeof *r->counts);
    r->offsets = malloc((size_t)P * sizeof *r->offsets);
    sr_status st = agree(m, r->counts && r->offsets ? SR_OK : fail(m, SR_ENOMEM, "out of memory"));
    if (st != SR_OK)
        return st;
    int rc = MPI_Allgather(&mine, 1, MPI_INT64_T, r->counts, 1, MPI_INT64_T, m->comm);
    if (rc != MPI_SUCCESS)
        return fail_mpi(m, rc, "MPI_Allgather");
    int64_t total = 0;
    r->max_count = 0;
    for (int p = 0; p < P; p++) {
        r->offsets[p] = total;
        total += r->counts[p];
        if (r->counts[p] > r->max_count)
            r->max_count = r->counts[p];
    }
    const char *reduced = k->desc.axis == 1 ? "ny" : "nx";
    if (mpi_rules_of(k->desc.reduction)->family == SR_RED_FAM_KSEL && k->desc.k > total)
        return fail(m, SR_EINVAL,
                    "sr_mpi_kernel_run: k = %d is more than the %lld rows reduced over (%s "
                    "summed over the ranks)",
                    k->desc.k, (long long)total, reduced);
    for (int v = 0; v < k->nargs; v++)
        if (k->vars[v].cat == r->ring_cat && r->max_count > INT_MAX / k->vars[v].dim)
            return fail(m, SR_EOVERFLOW,
                        "sr_mpi_kernel_run: a block of %lld rows of array %d (dimension %d) is "
                        "too large for one MPI message",
                        (long long)r->max_count, v, k->vars[v].dim);
    return SR_OK;
}

/* Local: the buffers, the partial state and the short kernels of this run. */
static sr_status run_alloc(sr_mpi_kernel *k, ring *r)
{
    sr_mpi *m = k->m;
    const enum sr_red_family fam = mpi_rules_of(k->desc.reduction)->family;
    r->ring_vars = malloc((size_t)(k->nargs ? k->nargs : 1) * sizeof *r->ring_vars);
    r->var_off = malloc((size_t)(k->nargs ? k->nargs : 1) * sizeof *r->var_off);
    r->params = calloc((size_t)(k->nargs ? k->nargs : 1), sizeof *r->params);
    r->data = calloc((size_t)(k->nargs ? k->nargs : 1), sizeof *r->data);
    r->args = calloc((size_t)(k->nargs ? k->nargs : 1), sizeof *r->args);
    r->reqs = malloc((size_t)(2 * k->nargs + 1) * sizeof *r->reqs);
    if (!r->ring_vars || !r->var_off || !r->params || !r->data || !r->args || !r->reqs)
        return fail(m, SR_ENOMEM, "out of memory");
    for (int v = 0; v < k->nargs; v++) {
        size_t row = (size_t)k->vars[v].dim * r->esz;
        if (k->vars[v].cat == r->ring_cat) {
            r->var_off[r->nring] = r->buf_bytes;
            r->ring_vars[r->nring++] = v;
            r->buf_bytes += (size_t)r->max_count * row;
        } else if (k->vars[v].cat == SR_CAT_PARAM && !(r->params[v] = malloc(row)))
            return fail(m, SR_ENOMEM, "out of memory");
    }
    if (m->size > 1)
        for (int b = 0; b < 2; b++)
            if (!(r->buf[b] = malloc(r->buf_bytes ? r->buf_bytes : 1)))
                return fail(m, SR_ENOMEM, "out of memory for a ring buffer of %zu bytes",
                            r->buf_bytes);
    r->chunk = r->n_own;
    if (m->size > 1 && r->n_own > 1024) /* 8 calls per block, MPI progressing in between */
        r->chunk = (r->n_own + 7) / 8 > 1024 ? (r->n_own + 7) / 8 : 1024;
    size_t per_row = (size_t)sr_kernel_out_dim(k->main);
    size_t tmp = (size_t)(r->chunk ? r->chunk : 1) * per_row;
    r->tmp_val = malloc(tmp * r->esz);
    if (!r->tmp_val)
        return fail(m, SR_ENOMEM, "out of memory");
    if (mpi_family_indexed(fam) && !(r->tmp_idx = malloc(tmp * sizeof *r->tmp_idx)))
        return fail(m, SR_ENOMEM, "out of memory");
    if (fam == SR_RED_FAM_SSMW &&
        !(r->tmp_lse = malloc((size_t)(r->chunk ? r->chunk : 1) * r->esz)))
        return fail(m, SR_ENOMEM, "out of memory");
    const sr_status sst =
        mpi_state_init(&r->state, mpi_rules_of(k->desc.reduction), r->n_own, k->fdim, k->desc.k);
    if (sst == SR_EINVAL)
        return fail(m, sst, "no rule combines the blocks of this reduction");
    if (sst != SR_OK)
        return fail(m, SR_ENOMEM, "out of memory for the partial results of %lld rows",
                    (long long)r->n_own);
    /* Blocks shorter than K need kernels of their own, made now, before the ring starts. */
    for (int p = 0; fam == SR_RED_FAM_KSEL && p < m->size; p++) {
        sr_kernel *unused;
        if (r->counts[p] > 0 && r->counts[p] < k->desc.k) {
            sr_status st = short_kernel_get(k, (int)r->counts[p], &unused);
            if (st != SR_OK)
                return st;
        }
    }
    return SR_OK;
}

/* Collective: rank 0's parameter values, on every rank. */
static sr_status run_params(sr_mpi_kernel *k, const sr_run_desc *run, ring *r)
{
    sr_mpi *m = k->m;
    for (int v = 0; v < k->nargs; v++) {
        if (k->vars[v].cat != SR_CAT_PARAM)
            continue;
        if (m->rank == 0)
            memcpy(r->params[v], run->args[v], (size_t)k->vars[v].dim * r->esz);
        int rc = MPI_Bcast(r->params[v], k->vars[v].dim, mpi_type(k->desc.dtype), 0, m->comm);
        if (rc != MPI_SUCCESS)
            return fail_mpi(m, rc, "MPI_Bcast");
    }
    return SR_OK;
}

/* Local: the partial results of own rows against block b, whose arrays are data[v], folded
 * into the state; between chunks of rows, MPI progresses the requests in flight. */
static sr_status run_block(sr_mpi_kernel *k, const sr_run_desc *run, ring *r, int b,
                           MPI_Request *reqs, int nreqs)
{
    sr_mpi *m = k->m;
    const enum sr_red_family fam = mpi_rules_of(k->desc.reduction)->family;
    int64_t nb = r->counts[b];
    int kb = fam == SR_RED_FAM_KSEL ? (int)(nb < k->desc.k ? nb : k->desc.k) : 1;
    sr_kernel *kernel = k->main;
    sr_status st = short_kernel_get(k, kb, &kernel);
    const void **args = r->args;
    for (int64_t r0 = 0; st == SR_OK && r0 < r->n_own; r0 += r->chunk) {
        int64_t nr = r->n_own - r0 < r->chunk ? r->n_own - r0 : r->chunk;
        for (int v = 0; v < k->nargs; v++) {
            int cat = k->vars[v].cat;
            if (cat == r->own_cat)
                args[v] = (const char *)run->args[v] + (size_t)r0 * k->vars[v].dim * r->esz;
            else if (cat == r->ring_cat)
                args[v] = r->data[v];
            else
                args[v] = cat == SR_CAT_PARAM ? r->params[v] : NULL;
        }
        sr_run_desc d = {.nx = k->desc.axis == 1 ? nr : nb,
                         .ny = k->desc.axis == 1 ? nb : nr,
                         .nargs = k->nargs,
                         .args = args,
                         .out = r->tmp_val,
                         .out_idx = r->tmp_idx};
        st = sr_kernel_run_ex(kernel, &d);
        if (st == SR_OK && r->tmp_lse) {
            d.out = r->tmp_lse;
            d.out_idx = NULL;
            d.nargs = sr_kernel_nargs(k->lse); /* F alone may use fewer arrays than F and G */
            st = sr_kernel_run_ex(k->lse, &d);
        }
        if (st != SR_OK) {
            fail_sr(m, st, "sr_kernel_run_ex");
            break;
        }
        mpi_state_fold(&r->state, r0, nr, r->tmp_val, r->tmp_idx, r->tmp_lse, kb, r->offsets[b],
                       k->desc.dtype);
        int done;
        if (nreqs > 0)
            MPI_Testall(nreqs, reqs, &done, MPI_STATUSES_IGNORE);
    }
    if (st == SR_OK)
        mpi_state_next_block(&r->state, kb);
    return st;
}

/* Collective: the ring. At step s this rank holds the block of rank (rank - s) mod P, sends it
 * on to rank + 1 and receives the next one from rank - 1 while it computes. The pattern of
 * messages never depends on the outcome of the computation, so a rank whose kernel failed
 * keeps passing blocks on and nobody waits forever; the failure is agreed on afterwards. */
static sr_status run_ring(sr_mpi_kernel *k, const sr_run_desc *run, ring *r)
{
    sr_mpi *m = k->m;
    int P = m->size, right = (m->rank + 1) % P, left = (m->rank + P - 1) % P;
    MPI_Datatype type = mpi_type(k->desc.dtype);
    sr_status st = SR_OK;
    double t_compute = 0.0, t_wait = 0.0;
    for (int s = 0; s < P; s++) {
        int b = (m->rank + P - s) % P, next = (b + P - 1) % P, nreqs = 0;
        for (int t = 0; t < r->nring; t++) {
            int v = r->ring_vars[t];
            r->data[v] = s == 0 ? run->args[v] : r->buf[s % 2] + r->var_off[t];
        }
        for (int t = 0; s + 1 < P && t < r->nring; t++) {
            int v = r->ring_vars[t], dim = k->vars[v].dim;
            int rc = MPI_Irecv(r->buf[(s + 1) % 2] + r->var_off[t], (int)r->counts[next] * dim,
                               type, left, t, m->comm, &r->reqs[nreqs++]);
            if (rc == MPI_SUCCESS)
                rc = MPI_Isend(r->data[v], (int)r->counts[b] * dim, type, right, t, m->comm,
                               &r->reqs[nreqs++]);
            if (rc != MPI_SUCCESS && st == SR_OK)
                st = fail_mpi(m, rc, "MPI_Isend/MPI_Irecv");
        }
        double t0 = MPI_Wtime();
        if (st == SR_OK && r->counts[b] > 0 && r->n_own > 0)
            st = run_block(k, run, r, b, r->reqs, nreqs);
        double t1 = MPI_Wtime();
        if (nreqs > 0) {
            int rc = MPI_Waitall(nreqs, r->reqs, MPI_STATUSES_IGNORE);
            if (rc != MPI_SUCCESS && st == SR_OK)
                st = fail_mpi(m, rc, "MPI_Waitall");
        }
        t_compute += t1 - t0;
        t_wait += MPI_Wtime() - t1;
    }
    k->compute_s = t_compute;
    k->wait_s = t_wait;
    return st;
}

sr_status sr_mpi_kernel_run(sr_mpi_kernel *k, const sr_run_desc *run)
{
    if (!k)
        return SR_EINVAL; /* no communicator to agree on: a programming error, local */
    sr_mpi *m = k->m;
    ring r;
    memset(&r, 0, sizeof r);
    sr_status st = agree(m, run_check(k, run));
    if (st != SR_OK)
        return st;
    r.own_cat = k->desc.axis == 1 ? SR_CAT_I : SR_CAT_J;
    r.ring_cat = k->desc.axis == 1 ? SR_CAT_J : SR_CAT_I;
    r.n_own = k->desc.axis == 1 ? run->nx : run->ny;
    r.esz = k->desc.dtype == SR_F64 ? sizeof(double) : sizeof(float);
    st = run_counts(k, run, &r);
    if (st == SR_OK)
        st = agree(m, run_alloc(k, &r));
    if (st == SR_OK)
        st = run_params(k, run, &r);
    if (st == SR_OK)
        st = agree(m, run_ring(k, run, &r));
    if (st == SR_OK && r.n_own > 0)
        mpi_state_write(&r.state, mpi_rules_of(k->desc.reduction)->values ? run->out : NULL,
                        mpi_rules_of(k->desc.reduction)->indices ? run->out_idx : NULL,
                        k->desc.dtype);
    run_release(&r, k->nargs);
    return st;
}

void sr_mpi_kernel_times(const sr_mpi_kernel *k, double *compute_s, double *wait_s)
{
    if (compute_s)
        *compute_s = k ? k->compute_s : 0.0;
    if (wait_s)
        *wait_s = k ? k->wait_s : 0.0;
}
