/*
 * emu.h — what the two halves of the CUDA emulator (emu-nvrtc.c, emu-driver.c) share.
 *
 * libsymred-cuda-emu.so exports the CUDA driver's and NVRTC's entry points that symred loads,
 * so that tests can point $SYMRED_LIBCUDA and $SYMRED_NVRTC at it and run the CUDA backend's
 * generated kernels and its runtime on the CPU (docs/testing.md says what that does and does
 * not check). It is a test tool: it is built with the tests and never installed.
 */
#ifndef SYMRED_CUDA_EMU_H
#define SYMRED_CUDA_EMU_H

#include <stdbool.h>
#include <stddef.h>

#define EMU_API __attribute__((visibility("default")))

/* The first line of the "PTX" that the emulated NVRTC returns; the second names the shared
 * object holding the compiled kernels, and the program's source follows. */
#define EMU_PTX_MAGIC "// symred cuda emulator module"

/* Compiles src as nvrtcCompileProgram does with no options (emu-nvrtc.c): the shared object
 * named in the "PTX" of src is there afterwards. Returns an NVRTC status; *log gets the
 * compiler's output (malloc()ed, may be NULL). */
int emu_rebuild(const char *src, char **log);

/* The emulated NVRTC's major version: no real NVRTC has it, so the image caches of the two
 * differ. */
#define EMU_NVRTC_MAJOR 0

#endif /* SYMRED_CUDA_EMU_H */
