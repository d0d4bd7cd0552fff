/*
 * emu-nvrtc.c — NVRTC emulated with the system C++ compiler, for the CUDA emulator's tests.
 *
 * nvrtcCompileProgram writes the program's source after the prelude of CUDA built-ins
 * (emu-prelude.h, forced in with -include), appends one wrapper per __global__ entry point
 * (found by scanning the source, so new kernels need no change here), and compiles it with g++
 * (or $SYMRED_CUDA_EMU_CXX) into a shared object in a cache directory, named by a hash of
 * everything that goes into it: a rerun loads it without compiling. The "PTX" it returns names
 * that shared object, which the emulated cuModuleLoadData dlopen()s, and carries the source, from
 * which it is built again when the object has gone (a cleaned cache under symred's own cache of
 * images, which keeps the "PTX").
 *
 * Options: the architecture, the language standard and the other code-generation options of
 * NVRTC are accepted and ignored (--use_fast_math included: the CPU's fast-math would drop
 * NaN semantics that CUDA's keeps); -D and -I are passed on; anything else is
 * NVRTC_ERROR_INVALID_OPTION, as NVRTC does. No cubin entry point: symred then asks for PTX.
 * The cache directory is $SYMRED_CUDA_EMU_CACHE, else $TMPDIR (or /tmp) /symred-cuda-emu-UID; it
 * must belong to the user and be writable by no one else (its objects are loaded).
 */
#define _GNU_SOURCE
#include "emu.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

enum {
    NVRTC_SUCCESS = 0,
    NVRTC_ERROR_OUT_OF_MEMORY = 1,
    NVRTC_ERROR_PROGRAM_CREATION_FAILURE = 2,
    NVRTC_ERROR_INVALID_INPUT = 3,
    NVRTC_ERROR_INVALID_PROGRAM = 4,
    NVRTC_ERROR_INVALID_OPTION = 5,
    NVRTC_ERROR_COMPILATION = 6,
    NVRTC_ERROR_INTERNAL_ERROR = 11,
};

struct nvrtc_prog_ {
    char *src;
    char *log; /* the compiler's output of the last compile */
    char *ptx; /* EMU_PTX_MAGIC and the shared object's path, after a successful compile */
};

/* A growing string; on out of memory it stays NULL and the caller reports it. */
struct str {
    char *s;
    size_t n, cap;
    bool oom;
};

static void put(struct str *b, const char *p, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->oom = true;
            return;
        }
        b->s = s, b->cap = cap;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void puts_(struct str *b, const char *p) { put(b, p, strlen(p)); }

/* ---- entry points ---------------------------------------------------------------------------- */

static bool ident_char(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Skips a comment, string, character literal or preprocessor line at s[i] (returns the index
 * after it), or returns i when there is none. */
static size_t skip_noise(const char *s, size_t i, bool line_start)
{
    if (s[i] == '/' && s[i + 1] == '/') {
        while (s[i] && s[i] != '\n')
            i++;
    } else if (s[i] == '/' && s[i + 1] == '*') {
        const char *e = strstr(s + i + 2, "*/");
        i = e ? (size_t)(e - s) + 2 : strlen(s);
    } else if (s[i] == '"' || s[i] == '\'') {
        char q = s[i++];
        while (s[i] && s[i] != q)
            i += s[i] == '\\' && s[i + 1] ? 2 : 1;
        if (s[i])
            i++;
    } else if (line_start && s[i] == '#') {
        while (s[i] && s[i] != '\n')
            i += s[i] == '\\' && s[i + 1] ? 2 : 1;
    }
    return i;
}

/* Appends SR_EMU_ENTRY(name, bound) for every __global__ function of src: the function's name
 * is the last identifier before its parameter list, after an optional __launch_bounds__(...),
 * whose first argument becomes the bound (else 1024). Returns the number of entry points. */
static int append_entries(struct str *out, const char *src)
{
    int n = 0;
    bool line_start = true;
    for (size_t i = 0; src[i];) {
        size_t j = skip_noise(src, i, line_start);
        if (j != i) {
            i = j;
            continue;
        }
        if (!ident_char(src[i]) || (i > 0 && ident_char(src[i - 1]))) {
            line_start = src[i] == '\n' || (line_start && (src[i] == ' ' || src[i] == '\t'));
            i++;
            continue;
        }
        line_start = false;
        size_t e = i;
        while (ident_char(src[e]))
            e++;
        bool global = e - i == 10 && strncmp(src + i, "__global__", 10) == 0;
        i = e;
        if (!global)
            continue;
        /* Walk to the parameter list, remembering the last identifier and the bound. */
        const char *name = NULL, *bound = NULL;
        size_t name_len = 0, bound_len = 0;
        while (src[i] && src[i] != ';' && src[i] != '{') {
            if (ident_char(src[i])) {
                size_t b = i;
                while (ident_char(src[i]))
                    i++;
                if (i - b == 17 && strncmp(src + b, "__launch_bounds__", 17) == 0) {
                    while (src[i] && src[i] != '(')
                        i++;
                    int depth = 0;
                    size_t a = i + 1;
                    do {
                        if (src[i] == '(')
                            depth++;
                        else if (src[i] == ')')
                            depth--;
                        else if (src[i] == ',' && depth == 1 && !bound)
                            bound = src + a, bound_len = i - a;
                        i++;
                    } while (src[i] && depth > 0);
                    if (!bound)
                        bound = src + a, bound_len = i - 1 - a;
                } else {
                    name = src + b, name_len = i - b;
                }
            } else if (src[i] == '(') {
                break;
            } else {
                i++;
            }
        }
        if (!name || src[i] != '(')
            continue;
        char line[600];
        snprintf(line, sizeof line, "SR_EMU_ENTRY(%.*s, %.*s)\n", (int)name_len, name,
                 bound ? (int)bound_len : 4, bound ? bound : "1024");
        puts_(out, line);
        n++;
    }
    return n;
}

/* ---- compiling ---------------------------------------------------------------------------------
 */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct str b = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        put(&b, buf, n);
    fclose(f);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s ? b.s : strdup("");
}

