/*
 * test-cache.c — the CPU JIT's kernel cache: memory and disk hits, a corrupt, truncated,
 * foreign (another key's) or FIFO entry rebuilt, unsafe directories (writable by others, a
 * symbolic link, below a writable non-sticky parent) refused with SR_EIO and a message saying
 * how to fix it, concurrent processes.
 *
 * Each test uses a fresh temporary SYMRED_CACHE_DIR, so most tests compile once (cold).
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "symred.h"
#include "util.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/symred-cache-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    chmod(dir, 0700);
    setenv("SYMRED_CACHE_DIR", dir, 1);
    unsetenv("SYMRED_CC");
    unsetenv("SYMRED_JIT_KEEP");
}
static void teardown(void)
{
    char cmd[200];
    chmod(dir, 0700);
    snprintf(cmd, sizeof cmd, "umount '%s/mnt' 2>/dev/null; rm -rf '%s'", dir, dir);
    cr_assert_eq(system(cmd), 0);
}
TestSuite(cache, .init = setup, .fini = teardown);

static const char *aliases[] = {"x=Vi(2)", "y=Vj(2)", "g=Pm(1)"};

/* A new context in *ctx, text parsed in it (*f), and the status of creating its Sum kernel (*k)
 * with the default descriptor. */
static sr_status new_kernel_in(const char *text, sr_ctx **ctx, sr_expr **f, sr_kernel **k)
{
    cr_assert_eq(sr_ctx_new(ctx), SR_OK);
    *f = NULL;
    cr_assert_eq(sr_parse(*ctx, text, aliases, 3, f), SR_OK, "%s", sr_ctx_error(*ctx));
    sr_kernel_desc d = sr_kernel_desc_default();
    *k = NULL;
    return sr_kernel_new(*ctx, *f, &d, k);
}

/* What a kernel's plan says of its module (sr_plan_info), copied: the kernel is gone by then.
 * path is "" when the plan names none. */
struct built {
    char module[16], cache[256], path[512];
};

/* Builds `formula` in a new context, checks one result, and returns what its plan says of its
 * module. */
