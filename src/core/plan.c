/*
 * plan.c — choosing a kernel's plan among its backend's candidates, and saying why.
 *
 * sr_kernel_new is validate -> plan -> realise: the backend offers candidate plans
 * (struct sr_plan: strategy, tiles, workspace, estimated cost, why) without compiling anything,
 * core chooses here, and the backend realises the choice. Rewrites that serve one strategy (the
 * SqDist expansion for a gemm) are taken by that strategy when it is realised
 * (sr__simp_take_gemm_form), never before the choice.
 */
#include "core.h"

#include <stdio.h>
#include <string.h>

const struct sr_plan *sr__plan_choose(sr_kernel *k)
{
    const struct sr_plan *c = NULL;
    for (int i = 0; i < k->nplans; i++) {
        k->plans[i].chosen = !c && k->plans[i].feasible;
        if (k->plans[i].chosen)
            c = &k->plans[i];
    }
    return c;
}

const struct sr_plan *sr__plan_reject(sr_kernel *k, const char *why)
{
    for (int i = 0; i < k->nplans; i++)
        if (k->plans[i].chosen) {
            k->plans[i].chosen = false;
            k->plans[i].feasible = false;
            snprintf(k->plans[i].why, sizeof k->plans[i].why, "%s", why);
        }
    return sr__plan_choose(k);
}

static void plan_line(const struct sr_plan *p, struct expr_buf *b)
{
    expr_buf_printf(b, "  %s %s: ",
                    p->chosen     ? "chosen:"
                    : p->feasible ? "alternative:"
                                  : "rejected:",
                    p->strategy);
    if (p->gemm_flops > 0)
        expr_buf_printf(b, "%.0f flops per pair in the tile product + %.0f in generated code",
                        p->gemm_flops, p->flops);
    else if (p->flops > 0)
        expr_buf_printf(b, "%.0f flops per pair in generated code", p->flops);
    else
        expr_buf_printf(b, "no cost estimate");
    if (p->ti > 0)
        expr_buf_printf(b, ", tiles %d x %d", p->ti, p->tj);
    if (p->workspace > 0)
        expr_buf_printf(b, ", workspace at least %lld bytes per thread", (long long)p->workspace);
    if (p->why[0])
        expr_buf_printf(b, "; %s", p->why);
    expr_buf_printf(b, "\n");
}

void sr__plan_explain(const sr_kernel *k, struct expr_buf *b)
{
    if (k->nplans == 0)
        return;
    expr_buf_printf(b, "plans (in order of preference, the first feasible one chosen; estimated "
                       "cost per pair):\n");
    for (int i = 0; i < k->nplans; i++)
        plan_line(&k->plans[i], b);
}
