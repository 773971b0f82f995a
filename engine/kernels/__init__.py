"""Triton kernels for the GPU decode path, each with a PyTorch reference.

Every kernel file follows the kernel-lab shape: a reference in plain PyTorch,
the Triton kernel, and a launcher that checks its inputs. Tests compare them on
random inputs (tests/unit via the Triton interpreter on the CPU, tests/gpu on
the device); bench/ measures them.
"""