static struct built build_and_check(const char *formula, double gval)
{
    sr_ctx *ctx;
    sr_expr *f;
    sr_kernel *k;
    cr_assert_eq(new_kernel_in(formula, &ctx, &f, &k), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert(tu_runs_jit(k), "not the JIT:\n%s", sr_kernel_explain(k));
    sr_plan_info p = tu_plan(k);
    cr_assert(p.module && p.module_cache, "no module:\n%s", sr_kernel_explain(k));
    struct built b;
    snprintf(b.module, sizeof b.module, "%s", p.module);
    snprintf(b.cache, sizeof b.cache, "%s", p.module_cache);
    snprintf(b.path, sizeof b.path, "%s", p.module_path ? p.module_path : "");
    /* Sum_j exp(-g |x - y_j|^2) with x = 0 and y = (0,0), (1,0), (0,2). */
    float x[2] = {0, 0}, y[6] = {0, 0, 1, 0, 0, 2}, g = (float)gval, out[1];
    const void *args[] = {x, y, &g};
    cr_assert_eq(sr_kernel_run(k, 1, 3, args, out), SR_OK, "%s", sr_ctx_error(ctx));
    double expect = 1.0 + exp(-gval) + exp(-4.0 * gval);
    cr_assert(tu_close(out[0], expect, 1e-5, 0), "got %.8g, expected %.8g", out[0], expect);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
    return b;
}

static const char *formula = "Exp(-SqDist(x, y) * g)";

/* b came from module (sr_plan_info.module), and the disk cache's part began with cache. */
static void expect_module(struct built b, const char *module, const char *cache)
{
    cr_assert_str_eq(b.module, module, "module from %s, cache %s", b.module, b.cache);
    cr_assert(strncmp(b.cache, cache, strlen(cache)) == 0, "module from %s, cache %s, not %s...",
              b.module, b.cache, cache);
}

/* The cached shared object of b. */
static const char *path_of(const struct built *b)
{
    cr_assert(b->path[0], "no path: module from %s, cache %s", b->module, b->cache);
    return b->path;
}

static int count_entries(void)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "exit $(ls '%s' | grep -c '\\.so$')", dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(cache, second_creation_hits_disk)
{
    expect_module(build_and_check(formula, 0.5), "compiled", "miss");
    expect_module(build_and_check(formula, 0.5), "disk", "hit");
    cr_assert_eq(count_entries(), 1);
}

/* A second kernel, whose module is another entry than formula's. */
static const char *other_formula = "Exp(-SqDist(x, y) * g * g)";

/* Both entries on disk: formula's and other_formula's (built in a context freed at once). */
static void store_both(void)
{
    build_and_check(formula, 0.5);
    sr_ctx *c;
    sr_expr *f;
    sr_kernel *k;
    cr_assert_eq(new_kernel_in(other_formula, &c, &f, &k), SR_OK, "%s", sr_ctx_error(c));
    sr_kernel_free(k);
    sr_ctx_free(c);
}

/* Runs other_formula in a new context, expecting its own values, not those of the module that its
 * descriptor's name once found. */
static void expect_other_runs_its_own(void)
{
    sr_ctx *c;
    sr_expr *f;
    sr_kernel *k;
    cr_assert_eq(new_kernel_in(other_formula, &c, &f, &k), SR_OK, "%s", sr_ctx_error(c));
    float x[2] = {0, 0}, y[6] = {0, 0, 1, 0, 0, 2}, g = 0.5f, out[1];
    const void *args[] = {x, y, &g};
    cr_assert_eq(sr_kernel_run(k, 1, 3, args, out), SR_OK, "%s", sr_ctx_error(c));
    double expect = 1.0 + exp(-0.25) + exp(-1.0);
    cr_expect(tu_close(out[0], expect, 1e-5, 0),
              "got %.8g, expected %.8g (the other module's code?)", out[0], expect);
    sr_kernel_free(k);
    sr_ctx_free(c);
}

/* One module loaded by several contexts (one kept, `sharers` freed): each later context's
 * descriptor finds the loaded object by the file's identity, and the loader keeps the name the
 * descriptor was loaded through as one more name of it. Once those contexts are freed their
 * numbers are reused, and another kernel's entry opened under such a number must load its own
 * code, not the object that name once found. */
static void sharers_then_other(int sharers)
{
    store_both();
    sr_expr *f;
    sr_ctx *keep, *share[64];
    sr_kernel *kk, *ks[64];
    cr_assert_leq(sharers, 64);
    cr_assert_eq(new_kernel_in(formula, &keep, &f, &kk), SR_OK, "%s", sr_ctx_error(keep));
    for (int i = 0; i < sharers; i++)
        cr_assert_eq(new_kernel_in(formula, &share[i], &f, &ks[i]), SR_OK, "%s",
                     sr_ctx_error(share[i]));
    for (int i = 0; i < sharers; i++) {
        sr_kernel_free(ks[i]);
        sr_ctx_free(share[i]);
    }
    expect_other_runs_its_own();
    sr_kernel_free(kk);
    sr_ctx_free(keep);
}

Test(cache, reused_descriptor_names_load_their_own_module) { sharers_then_other(8); }

/* More numbers left as names of the loaded object than any fixed number of retries. */
Test(cache, many_stale_names_load_their_own_module) { sharers_then_other(40); }

/* The loaded object's own name can be the stale one: the context that first loaded it freed while
 * later ones that found it by the file's identity keep it loaded. Another kernel's entry opened
 * under that number is dup'd away from it, and the number it takes instead may be one more stale
 * name of the same object: the descriptor it leaves under the object's own name (open on the new
 * entry) must not pass that object for the new entry's code. */
Test(cache, stale_own_name_loads_its_own_module)
{
    store_both();
    sr_expr *f;
    /* first loads the object under its descriptor's name; share1 and share2 find it by the file's
     * identity (two more names); freeing first and share1 leaves share2 holding it, both of
     * those names stale. */
    sr_ctx *first, *share1, *share2;
    sr_kernel *k1, *k2, *k3;
    cr_assert_eq(new_kernel_in(formula, &first, &f, &k1), SR_OK, "%s", sr_ctx_error(first));
    cr_assert_eq(new_kernel_in(formula, &share1, &f, &k2), SR_OK, "%s", sr_ctx_error(share1));
    cr_assert_eq(new_kernel_in(formula, &share2, &f, &k3), SR_OK, "%s", sr_ctx_error(share2));
    sr_kernel_free(k1);
    sr_ctx_free(first);
    sr_kernel_free(k2);
    sr_ctx_free(share1);
    expect_other_runs_its_own();
    sr_kernel_free(k3);
    sr_ctx_free(share2);
}

/* The process's open descriptors. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A long-lived process creating and freeing kernels the way a library built on symred does:
 * contexts come and go while others keep their modules loaded, formulas repeat (memory and disk
 * hits) among several distinct ones. Every creation succeeds and runs its own code, and a loaded
 * module holds no descriptor: the count stays flat. */
Test(cache, thousands_of_loads_keep_descriptors_flat, .timeout = 300)
{
    enum { FORMULAS = 12, LIVE = 7, LOADS = 2000 };
    char text[FORMULAS][64];
    for (int q = 0; q < FORMULAS; q++)
        snprintf(text[q], sizeof text[q], "Exp(-SqDist(x, y) * g * %d)", q + 2);
    sr_ctx *live[LIVE] = {0};
    sr_kernel *lk[LIVE] = {0};
    int before = open_fds(), most = before;
    float x[2] = {0, 0}, y[6] = {0, 0, 1, 0, 0, 2}, g = 0.5f, out[1];
    const void *args[] = {x, y, &g};
    unsigned r = 12345;
    for (int i = 0; i < LOADS; i++) {
        r = r * 1103515245u + 12345u;
        int q = (int)(r >> 16) % FORMULAS, s = i % LIVE;
        if (live[s]) {
            sr_kernel_free(lk[s]);
            sr_ctx_free(live[s]);
        }
        sr_expr *f;
        cr_assert_eq(new_kernel_in(text[q], &live[s], &f, &lk[s]), SR_OK, "load %d: %s", i,
                     sr_ctx_error(live[s]));
        cr_assert_eq(sr_kernel_run(lk[s], 1, 3, args, out), SR_OK, "%s", sr_ctx_error(live[s]));
        double expect = 1.0 + exp(-0.5 * (q + 2)) + exp(-2.0 * (q + 2));
        cr_assert(tu_close(out[0], expect, 1e-5, 0),
                  "load %d of formula %d: got %.8g, expected %.8g (another module's code?)", i, q,
                  out[0], expect);
        int n = open_fds();
        most = n > most ? n : most;
    }
    for (int s = 0; s < LIVE; s++) {
        sr_kernel_free(lk[s]);
        sr_ctx_free(live[s]);
    }
    cr_assert_eq(count_entries(), FORMULAS);
    cr_assert_leq(most, before + 2, "%d descriptors open at most, %d before", most, before);
    cr_assert_eq(open_fds(), before);
}

/* A context keeps SYMRED_JIT_IDLE_MODULES modules that no kernel uses; the least recently used
 * beyond that is unloaded, and its kernel created again loads it from the disk cache. */
Test(cache, idle_modules_beyond_the_limit_unloaded)
{
    const char *texts[] = {formula, other_formula, "Exp(-SqDist(x, y) * g * 3)"};
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    cr_assert_eq(sr_ctx_set_option(ctx, "SYMRED_JIT_IDLE_MODULES", "1"), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    const char *expect[] = {"compiled", "compiled", "compiled", "memory", "disk"};
    const int order[] = {0, 1, 2, 2, 0};
    for (int i = 0; i < 5; i++) {
        sr_expr *f;
        sr_kernel *k;
        cr_assert_eq(sr_parse(ctx, texts[order[i]], aliases, 3, &f), SR_OK);
        cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
        const char *m = tu_plan(k).module;
        cr_assert(m && strcmp(m, expect[i]) == 0, "creation %d: module from %s, not %s", i,
                  m ? m : "nowhere", expect[i]);
        sr_kernel_free(k);
    }
    sr_ctx_free(ctx);
}

Test(cache, same_context_hits_memory)
{
    sr_ctx *ctx;
    cr_assert_eq(sr_ctx_new(&ctx), SR_OK);
    sr_expr *f = NULL;
    cr_assert_eq(sr_parse(ctx, formula, aliases, 3, &f), SR_OK);
    sr_kernel_desc d = sr_kernel_desc_default();
    sr_kernel *k1, *k2;
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k1), SR_OK, "%s", sr_ctx_error(ctx));
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k2), SR_OK, "%s", sr_ctx_error(ctx));
    const char *m = tu_plan(k2).module;
    cr_assert(m && strcmp(m, "memory") == 0, "module from %s", m ? m : "nowhere");
    sr_kernel_free(k1);
    sr_kernel_free(k2);
    sr_ctx_free(ctx);
}