static bool write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(text, 1, strlen(text), f) == strlen(text);
    return fclose(f) == 0 && ok;
}

static int cache_dir(char *dir, size_t cap)
{
    const char *d = getenv("SYMRED_CUDA_EMU_CACHE");
    if (d && *d) {
        snprintf(dir, cap, "%s", d);
    } else {
        const char *t = getenv("TMPDIR");
        snprintf(dir, cap, "%s/symred-cuda-emu-%u", t && *t ? t : "/tmp", (unsigned)getuid());
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return -1;
    /* Its shared objects are loaded into the process: only a directory of this user that no
     * one else may write. */
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 022))
        return -1;
    return 0;
}

/* Runs argv with its output into log_path; returns the exit status, or -1. */
static int run(char *const *argv, const char *log_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The prelude precompiled (a GCC precompiled header) in the cache directory, next to a copy of
 * it named by the hash ph of its text: most of a small kernel's compile time is the prelude and
 * <math.h>. Writes the copy's path into hdr and returns true when the precompiled header is there
 * (made now if missing: a temporary name, then a rename, so that concurrent processes never see
 * half of one). The compiler checks that the precompiled header fits the compile's options and
 * reads the copy's text otherwise, so the result never depends on it; only the time does. */
static bool precompiled_prelude(const char *dir, const char *cxx, const char *prelude, uint64_t ph,
                                char *hdr, size_t cap)
{
    char gch[1300], tmp[1400], logp[1400];
    snprintf(hdr, cap, "%s/prelude-%016llx.h", dir, (unsigned long long)ph);
    snprintf(gch, sizeof gch, "%s.gch", hdr);
    if (access(gch, R_OK) == 0 && access(hdr, R_OK) == 0)
        return true;
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", hdr, (int)getpid());
    if (access(hdr, R_OK) != 0 && (!write_file(tmp, prelude) || rename(tmp, hdr) != 0)) {
        unlink(tmp);
        return false;
    }
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", gch, (int)getpid());
    snprintf(logp, sizeof logp, "%s.%d.log", gch, (int)getpid());
    const char *argv[] = {cxx,          "-std=c++17", "-O1", "-fPIC", "-w", "-x",
                          "c++-header", hdr,          "-o",  tmp,     NULL};
    bool ok = run((char *const *)argv, logp) == 0 && rename(tmp, gch) == 0;
    unlink(tmp);
    unlink(logp);
    return ok;
}

/* NVRTC options that mean nothing on the CPU. */
static bool ignored_option(const char *o)
{
    static const char *const prefixes[] = {
        "--gpu-architecture",
        "-arch",
        "--std",
        "-std",
        "-default-device",
        "--device-as-default-execution-space",
        "--use_fast_math",
        "-use_fast_math",
        "-lineinfo",
        "--generate-line-info",
        "-G",
        "--device-debug",
        "-ftz",
        "--ftz",
        "-prec-",
        "--prec-",
        "-fmad",
        "--fmad",
        "--restrict",
        "-restrict",
        "-dopt",
        "--dopt",
        "-rdc",
        "--relocatable-device-code",
        "-ewp",
        "--extensible-whole-program",
        "-w",
        "--disable-warnings",
        "--extra-device-vectorization",
        "-extra-device-vectorization",
    };
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (strncmp(o, prefixes[i], strlen(prefixes[i])) == 0)
            return true;
    return false;
}

static int compile(struct nvrtc_prog_ *p, int nopts, const char *const *opts)
{
    const char *cxx = getenv("SYMRED_CUDA_EMU_CXX");
    cxx = cxx && *cxx ? cxx : "g++";
    enum { MAXARGS = 80 };
    const char *argv[MAXARGS];
    int argc = 0;
    argv[argc++] = cxx;
    argv[argc++] = "-std=c++17";
    argv[argc++] = "-O1";
    argv[argc++] = "-fPIC";
    argv[argc++] = "-shared";
    argv[argc++] = "-w";
    argv[argc++] = "-include";
    const int prelude_arg = argc;
    argv[argc++] = EMU_PRELUDE;
    for (int i = 0; i < nopts; i++) {
        if (!opts[i])
            return NVRTC_ERROR_INVALID_OPTION;
        if (!strncmp(opts[i], "-D", 2) || !strncmp(opts[i], "-I", 2)) {
            if (argc >= MAXARGS - 8)
                return NVRTC_ERROR_INVALID_OPTION;
            argv[argc++] = opts[i];
        } else if (!ignored_option(opts[i])) {
            free(p->log);
            p->log = NULL;
            if (asprintf(&p->log, "nvrtc (cuda emulator): unknown option %s\n", opts[i]) < 0)
                p->log = NULL;
            return NVRTC_ERROR_INVALID_OPTION;
        }
    }
    char *prelude = read_file(EMU_PRELUDE);
    if (!prelude)
        return NVRTC_ERROR_INTERNAL_ERROR;
    struct str text = {0};
    puts_(&text, p->src);
    puts_(&text, "\n\n/* ---- cuda emulator: entry wrappers ---- */\n");
    append_entries(&text, p->src);
    uint64_t h = fnv(0xcbf29ce484222325ULL, prelude, strlen(prelude));
    const uint64_t prelude_hash = h;
    if (text.oom) {
        free(prelude);
        return NVRTC_ERROR_OUT_OF_MEMORY;
    }
    h = fnv(h, text.s, text.n);
    for (int i = 0; i < argc; i++)
        h = fnv(h, argv[i], strlen(argv[i]) + 1);
    char dir[1024], so[1200], cu[1200], tmp[1300], logp[1300];
    if (cache_dir(dir, sizeof dir) != 0) {
        free(prelude);
        free(text.s);
        free(p->log);
        if (asprintf(&p->log,
                     "nvrtc (cuda emulator): cache directory %s: not a directory of this "
                     "user that only it may write\n",
                     dir) < 0)
            p->log = NULL;
        return NVRTC_ERROR_INTERNAL_ERROR;
    }
    snprintf(so, sizeof so, "%s/%016llx.so", dir, (unsigned long long)h);
    int rc = NVRTC_SUCCESS;
    free(p->log);
    p->log = NULL;
    char hdr[1200];
    if (access(so, R_OK) != 0) {
        /* The key above names the prelude by its path and its text; the compile may read it
         * through the precompiled copy. */
        if (precompiled_prelude(dir, cxx, prelude, prelude_hash, hdr, sizeof hdr))
            argv[prelude_arg] = hdr;
        /* Unique names per process and program: concurrent compiles of one source each write
         * their own files and the last rename wins with the same content. */
        snprintf(cu, sizeof cu, "%s/%016llx-%d-%p.cu", dir, (unsigned long long)h, (int)getpid(),
                 (void *)p);
        snprintf(tmp, sizeof tmp, "%s.so.tmp", cu);
        snprintf(logp, sizeof logp, "%s.log", cu);
        argv[argc++] = "-x";
        argv[argc++] = "c++";
        argv[argc++] = cu;
        argv[argc++] = "-o";
        argv[argc++] = tmp;
        argv[argc] = NULL;
        if (!write_file(cu, text.s)) {
            rc = NVRTC_ERROR_INTERNAL_ERROR;
        } else {
            int st = run((char *const *)argv, logp);
            p->log = read_file(logp);
            if (st < 0 && (!p->log || !*p->log)) {
                free(p->log);
                if (asprintf(&p->log, "nvrtc (cuda emulator): cannot run %s\n", cxx) < 0)
                    p->log = NULL;
            }
            if (st != 0)
                rc = NVRTC_ERROR_COMPILATION;
            else if (rename(tmp, so) != 0)
                rc = NVRTC_ERROR_INTERNAL_ERROR;
        }
        unlink(cu);
        unlink(tmp);
        unlink(logp);
    }
    free(text.s);
    free(prelude);
    if (rc == NVRTC_SUCCESS) {
        free(p->ptx);
        if (asprintf(&p->ptx, "%s\n%s\n%s", EMU_PTX_MAGIC, so, p->src) < 0) {
            p->ptx = NULL;
            rc = NVRTC_ERROR_OUT_OF_MEMORY;
        }
    }
    if (!p->log)
        p->log = strdup("");
    return rc;
}

int emu_rebuild(const char *src, char **log)
{
    struct nvrtc_prog_ p = {.src = (char *)src};
    int rc = compile(&p, 0, NULL);
    free(p.ptx);
    *log = p.log;
    return rc;
}

/* ---- the NVRTC API ----------------------------------------------------------------------------
 */

EMU_API int nvrtcVersion(int *major, int *minor)
{
    if (!major || !minor)
        return NVRTC_ERROR_INVALID_INPUT;
    /* Not any real NVRTC's version, so that symred's image cache never mixes the two; the minor
     * number follows the prelude, so that symred's cache, whose entries name shared objects
     * built with one prelude, is not used with another. */
    char *prelude = read_file(EMU_PRELUDE);
    if (!prelude)
        return NVRTC_ERROR_INTERNAL_ERROR;
    *major = EMU_NVRTC_MAJOR;
    *minor = 1 + (int)(fnv(0xcbf29ce484222325ULL, prelude, strlen(prelude)) % 1000000);
    free(prelude);
    return NVRTC_SUCCESS;
}

EMU_API int nvrtcCreateProgram(struct nvrtc_prog_ **prog, const char *src, const char *name,
                               int nheaders, const char *const *headers,
                               const char *const *include_names)
{
    (void)name, (void)headers, (void)include_names;
    if (!prog || !src)
        return NVRTC_ERROR_INVALID_INPUT;
    if (nheaders != 0) /* not emulated: symred passes none */
        return NVRTC_ERROR_INVALID_INPUT;
    struct nvrtc_prog_ *p = calloc(1, sizeof *p);
    if (!p || !(p->src = strdup(src))) {
        free(p);
        return NVRTC_ERROR_OUT_OF_MEMORY;
    }
    *prog = p;
    return NVRTC_SUCCESS;
}

EMU_API int nvrtcDestroyProgram(struct nvrtc_prog_ **prog)
{
    if (!prog || !*prog)
        return NVRTC_ERROR_INVALID_PROGRAM;
    free((*prog)->src);
    free((*prog)->log);
    free((*prog)->ptx);
    free(*prog);
    *prog = NULL;
    return NVRTC_SUCCESS;
}

EMU_API int nvrtcCompileProgram(struct nvrtc_prog_ *prog, int nopts, const char *const *opts)
{
    if (!prog)
        return NVRTC_ERROR_INVALID_PROGRAM;
    if (nopts < 0 || (nopts > 0 && !opts))
        return NVRTC_ERROR_INVALID_INPUT;
    return compile(prog, nopts, opts);
}

EMU_API int nvrtcGetPTXSize(struct nvrtc_prog_ *prog, size_t *size)
{
    if (!prog || !size)
        return NVRTC_ERROR_INVALID_INPUT;
    if (!prog->ptx)
        return NVRTC_ERROR_INVALID_PROGRAM;
    *size = strlen(prog->ptx) + 1;
    return NVRTC_SUCCESS;
}

EMU_API int nvrtcGetPTX(struct nvrtc_prog_ *prog, char *ptx)
{
    if (!prog || !ptx)
        return NVRTC_ERROR_INVALID_INPUT;
    if (!prog->ptx)
        return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(ptx, prog->ptx, strlen(prog->ptx) + 1);
    return NVRTC_SUCCESS;
}

EMU_API int nvrtcGetProgramLogSize(struct nvrtc_prog_ *prog, size_t *size)
{
    if (!prog || !size)
        return NVRTC_ERROR_INVALID_INPUT;
    *size = (prog->log ? strlen(prog->log) : 0) + 1;
    return NVRTC_SUCCESS;
}

EMU_API int nvrtcGetProgramLog(struct nvrtc_prog_ *prog, char *log)
{
    if (!prog || !log)
        return NVRTC_ERROR_INVALID_INPUT;
    const char *s = prog->log ? prog->log : "";
    memcpy(log, s, strlen(s) + 1);
    return NVRTC_SUCCESS;
}

EMU_API const char *nvrtcGetErrorString(int result)
{
    switch (result) {
    case NVRTC_SUCCESS:
        return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY:
        return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_INVALID_INPUT:
        return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM:
        return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_INVALID_OPTION:
        return "NVRTC_ERROR_INVALID_OPTION";
    case NVRTC_ERROR_COMPILATION:
        return "NVRTC_ERROR_COMPILATION";
    default:
        return "NVRTC_ERROR_INTERNAL_ERROR";
    }
}
