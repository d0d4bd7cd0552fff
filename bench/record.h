/*
 * record.h — benchmark figures as data. A benchmark collects its result rows and, when the
 * environment variable SYMRED_BENCH_RECORD names a file, appends one JSON line to it: the
 * benchmark's name, the commit (git, with "-dirty" when the tree has changes), the CPU model,
 * the number of online CPUs, the threads the run could use, the UTC date, the load average
 * before the run, the command line, and the rows. bench/tables.py turns those files into
 * docs/benchmarks.md. Not part of the library.
 */
#ifndef SYMRED_BENCH_RECORD_H
#define SYMRED_BENCH_RECORD_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct bench_record {
    char name[64];
    char command[1024];
    char head[2048]; /* the metadata members, fixed when the record opens */
    char *rows;      /* "{...},{...}" */
    size_t len, cap;
} bench_record;

/* Copies the first line that popen(cmd) prints into buf (at most n bytes), or "unknown". */
static inline void bench_record_popen(const char *cmd, char *buf, size_t n)
{
    FILE *p = popen(cmd, "r");
    buf[0] = 0;
    if (p) {
        if (!fgets(buf, (int)n, p))
            buf[0] = 0;
        pclose(p);
    }
    buf[strcspn(buf, "\n")] = 0;
    if (!buf[0])
        snprintf(buf, n, "unknown");
}

/* Writes s as a JSON string body (without quotes) into out. */
static inline void bench_record_escape(const char *s, char *out, size_t n)
{
    size_t k = 0;
    for (; *s && k + 7 < n; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            out[k++] = '\\', out[k++] = (char)c;
        else if (c < 0x20)
            k += (size_t)snprintf(out + k, n - k, "\\u%04x", c);
        else
            out[k++] = (char)c;
    }
    out[k] = 0;
}

/* Starts a record of benchmark `name` run as argv; reads the machine's state now, before the
 * benchmark loads it. */
static inline void bench_record_open(bench_record *r, const char *name, int argc, char **argv)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    size_t k = 0;
    for (int i = 0; i < argc && k + 2 < sizeof r->command; i++)
        k += (size_t)snprintf(r->command + k, sizeof r->command - k, "%s%s", i ? " " : "",
                              i ? argv[i] : name);
    char commit[128], cpu[256] = "unknown", cmd[1100], date[32];
    const char *env_commit = getenv("SYMRED_COMMIT");
    if (env_commit)
        snprintf(commit, sizeof commit, "%s", env_commit);
    else
        bench_record_popen("git describe --always --dirty --abbrev=12 2>/dev/null", commit,
                           sizeof commit);
    /* The model name and the widest vector unit of the first CPU: one model name (AMD EPYC)
     * covers machines with and without AVX-512. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[8192];
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0 && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ')
                v++;
            snprintf(cpu, sizeof cpu, "%s", v);
            cpu[strcspn(cpu, "\n")] = 0;
        }
        if (strncmp(line, "flags", 5) == 0) {
            const char *isa = strstr(line, " avx512f") ? "AVX-512"
                              : strstr(line, " avx2")  ? "AVX2"
                                                       : "";
            size_t len = strlen(cpu);
            if (*isa && len + 16 < sizeof cpu)
                snprintf(cpu + len, sizeof cpu - len, " (%s)", isa);
            break;
        }
    }
    if (f)
        fclose(f);
    double load[3] = {0, 0, 0};
    f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = load[1] = load[2] = -1;
        fclose(f);
    }
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    const char *threads = getenv("SYMRED_NUM_THREADS");
    if (!threads)
        threads = getenv("OMP_NUM_THREADS");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char ecpu[512];
    bench_record_escape(cpu, ecpu, sizeof ecpu);
    bench_record_escape(r->command, cmd, sizeof cmd);
    snprintf(r->head, sizeof r->head,
             "\"bench\": \"%s\", \"commit\": \"%s\", \"date\": \"%s\", \"cpu\": \"%s\", "
             "\"cores\": %ld, \"threads\": %ld, \"load\": [%.2f, %.2f, %.2f], \"command\": \"%s\"",
             r->name, commit, date, ecpu, cores, threads ? atol(threads) : cores, load[0], load[1],
             load[2], cmd);
}

/* Adds one row: fmt gives the JSON object's members, e.g. "\"N\": %d, \"seconds\": %.4g". */
static inline void bench_record_row(bench_record *r, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    size_t need = r->len + strlen(buf) + 4;
    if (need > r->cap) {
        size_t cap = need * 2;
        char *p = realloc(r->rows, cap);
        if (!p)
            return;
        r->rows = p, r->cap = cap;
    }
    r->len += (size_t)sprintf(r->rows + r->len, "%s{%s}", r->len ? ", " : "", buf);
}

/* Appends the record to $SYMRED_BENCH_RECORD (nothing when unset) and frees it. */
static inline void bench_record_close(bench_record *r)
{
    const char *path = getenv("SYMRED_BENCH_RECORD");
    if (path && *path) {
        FILE *f = fopen(path, "a");
        if (f) {
            fprintf(f, "{%s, \"rows\": [%s]}\n", r->head, r->rows ? r->rows : "");
            fclose(f);
            printf("record appended to %s\n", path);
        } else {
            fprintf(stderr, "could not append the record to %s\n", path);
        }
    }
    free(r->rows);
    r->rows = NULL;
}

#endif /* SYMRED_BENCH_RECORD_H */
