/*
 * main.c — a tiny program built against an installed symred (see tests/install/run.sh).
 *
 * It checks that the header and the library agree on the version, and runs one small kernel
 * (out_i = Sum_j SqDist(x_i, y_j)) against values worked out by hand.
 */
#include <symred.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    if (strcmp(sr_version(), SYMRED_VERSION_STRING) != 0) {
        fprintf(stderr, "consumer: header version %s, library version %s\n", SYMRED_VERSION_STRING,
                sr_version());
        return 1;
    }
    sr_ctx *ctx = NULL;
    if (sr_ctx_new(&ctx) != SR_OK)
        return 1;
    sr_expr *f = sr_sqdist(ctx, sr_vi(ctx, 0, 2), sr_vj(ctx, 1, 2));
    sr_kernel_desc desc = sr_kernel_desc_default();
    desc.dtype = SR_F64;
    sr_kernel *k = NULL;
    sr_status st = sr_kernel_new(ctx, f, &desc, &k);
    const double x[] = {0, 0, 1, 2}, y[] = {1, 0, 0, 1, 3, 3};
    double out[2] = {0, 0};
    const void *args[] = {x, y};
    if (st == SR_OK)
        st = sr_kernel_run(k, 2, 3, args, out);
    if (st != SR_OK) {
        fprintf(stderr, "consumer: %s: %s\n", sr_status_str(st), sr_ctx_error(ctx));
        return 1;
    }
    sr_kernel_free(k);
    sr_ctx_free(ctx);
    if (fabs(out[0] - 20.0) > 1e-12 || fabs(out[1] - 11.0) > 1e-12) {
        fprintf(stderr, "consumer: got %g %g, want 20 11\n", out[0], out[1]);
        return 1;
    }
    printf("consumer: symred %s works (%g %g)\n", sr_version(), out[0], out[1]);
    return 0;
}
