"""The CUDA driver API through ctypes: load a cubin, launch its kernels on torch's stream.

Only what nib needs: load a module image into the device's primary context (the
one PyTorch uses), look up a kernel, raise its shared-memory limit, launch it
with one argument struct on a stream, find the device address of pinned host
memory (so a kernel can store there). A launch on a stream that is being
captured becomes a node of the graph, exactly like PyTorch's own kernels.
Every call's status is checked; a failure raises `CudaError` naming the call
and the driver's error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from functools import cache

import torch

CUDA_ERROR_INVALID_CONTEXT = 201
CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
CU_FUNC_ATTRIBUTE_NUM_REGS = 4
CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


class _Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttributeValue(ctypes.Union):
    # CUlaunchAttributeValue: a 64-byte union; nib sets its int member and the cluster
    # dimensions. (Not c_char arrays: ctypes hands those out as bytes objects, not as
    # the buffer.)
    _fields_ = [("pad", ctypes.c_ubyte * 64), ("int_value", ctypes.c_int), ("dim", _Dim3)]


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: an id, padding to 8 bytes, the value union.
    _fields_ = [
        ("id", ctypes.c_uint),
        ("pad", ctypes.c_ubyte * 4),
        ("value", _LaunchAttributeValue),
    ]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint),
    ]  # fmt: skip


def _pdl_attribute() -> _LaunchAttribute:
    attr = _LaunchAttribute()
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.int_value = 1  # programmaticStreamSerializationAllowed
    return attr


_PDL = _pdl_attribute()


def _dim3(dims: tuple[int, ...]) -> tuple[int, int, int]:
    x, y, z = (*dims, 1, 1)[:3]
    return x, y, z


@cache
def _attributes(pdl: bool, cluster: tuple[int, int, int] | None) -> ctypes.Array[_LaunchAttribute]:
    """The launch attributes for programmatic dependent launch and/or a cluster shape,
    built once per combination (launches reuse them)."""
    attrs = [_PDL] if pdl else []
    if cluster is not None:
        attr = _LaunchAttribute()
        attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.dim = _Dim3(*cluster)
        attrs.append(attr)
    return (_LaunchAttribute * len(attrs))(*attrs)


@cache
def lib() -> ctypes.CDLL:
    """libcuda, the driver library (it comes with the NVIDIA driver, not the toolkit)."""
    names = ["libcuda.so.1", "libcuda.so", ctypes.util.find_library("cuda")]
    errors = []
    for name in names:
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise CudaError("cannot load the CUDA driver library: " + "; ".join(errors))


def _error_name(rc: int) -> str:
    name = ctypes.c_char_p()
    if lib().cuGetErrorName(rc, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode()
    return f"CUDA error {rc}"


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise CudaError(f"{what} failed: {_error_name(rc)} ({rc})")


_context_lock = threading.Lock()


def ensure_context(device: torch.device) -> None:
    """Make the device's primary context (PyTorch's) current on this thread."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.cuda.device(index):
        torch.zeros(1, device=f"cuda:{index}")  # PyTorch creates the primary context
        ctx = ctypes.c_void_p()
        check(lib().cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        dev = ctypes.c_int()
        check(lib().cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        primary = ctypes.c_void_p()
        with _context_lock:
            check(
                lib().cuDevicePrimaryCtxRetain(ctypes.byref(primary), dev),
                "cuDevicePrimaryCtxRetain",
            )
            # Retained once per call: release again, PyTorch holds its own reference.
            check(lib().cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
        if ctx.value != primary.value:
            check(lib().cuCtxSetCurrent(primary), "cuCtxSetCurrent")


class Module:
    """A loaded cubin on one device."""

    def __init__(self, image: bytes, device: torch.device, name: str = "module") -> None:
        ensure_context(device)
        self.device = device
        self.name = name
        self._image = ctypes.create_string_buffer(image, len(image))
        self.handle = ctypes.c_void_p()
        check(lib().cuModuleLoadData(ctypes.byref(self.handle), self._image), f"loading {name}")
        self._kernels: dict[str, Kernel] = {}

    def global_address(self, name: str) -> tuple[int, int]:
        """Device address and size in bytes of the module's `__device__` variable `name`."""
        dptr, size = ctypes.c_uint64(), ctypes.c_size_t()
        ensure_context(self.device)
        rc = lib().cuModuleGetGlobal_v2(
            ctypes.byref(dptr), ctypes.byref(size), self.handle, name.encode()
        )
        check(rc, f"cuModuleGetGlobal({self.name}, {name})")
        return int(dptr.value), int(size.value)

    def kernel(self, name: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            k = self._kernels[name] = Kernel(self, name)
        return k


class Kernel:
    """One `extern "C" __global__` function of a Module."""

    def __init__(self, module: Module, name: str) -> None:
        self.module = module
        self.name = name
        self.handle = ctypes.c_void_p()
        check(
            lib().cuModuleGetFunction(ctypes.byref(self.handle), module.handle, name.encode()),
            f"looking up kernel {name} in {module.name}",
        )
        self._smem_limit = 0

    def attribute(self, attr: int) -> int:
        value = ctypes.c_int()
        check(
            lib().cuFuncGetAttribute(ctypes.byref(value), attr, self.handle), "cuFuncGetAttribute"
        )
        return value.value

    @property
    def registers(self) -> int:
        return self.attribute(CU_FUNC_ATTRIBUTE_NUM_REGS)

    @property
    def local_bytes(self) -> int:
        return self.attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)

    def max_active_clusters(
        self, grid: tuple[int, ...], block: tuple[int, ...], shared: int, cluster: tuple[int, ...]
    ) -> int:
        """How many clusters of this launch the GPU can run at once
        (cuOccupancyMaxActiveClusters): fewer than the grid holds means a second wave."""
        self.allow_shared(shared)
        attrs = _attributes(False, _dim3(cluster))
        cfg = _LaunchConfig(*_dim3(grid), *_dim3(block), shared, None, attrs, len(attrs))
        n = ctypes.c_int()
        check(
            lib().cuOccupancyMaxActiveClusters(ctypes.byref(n), self.handle, ctypes.byref(cfg)),
            f"cuOccupancyMaxActiveClusters({self.name})",
        )
        return int(n.value)

    def allow_shared(self, nbytes: int) -> None:
        """Dynamic shared memory above the default 48 KB needs an opt-in per kernel."""
        if nbytes > 48 * 1024 and nbytes > self._smem_limit:
            check(
                lib().cuFuncSetAttribute(
                    self.handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes
                ),
                f"raising {self.name}'s shared memory to {nbytes} bytes",
            )
            self._smem_limit = nbytes

    def launch(
        self,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: ctypes.Structure,
        shared: int = 0,
        stream: torch.cuda.Stream | None = None,
        pdl: bool = False,
        cluster: tuple[int, ...] | None = None,
    ) -> None:
        """Launch on `stream` (default: PyTorch's current stream on the module's device)
        with one by-value argument struct (the kernel's only parameter).

        pdl: programmatic dependent launch (sm_90): the kernel may start while the
        previous kernel on the stream is still running, once that one's blocks have all
        started or signalled; the kernel itself waits (griddepcontrol.wait) before it
        touches what the previous one writes. Captured graphs keep the edge."""
        g = (*grid, 1, 1)[:3]
        b = (*block, 1, 1)[:3]
        if min(g) < 1 or min(b) < 1:
            raise ValueError(f"{self.name}: empty launch grid={grid} block={block}")
        self.allow_shared(shared)
        s = stream if stream is not None else torch.cuda.current_stream(self.module.device)
        params = (ctypes.c_void_p * 1)(ctypes.addressof(args))
        c = None if cluster is None else _dim3(cluster)
        rc = self._launch(g, b, shared, s, params, pdl, c)
        if rc == CUDA_ERROR_INVALID_CONTEXT:  # a thread that has not touched CUDA yet
            ensure_context(self.module.device)
            rc = self._launch(g, b, shared, s, params, pdl, c)
        check(
            rc,
            f"launching {self.name} grid={g} block={b} shared={shared} pdl={pdl} cluster={c}",
        )

    def _launch(
        self,
        g: tuple[int, ...],
        b: tuple[int, ...],
        shared: int,
        s: torch.cuda.Stream,
        params: ctypes.Array[ctypes.c_void_p],
        pdl: bool,
        cluster: tuple[int, int, int] | None = None,
    ) -> int:
        stream = ctypes.c_void_p(s.cuda_stream)
        if not pdl and cluster is None:
            return int(lib().cuLaunchKernel(self.handle, *g, *b, shared, stream, params, None))
        attrs = _attributes(pdl, cluster)
        cfg = _LaunchConfig(*g, *b, shared, stream, attrs, len(attrs))
        return int(lib().cuLaunchKernelEx(ctypes.byref(cfg), self.handle, params, None))


def host_device_pointer(host_ptr: int, device: torch.device) -> int:
    """The address at which `device`'s kernels reach pinned host memory at `host_ptr`
    (cuMemHostGetDevicePointer; PyTorch's pinned blocks are mapped, and with unified
    addressing the address is usually the host's own). Raises CudaError where the
    memory is not mapped for the device."""
    dptr = ctypes.c_uint64()
    # The _v2 entry point: the unversioned symbol is the old one with 32-bit addresses.
    query = lib().cuMemHostGetDevicePointer_v2
    rc = query(ctypes.byref(dptr), ctypes.c_void_p(host_ptr), 0)
    if rc == CUDA_ERROR_INVALID_CONTEXT:  # a thread that has not touched CUDA yet
        ensure_context(device)
        rc = query(ctypes.byref(dptr), ctypes.c_void_p(host_ptr), 0)
    check(rc, f"cuMemHostGetDevicePointer(0x{host_ptr:x})")
    return int(dptr.value)


def ptr(t: torch.Tensor | None) -> int:
    """A tensor's device address for an argument struct (0 for None)."""
    return 0 if t is None else int(t.data_ptr())
