/*
 * mini-criterion.h — the part of Criterion's API that tests/test-threads.c uses, run in-process,
 * for the ThreadSanitizer build (scripts/test.sh builds test-threads.c twice: as a Criterion test
 * and, with this header, as tsan-threads).
 *
 * Why not Criterion itself: its runner maps an arena shared with the forked test processes at an
 * address that collides with ThreadSanitizer's shadow memory, so a TSan-instrumented Criterion
 * test aborts at start ("Could not initialize inheritable arena") or crashes in libcriterion in
 * most runs (seen with Criterion 2.4.1 and clang 14). Here every test runs in the main process,
 * one after the other; a failed assertion prints and jumps back to the runner, a failed
 * expectation prints and goes on. Assertions belong in the main thread only.
 */
#ifndef SYMRED_MINI_CRITERION_H
#define SYMRED_MINI_CRITERION_H

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct mc_suite {
    void (*init)(void);
    void (*fini)(void);
};

struct mc_test {
    const char *name;
    void (*fn)(void);
    const struct mc_suite *suite;
};

static struct mc_test mc_tests[64];
static int mc_ntests, mc_failed;
static jmp_buf mc_jump;

static void mc_register(const char *name, void (*fn)(void), const struct mc_suite *suite)
{
    if (mc_ntests < 64)
        mc_tests[mc_ntests++] = (struct mc_test){name, fn, suite};
}

__attribute__((format(printf, 4, 5))) static void mc_report(const char *file, int line,
                                                            const char *cond, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s:%d: failed: %s:", file, line, cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    mc_failed++;
}

#define TestSuite(s, ...) static const struct mc_suite s##_suite = {__VA_ARGS__}
#define Test(s, n, ...)                                                                            \
    static void s##_##n(void);                                                                     \
    __attribute__((constructor)) static void s##_##n##_reg(void)                                   \
    {                                                                                              \
        mc_register(#s "::" #n, s##_##n, &s##_suite);                                              \
    }                                                                                              \
    static void s##_##n(void)

#define cr_expect(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond))                                                                               \
            mc_report(__FILE__, __LINE__, #cond, " " __VA_ARGS__);                                 \
    } while (0)
#define cr_assert(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            mc_report(__FILE__, __LINE__, #cond, " " __VA_ARGS__);                                 \
            longjmp(mc_jump, 1);                                                                   \
        }                                                                                          \
    } while (0)
#define cr_assert_eq(a, b, ...)     cr_assert((a) == (b), __VA_ARGS__)
#define cr_assert_not_null(p, ...)  cr_assert((p) != NULL, __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) cr_assert(strcmp((a), (b)) == 0, __VA_ARGS__)
#define cr_expect_eq(a, b, ...)     cr_expect((a) == (b), __VA_ARGS__)
#define cr_expect_null(p, ...)      cr_expect((p) == NULL, __VA_ARGS__)
#define cr_skip_test(...)                                                                          \
    do {                                                                                           \
        fprintf(stderr, "skipped: " __VA_ARGS__);                                                  \
        fprintf(stderr, "\n");                                                                     \
        longjmp(mc_jump, 2);                                                                       \
    } while (0)

/* 0 when fn returned, 1 after a failed assertion, 2 after a skip. Its own frame, so that no
 * variable of the caller lives across the longjmp. */
static int mc_call(void (*fn)(void))
{
    int jumped = setjmp(mc_jump);
    if (!jumped)
        fn();
    return jumped;
}

int main(void)
{
    for (int t = 0; t < mc_ntests; t++) {
        const struct mc_test *T = &mc_tests[t];
        int before = mc_failed;
        int jumped = T->suite->init ? mc_call(T->suite->init) : 0;
        if (!jumped)
            jumped = mc_call(T->fn);
        if (T->suite->fini && mc_call(T->suite->fini) == 1 && jumped == 0)
            jumped = 1;
        printf("[%s] %s\n", jumped == 2 ? "SKIP" : mc_failed > before ? "FAIL" : "PASS", T->name);
    }
    printf("%d tests, %d failures\n", mc_ntests, mc_failed);
    return mc_failed ? 1 : 0;
}

#endif
