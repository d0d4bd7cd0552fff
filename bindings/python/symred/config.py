"""``symred.config``: what this installation can do, under pykeops.config's names.

``gpu_available`` is True when the library can create a CUDA kernel here (an NVIDIA GPU, its
driver and NVRTC were found); it is decided once, when this module is first imported.
"""

from ._info import _cuda

__all__ = ["gpu_available"]

gpu_available = _cuda().startswith("available")
