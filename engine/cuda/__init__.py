"""nib's CUDA C++ kernels: compiled with nvcc for the GPU at hand, launched through the driver.

Triton reached 0.3-0.6 of the H200's copy bandwidth on the INT4 GEMV because
the instructions that unpack the nibbles, not the memory, set the pace; the
tensor-core fragments and fp16x2 bit tricks that fix that are direct in CUDA
C++. These kernels are plain `.cu` files beside this module:

- build.py compiles a `.cu` file to a cubin for the GPU's architecture with
  nvcc (cached by content, so a server compiles once per machine);
- driver.py loads the cubin and launches its kernels on PyTorch's current
  stream through the CUDA driver API (ctypes), so they live inside captured
  CUDA graphs like any other kernel;
- one wrapper module per kernel family checks its inputs at the door and packs
  the kernel's argument struct.

Without nvcc, or on a GPU below sm_80, `available()` says why and the engine
keeps the Triton kernels.
"""
