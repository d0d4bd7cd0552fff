/*
 * registry.c — the backends a kernel can be created on (SR_BACKEND_MAP in core.h), and their
 * per-context state. Core reaches a backend only through this table and the members of its
 * struct sr_backend_i; a new backend adds a row to SR_BACKEND_MAP (docs/architecture.md).
 */
#include "core.h"

const struct sr_backend_i *const sr__backends[SR_BACKEND_COUNT] = {
#define SR_BACKEND_PTR_(id, backend, device) [SR_BACKEND_##id] = &backend,
    SR_BACKEND_MAP(SR_BACKEND_PTR_)
#undef SR_BACKEND_PTR_
};

static const sr_device backend_device[SR_BACKEND_COUNT] = {
#define SR_BACKEND_DEVICE_(id, backend, device) [SR_BACKEND_##id] = device,
    SR_BACKEND_MAP(SR_BACKEND_DEVICE_)
#undef SR_BACKEND_DEVICE_
};

const struct sr_backend_i *sr__backend_for(sr_device device)
{
    for (int b = 0; b < SR_BACKEND_COUNT; b++)
        if (backend_device[b] == device)
            return sr__backends[b];
    return NULL;
}

void sr__backends_ctx_free(sr_ctx *ctx)
{
    for (int b = 0; b < SR_BACKEND_COUNT; b++) {
        if (ctx->backend_state[b] && sr__backends[b]->ctx_free)
            sr__backends[b]->ctx_free(ctx->backend_state[b]);
        ctx->backend_state[b] = NULL;
    }
}
