/*
 * exit-child.c — a program that leaves while a background compile runs, for test-fork-exit.c.
 *
 *   exit-child CACHE_DIR COMPILER return|exit
 *
 * Creates a kernel with SYMRED_JIT=async and the given compiler and cache directory, runs it
 * once on the tile interpreter, waits until the compiler has started (its script writes the file
 * CACHE_DIR/../pgid) and the test has seen it (it writes CACHE_DIR/../go), then returns from
 * main or calls exit(0) at once, with the context still open. Exit status 0 when all that went
 * as planned, 1 otherwise.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "symred.h"

/* The program leaves with its context open, on purpose: nothing to report under ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "detect_leaks=0"; }

/* Leaves with status 1, saying which step failed (the test shows it). */
static int fail(const char *what, sr_ctx *ctx)
{
    fprintf(stderr, "exit-child: %s%s%s\n", what, ctx ? ": " : "", ctx ? sr_ctx_error(ctx) : "");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return fail("usage: exit-child CACHE_DIR COMPILER return|exit", NULL);
    setenv("SYMRED_CACHE_DIR", argv[1], 1);
    setenv("SYMRED_CC", argv[2], 1);
    setenv("SYMRED_JIT", "async", 1);
    setenv("SYMRED_COMPILE_TIMEOUT", "60", 1);
    char pgid_file[4200], go_file[4200];
    snprintf(pgid_file, sizeof pgid_file, "%s/../pgid", argv[1]);
    snprintf(go_file, sizeof go_file, "%s/../go", argv[1]);
    sr_ctx *ctx;
    if (sr_ctx_new(&ctx) != SR_OK)
        return fail("sr_ctx_new failed", NULL);
    static const char *const al[] = {"x=Vi(3)", "y=Vj(3)", "b=Vj(1)"};
    sr_expr *f = NULL;
    sr_kernel *k = NULL;
    if (sr_parse(ctx, "Exp(-SqDist(x, y)) * b", al, 3, &f) != SR_OK)
        return fail("sr_parse", ctx);
    sr_kernel_desc d = sr_kernel_desc_default();
    d.device = SR_DEVICE_CPU;
    if (sr_kernel_new(ctx, f, &d, &k) != SR_OK)
        return fail("sr_kernel_new", ctx);
    float x[6] = {0, 0, 0, 1, 1, 1}, y[3] = {0, 0, 0}, b[1] = {2}, out[2];
    const void *args[] = {x, y, b};
    if (sr_kernel_run(k, 2, 1, args, out) != SR_OK)
        return fail("sr_kernel_run", ctx);
    if (out[0] != 2.0f)
        return fail("the first call's value is not 2", NULL);
    /* The compiler writes its process group before it sleeps; the test says go once it has
     * seen the group running. */
    for (int i = 0; i < 6000 && access(go_file, R_OK) != 0; i++)
        usleep(5000);
    if (access(pgid_file, R_OK) != 0)
        return fail("the compiler never wrote its process group", NULL);
    if (access(go_file, R_OK) != 0)
        return fail("the test never said go", NULL);
    if (strcmp(argv[3], "exit") == 0)
        exit(0);
    return 0;
}
