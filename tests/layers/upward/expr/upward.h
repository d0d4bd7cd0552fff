/* A fixture for the "layers-catches-upward-include" test: the IR including core, which the
 * layering check (scripts/check-layers.sh) must refuse. Never compiled. */
#include "../core/core.h"
