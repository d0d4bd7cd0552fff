/* reference.c — STUB, replaced by the reference interpreter work. */
#include "../core/core.h"

static sr_status ref_run(const struct sr_kernel *k, const sr_run_desc *run)
{
    (void)run;
    return sr__error(k->ctx, SR_ENOTSUP, "reference backend not written yet");
}

const struct sr_backend_i cpu_reference_backend = {
    /* .name = */ "reference",
    /* .prepare = */ NULL,
    /* .run = */ ref_run,
    /* .release = */ NULL,
    /* .explain = */ NULL,
};