Test(cache, directory_created_private)
{
    char sub[128];
    snprintf(sub, sizeof sub, "%s/a/b", dir);
    setenv("SYMRED_CACHE_DIR", sub, 1);
    build_and_check(formula, 0.25);
    struct stat sb;
    cr_assert_eq(stat(sub, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0700, "mode %o", (unsigned)(sb.st_mode & 0777));
}

/* After the entry of `formula` was spoiled: the next creation compiles (and gives the right
 * values, build_and_check), the one after hits the rebuilt entry. */
static void expect_rebuilt(double gval, const char *spoiled)
{
    struct built b2 = build_and_check(formula, gval);
    cr_assert_str_eq(b2.module, "compiled", "the %s entry was used", spoiled);
    expect_module(build_and_check(formula, gval), "disk", "hit");
}

static void corrupt_and_rebuild(int truncate_it)
{
    struct built b1 = build_and_check(formula, 1.5);
    const char *path = path_of(&b1);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0, "%s", path);
    if (truncate_it) {
        cr_assert_eq(truncate(path, sb.st_size / 2), 0);
    } else {
        /* Same size, a few bytes in the middle flipped: dlopen might accept it, the checksum
         * does not. */
        FILE *f = fopen(path, "r+b");
        cr_assert_not_null(f);
        fseek(f, sb.st_size / 2, SEEK_SET);
        fwrite("\xde\xad\xbe\xef", 1, 4, f);
        fclose(f);
    }
    expect_rebuilt(1.5, "corrupt");
}

