/*
 * fuzz-parse.c — libFuzzer harness for sr_parse() and the printer.
 *
 * The input is split at NUL bytes: the first part is the formula, the next parts (at most 8)
 * are alias declarations. Every input must give SR_OK or a parse/dimension error with a
 * message; a formula that parses must print, and the printed text must parse back (without
 * aliases) to the same node unless it nests deeper than the parser allows.
 *
 * Build: cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DSYMRED_FUZZ=ON
 *        cmake --build build-fuzz --target fuzz-parse
 * Run:   ./build-fuzz/fuzz/fuzz-parse -max_total_time=120 fuzz/corpus
 */
#include "symred.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ALIASES 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what, const char *text, const char *msg)
{
    if (cond)
        return;
    fprintf(stderr, "fuzz-parse: %s\ntext: %s\nmessage: %s\n", what, text, msg ? msg : "");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A NUL-terminated copy, so that the last part is a C string too. */
    char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    const char *aliases[MAX_ALIASES];
    int naliases = 0;
    for (size_t i = 0; i < size && naliases < MAX_ALIASES; i++)
        if (buf[i] == '\0')
            aliases[naliases++] = buf + i + 1;

    sr_ctx *ctx = NULL;
    if (sr_ctx_new(&ctx) != SR_OK) {
        free(buf);
        return 0;
    }
    sr_expr *e = NULL;
    sr_status st = sr_parse(ctx, buf, aliases, naliases, &e);
    if (st != SR_OK) {
        check(e == NULL, "*out not NULL on failure", buf, sr_ctx_error(ctx));
        check(st == SR_EPARSE || st == SR_EDIM || st == SR_ENOMEM, "unexpected status", buf,
              sr_ctx_error(ctx));
        check(sr_ctx_error(ctx)[0] != '\0', "empty message", buf, "");
    } else {
        check(e != NULL, "SR_OK without a node", buf, "");
        size_t len = sr_expr_print(e, NULL, 0);
        char *text = malloc(len + 1);
        if (text) {
            check(sr_expr_print(e, text, len + 1) == len, "length changed", buf, text);
            check(strlen(text) == len, "strlen differs from the returned length", buf, text);
            /* a truncated print is a prefix of the full text */
            char small[16];
            sr_expr_print(e, small, sizeof small);
            check(strncmp(small, text, sizeof small - 1) == 0, "truncated text differs", buf,
                  small);
            sr_expr *back = NULL;
            st = sr_parse(ctx, text, NULL, 0, &back);
            if (st == SR_OK)
                check(back == e, "printed text parses to another node", buf, text);
            else
                check(strstr(sr_ctx_error(ctx), "nesting deeper than") != NULL,
                      "printed text does not parse back", text, sr_ctx_error(ctx));
            free(text);
        }
    }
    sr_ctx_free(ctx);
    free(buf);
    return 0;
}
