/*
 * cost.c — the cost model: flop-equivalents and bytes per pair of a formula DAG, and the
 * decision it drives (when SqDist becomes norms + an inner product for the GEMM path).
 *
 * The unit is a "flop-equivalent": one add or multiply of one component. Division and square
 * root count 4, exp and log 10, trigonometric functions 15, pow 20: the rough throughput ratios
 * of vectorised code on the AVX-512 machines this library targets. The model
 * only has to rank alternatives, not predict times.
 */
#include "formulas.h"

#include <math.h>
#include <string.h>
#include <stdlib.h>

double simp_op_flops(const sr_expr *e)
{
    const struct expr_flops *f = &expr_ops[e->op].flops;
    double d = e->dim;
    double a = expr_arity(e) ? e->child[0]->dim : 0;
    double b = expr_arity(e) > 1 ? e->child[1]->dim : 0;
    switch (f->rule) {
    case FLOPS_LINEAR:
        return f->per_out * d + f->per_a * a + f->per_b * b + f->fixed;
    case FLOPS_POW: {
        double n = fabs((double)e->iattr[0]);
        return d * (n > 1 ? ceil(log2(n)) + 1 : 1) + (e->iattr[0] < 0 ? 4 * d : 0);
    }
    case FLOPS_TENSORDOT:
        return 2 * d * (double)expr_tdot_of(e)->ncont;
    case FLOPS_WEIGHTED: { /* a is the weight, b the point: diagonal, isotropic or full */
        double x = b, w = a;
        double base = w == 1 ? 2 * x + 1 : w == x ? 3 * x : 2 * w + 2 * x;
        return base + (e->op == OP_WEIGHTEDSQDIST ? x : 0);
    }
    }
    return d;
}

static bool is_pair(const sr_expr *e) { return (e->deps & (DEP_I | DEP_J)) == (DEP_I | DEP_J); }

void simp_cost_estimate(const sr_expr *const *roots, int nroots, unsigned red_dep, size_t esize,
                        bool hoist, struct sr_cost *c)
{
    memset(c, 0, sizeof *c);
    unsigned out_dep = red_dep == DEP_J ? DEP_I : DEP_J;
    for (int r = 0; r < nroots; r++) {
        if (!roots[r])
            continue;
        size_t cnt = expr_toposort(roots[r], NULL, 0);
        const sr_expr **order = malloc((cnt ? cnt : 1) * sizeof *order);
        if (!order)
            return;
        expr_toposort(roots[r], order, cnt);
        for (size_t i = 0; i < cnt; i++) {
            const sr_expr *e = order[i];
            double fl = simp_op_flops(e);
            if (!e->deps)
                continue; /* constants are folded or computed once when the kernel is built */
            if (!hoist || is_pair(e))
                c->flops_pair += fl;
            else if (e->deps & out_dep)
                c->flops_row += fl;
            else if (e->deps & red_dep)
                c->flops_col += fl;
            else
                c->flops_call += fl;
            /* Bytes: what the per-pair work reads that changes with the reduced index —
             * variables, or hoisted terms when hoisting is on. Each counted once. */
            bool consumer = hoist ? is_pair(e) : e->op != OP_VAR;
            if (!consumer)
                continue;
            for (int k = 0; k < expr_arity(e); k++) {
                const sr_expr *h = e->child[k];
                bool input = hoist ? !is_pair(h) : h->op == OP_VAR;
                if (!input || !(h->deps & red_dep) || (h->deps & out_dep))
                    continue;
                /* Counted at its first consumer in topological order (quadratic, but
                 * formulas are small and this runs once per kernel). */
                bool seen = false;
                for (size_t q = 0; q < i && !seen; q++) {
                    const sr_expr *p = order[q];
                    bool pc = hoist ? is_pair(p) : p->op != OP_VAR;
                    if (!pc)
                        continue;
                    for (int kk = 0; kk < expr_arity(p); kk++)
                        seen |= p->child[kk] == h;
                }
                for (int kk = 0; kk < k; kk++)
                    seen |= e->child[kk] == h;
                if (!seen)
                    c->bytes_pair += (double)h->dim * (double)esize;
            }
        }
        free(order);
    }
}

/*
 * The rewritten form SqNorm2(x) + SqNorm2(y) - 2(x|y) only pays when the backend computes the
 * inner products as GEMM tiles, and the backend takes that path from SR_GEMM_MIN_DIM on: the
 * crossover measured with bench/bench-gemm (see formulas.h). Below it the direct SqDist is cheaper.
 */
int simp_cost_gemm_min_dim(void) { return SR_GEMM_MIN_DIM; }

bool simp_cost_gemm_wins(const sr_expr *a, const sr_expr *b, const struct simp_opts *o)
{
    if (o->gemm_min_dim <= 0 || a->dim < o->gemm_min_dim)
        return false;
    bool ab = !(a->deps & DEP_J) && !(b->deps & DEP_I);
    bool ba = !(a->deps & DEP_I) && !(b->deps & DEP_J);
    /* Both sides must vary (one with i, one with j): otherwise there is no matrix product. */
    return (ab || ba) && (a->deps & (DEP_I | DEP_J)) && (b->deps & (DEP_I | DEP_J));
}