Test(cache, truncated_entry_rebuilt) { corrupt_and_rebuild(1); }
Test(cache, corrupt_entry_rebuilt) { corrupt_and_rebuild(0); }

Test(cache, garbage_entry_rebuilt)
{
    struct built b1 = build_and_check(formula, 0.75);
    FILE *f = fopen(path_of(&b1), "wb");
    cr_assert_not_null(f);
    fputs("not a shared object", f);
    fclose(f);
    cr_assert_str_eq(build_and_check(formula, 0.75).module, "compiled");
}

/* Kernel creation in an unsafe cache directory fails with SR_EIO and a message containing
 * `why`; nothing is stored there; once the directory is fixed the same context works. */
static void expect_refused(const char *why)
{
    sr_ctx *ctx;
    sr_expr *f;
    sr_kernel *k;
    sr_kernel_desc d = sr_kernel_desc_default();
    cr_assert_eq(new_kernel_in(formula, &ctx, &f, &k), SR_EIO,
                 "an unsafe cache directory was used");
    cr_assert_null(k);
    const char *msg = sr_ctx_error(ctx);
    cr_assert(strstr(msg, "refused") && strstr(msg, why) && strstr(msg, "chmod 700"), "%s", msg);
    cr_assert_eq(count_entries(), 0, "something was stored in the unsafe directory");
    cr_assert_eq(chown(dir, geteuid(), getegid()), 0);
    cr_assert_eq(chmod(dir, 0700), 0);
    cr_assert_eq(sr_kernel_new(ctx, f, &d, &k), SR_OK, "%s", sr_ctx_error(ctx));
    sr_kernel_free(k);
    sr_ctx_free(ctx);
}

Test(cache, world_writable_dir_refused)
{
    cr_assert_eq(chmod(dir, 0777), 0);
    expect_refused("writable by group or others");
}

Test(cache, group_writable_dir_refused)
{
    cr_assert_eq(chmod(dir, 0770), 0);
    expect_refused("writable by group or others");
}

Test(cache, foreign_owner_refused)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to give the directory away");
    cr_assert_eq(chown(dir, 65534, 65534), 0);
    expect_refused("not owned by the user");
}

Test(cache, disabled_cache_still_compiles)
{
    setenv("SYMRED_CACHE_DIR", "off", 1);
    expect_module(build_and_check(formula, 0.5), "compiled", "off");
}

Test(cache, keep_source)
{
    setenv("SYMRED_JIT_KEEP", "1", 1);
    struct built b = build_and_check(formula, 0.5);
    const char *path = path_of(&b);
    size_t n = strlen(path);
    cr_assert(n > 2 && strcmp(path + n - 2, ".c") == 0, "path %s", path);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    char line[128] = {0};
    cr_assert_not_null(fgets(line, sizeof line, f));
    fclose(f);
    cr_assert(strstr(line, "symred generated kernel"), "%s", line);
}

/* Several processes compiling the same kernel into the same empty cache all succeed. */
Test(cache, concurrent_processes)
{
    enum { NPROC = 8 };
    pid_t pids[NPROC];
    for (int p = 0; p < NPROC; p++) {
        pids[p] = fork();
        cr_assert(pids[p] >= 0);
        if (pids[p] == 0) {
            build_and_check("Exp(-SqDist(x, y) * g) + 0", 0.5);
            _exit(0);
        }
    }
    for (int p = 0; p < NPROC; p++) {
        int st = 0;
        cr_assert_eq(waitpid(pids[p], &st, 0), pids[p]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x", p, st);
    }
    expect_module(build_and_check("Exp(-SqDist(x, y) * g) + 0", 0.5), "disk", "hit");
    cr_assert_eq(count_entries(), 1);
}

/* A FIFO in place of an entry: opening it must not block (a FIFO with no writer would), and it is
 * replaced by a rebuilt regular file. */
Test(cache, fifo_entry_rebuilt, .timeout = 60)
{
    struct built b1 = build_and_check(formula, 0.3);
    const char *path = path_of(&b1);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_assert_str_eq(build_and_check(formula, 0.3).module, "compiled");
    struct stat sb;
    cr_assert_eq(lstat(path, &sb), 0);
    cr_assert(S_ISREG(sb.st_mode), "the entry is still not a regular file (mode %o)",
              (unsigned)sb.st_mode);
}

/* A whole, valid entry of another formula copied under this formula's name is not this key's:
 * it is rejected and rebuilt (the values checked by build_and_check are this formula's), and
 * the rebuilt entry is then a hit. */
Test(cache, foreign_entry_rejected)
{
    static const char *other = "Exp(-SqDist(x, y) * g) * 3";
    struct built ba = build_and_check(formula, 0.5);
    sr_ctx *ctx;
    sr_expr *f;
    sr_kernel *k;
    cr_assert_eq(new_kernel_in(other, &ctx, &f, &k), SR_OK, "%s", sr_ctx_error(ctx));
    char pa[512], pb[512], cmd[1200];
    snprintf(pa, sizeof pa, "%s", path_of(&ba));
    const char *kp = tu_plan(k).module_path;
    cr_assert_not_null(kp, "no path:\n%s", sr_kernel_explain(k));
    snprintf(pb, sizeof pb, "%s", kp);
    cr_assert(strcmp(pa, pb) != 0, "two formulas, one entry %s", pa);
    sr_kernel_free(k);
    sr_ctx_free(ctx);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", pb, pa);
    cr_assert_eq(system(cmd), 0);
    expect_rebuilt(0.5, "foreign");
}

/* Kernel creation with the cache at sub fails with SR_EIO and a message containing why and
 * "refused"; nothing is stored. */
static void expect_path_refused(const char *sub, const char *why)
{
    setenv("SYMRED_CACHE_DIR", sub, 1);
    sr_ctx *ctx;
    sr_expr *f;
    sr_kernel *k;
    cr_assert_eq(new_kernel_in(formula, &ctx, &f, &k), SR_EIO, "the cache %s was used", sub);
    const char *msg = sr_ctx_error(ctx);
    cr_assert(strstr(msg, "refused") && strstr(msg, why), "%s", msg);
    sr_ctx_free(ctx);
}

/* A cache directory that is a symbolic link is refused, and the message says so. */
Test(cache, symlinked_dir_refused)
{
    char real[128], link[128];
    snprintf(real, sizeof real, "%s/real", dir);
    snprintf(link, sizeof link, "%s/link", dir);
    cr_assert_eq(mkdir(real, 0700), 0);
    cr_assert_eq(symlink(real, link), 0);
    expect_path_refused(link, "symbolic link");
}

/* A parent directory that others may write to (and that is not sticky) lets them replace the
 * cache directory: refused, as ssh refuses such paths. A sticky one (/tmp's 1777) is fine. */
Test(cache, writable_parent_refused)
{
    char parent[128], sub[160];
    snprintf(parent, sizeof parent, "%s/shared", dir);
    snprintf(sub, sizeof sub, "%s/cache", parent);
    cr_assert_eq(mkdir(parent, 0700), 0);
    cr_assert_eq(chmod(parent, 0777), 0);
    expect_path_refused(sub, "writable by group or others");
    cr_assert_eq(chmod(parent, 0770), 0);
    expect_path_refused(sub, parent);
    cr_assert_eq(chmod(parent, 01777), 0);
    setenv("SYMRED_CACHE_DIR", sub, 1);
    build_and_check(formula, 0.5);
}

/* A cache directory on a small tmpfs of the test's own (root only; skipped elsewhere), mounted
 * at mnt with the cache directory mnt/cache created and set as SYMRED_CACHE_DIR. */
static bool mount_tmpfs(char *mnt, size_t cap, const char *size)
{
    snprintf(mnt, cap, "%s/mnt", dir);
    cr_assert_eq(mkdir(mnt, 0700), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=%s,mode=0700 symred-test '%s' 2>/dev/null",
             size, mnt);
    if (geteuid() != 0 || system(cmd) != 0)
        return false;
    snprintf(cmd, sizeof cmd, "%s/cache", mnt);
    cr_assert_eq(mkdir(cmd, 0700), 0);
    setenv("SYMRED_CACHE_DIR", cmd, 1);
    return true;
}
static void unmount_tmpfs(const char *mnt)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "umount '%s'", mnt);
    cr_assert_eq(system(cmd), 0);
}

/* A read-only cache: kernels compile in a private temporary directory (and work). */
Test(cache, read_only_dir_falls_back)
{
    char mnt[128], cmd[300];
    if (!mount_tmpfs(mnt, sizeof mnt, "1m"))
        cr_skip_test("cannot mount a tmpfs here");
    snprintf(cmd, sizeof cmd, "mount -o remount,ro '%s'", mnt);
    cr_assert_eq(system(cmd), 0);
    struct built b = build_and_check(formula, 0.5);
    expect_module(b, "compiled", "off");
    cr_assert(strstr(b.cache, "not writable"), "cache %s", b.cache);
    unmount_tmpfs(mnt);
}

/* A full cache: the same. */
Test(cache, full_dir_falls_back)
{
    char mnt[128], cmd[400];
    if (!mount_tmpfs(mnt, sizeof mnt, "64k"))
        cr_skip_test("cannot mount a tmpfs here");
    snprintf(cmd, sizeof cmd, "dd if=/dev/zero of='%s/fill' bs=4k 2>/dev/null", mnt);
    cr_assert_neq(system(cmd), 0, "dd filled a 64k tmpfs without an error");
    struct built b = build_and_check(formula, 0.5);
    expect_module(b, "compiled", "off");
    cr_assert(strstr(b.cache, "not writable"), "cache %s", b.cache);
    unmount_tmpfs(mnt);
}

/* Build directories and temporary files tmp-* left by processes killed mid-compile are removed
 * once older than any compile can run (an hour here); fresh ones (a compile running now) and
 * other files stay. */
Test(cache, stale_build_dirs_swept)
{
    char p[256];
    static const char *const names[] = {"tmp-stale", "tmp-fresh", "tmp-stalefile", "keep-old"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (i == 2 || i == 3) {
            FILE *f = fopen(p, "w");
            cr_assert_not_null(f);
            fclose(f);
        } else {
            cr_assert_eq(mkdir(p, 0700), 0);
            char q[300];
            snprintf(q, sizeof q, "%s/kernel.c", p);
            FILE *f = fopen(q, "w");
            cr_assert_not_null(f);
            fclose(f);
        }
        if (i != 1) {
            struct timeval tv[2] = {{time(NULL) - 2 * 86400, 0}, {time(NULL) - 2 * 86400, 0}};
            cr_assert_eq(utimes(p, tv), 0);
        }
    }
    build_and_check(formula, 0.5);
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        bool gone = access(p, F_OK) != 0;
        cr_assert_eq(gone, i == 0 || i == 2, "%s: %s", names[i], gone ? "removed" : "still there");
    }
}
