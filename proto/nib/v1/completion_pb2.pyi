from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_END_OF_TEXT: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_SUPERSEDED: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]

class ServerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVER_STATE_UNSPECIFIED: _ClassVar[ServerState]
    SERVER_STATE_STARTING: _ClassVar[ServerState]
    SERVER_STATE_SERVING: _ClassVar[ServerState]
    SERVER_STATE_DRAINING: _ClassVar[ServerState]
    SERVER_STATE_FAILED: _ClassVar[ServerState]
    SERVER_STATE_STOPPED: _ClassVar[ServerState]

class SelfCheckStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SELF_CHECK_STATUS_UNSPECIFIED: _ClassVar[SelfCheckStatus]
    SELF_CHECK_STATUS_NOT_RUN: _ClassVar[SelfCheckStatus]
    SELF_CHECK_STATUS_PENDING: _ClassVar[SelfCheckStatus]
    SELF_CHECK_STATUS_PASSED: _ClassVar[SelfCheckStatus]
    SELF_CHECK_STATUS_FAILED: _ClassVar[SelfCheckStatus]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_END_OF_TEXT: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_SUPERSEDED: FinishReason
FINISH_REASON_ERROR: FinishReason
SERVER_STATE_UNSPECIFIED: ServerState
SERVER_STATE_STARTING: ServerState
SERVER_STATE_SERVING: ServerState
SERVER_STATE_DRAINING: ServerState
SERVER_STATE_FAILED: ServerState
SERVER_STATE_STOPPED: ServerState
SELF_CHECK_STATUS_UNSPECIFIED: SelfCheckStatus
SELF_CHECK_STATUS_NOT_RUN: SelfCheckStatus
SELF_CHECK_STATUS_PENDING: SelfCheckStatus
SELF_CHECK_STATUS_PASSED: SelfCheckStatus
SELF_CHECK_STATUS_FAILED: SelfCheckStatus

class CompleteRequest(_message.Message):
    __slots__ = ("prompt", "infill", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "logprobs", "request_id")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    INFILL_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    infill: Infill
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    logprobs: bool
    request_id: str
    def __init__(self, prompt: _Optional[str] = ..., infill: _Optional[_Union[Infill, _Mapping]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., logprobs: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class Infill(_message.Message):
    __slots__ = ("prefix", "suffix", "path", "language")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    suffix: str
    path: str
    language: str
    def __init__(self, prefix: _Optional[str] = ..., suffix: _Optional[str] = ..., path: _Optional[str] = ..., language: _Optional[str] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("start", "cancel")
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    start: CompleteRequest
    cancel: Cancel
    def __init__(self, start: _Optional[_Union[CompleteRequest, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("request_id", "delta", "done")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    delta: Delta
    done: Done
    def __init__(self, request_id: _Optional[str] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("request_id", "delta", "done")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    delta: Delta
    done: Done
    def __init__(self, request_id: _Optional[str] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., done: _Optional[_Union[Done, _Mapping]] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class Done(_message.Message):
    __slots__ = ("finish_reason", "stop", "usage", "timings", "error", "error_code")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    stop: str
    usage: Usage
    timings: Timings
    error: str
    error_code: int
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., error: _Optional[str] = ..., error_code: _Optional[int] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "ttft_ms", "total_ms", "inter_token_ms", "arrival_unix_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    ttft_ms: float
    total_ms: float
    inter_token_ms: _containers.RepeatedScalarFieldContainer[float]
    arrival_unix_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., inter_token_ms: _Optional[_Iterable[float]] = ..., arrival_unix_ms: _Optional[float] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetModelInfoResponse(_message.Message):
    __slots__ = ("model", "architecture", "context_length", "vocab_size", "device", "dtype", "quantization", "max_tokens_limit", "supports_infill", "graphs", "server_version", "versions", "kernel_paths", "speculation")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_INFILL_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_PATHS_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    model: str
    architecture: str
    context_length: int
    vocab_size: int
    device: str
    dtype: str
    quantization: str
    max_tokens_limit: int
    supports_infill: bool
    graphs: _containers.RepeatedCompositeFieldContainer[GraphInfo]
    server_version: str
    versions: Versions
    kernel_paths: _containers.RepeatedCompositeFieldContainer[KernelPath]
    speculation: Speculation
    def __init__(self, model: _Optional[str] = ..., architecture: _Optional[str] = ..., context_length: _Optional[int] = ..., vocab_size: _Optional[int] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., quantization: _Optional[str] = ..., max_tokens_limit: _Optional[int] = ..., supports_infill: _Optional[bool] = ..., graphs: _Optional[_Iterable[_Union[GraphInfo, _Mapping]]] = ..., server_version: _Optional[str] = ..., versions: _Optional[_Union[Versions, _Mapping]] = ..., kernel_paths: _Optional[_Iterable[_Union[KernelPath, _Mapping]]] = ..., speculation: _Optional[_Union[Speculation, _Mapping]] = ...) -> None: ...

class Speculation(_message.Message):
    __slots__ = ("draft_tokens", "verify_costs")
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COSTS_FIELD_NUMBER: _ClassVar[int]
    draft_tokens: int
    verify_costs: _containers.RepeatedCompositeFieldContainer[VerifyCost]
    def __init__(self, draft_tokens: _Optional[int] = ..., verify_costs: _Optional[_Iterable[_Union[VerifyCost, _Mapping]]] = ...) -> None: ...

class VerifyCost(_message.Message):
    __slots__ = ("tokens", "decode_steps")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    decode_steps: float
    def __init__(self, tokens: _Optional[int] = ..., decode_steps: _Optional[float] = ...) -> None: ...

class GraphInfo(_message.Message):
    __slots__ = ("name", "ready", "fallback", "capture_ms", "error", "eager_runs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EAGER_RUNS_FIELD_NUMBER: _ClassVar[int]
    name: str
    ready: bool
    fallback: bool
    capture_ms: float
    error: str
    eager_runs: int
    def __init__(self, name: _Optional[str] = ..., ready: _Optional[bool] = ..., fallback: _Optional[bool] = ..., capture_ms: _Optional[float] = ..., error: _Optional[str] = ..., eager_runs: _Optional[int] = ...) -> None: ...

class Versions(_message.Message):
    __slots__ = ("nib", "python", "torch", "cuda_runtime", "cuda_driver", "nvidia_driver", "triton", "gpu", "compute_capability", "min_compute_capability", "kernels_build")
    NIB_FIELD_NUMBER: _ClassVar[int]
    PYTHON_FIELD_NUMBER: _ClassVar[int]
    TORCH_FIELD_NUMBER: _ClassVar[int]
    CUDA_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    CUDA_DRIVER_FIELD_NUMBER: _ClassVar[int]
    NVIDIA_DRIVER_FIELD_NUMBER: _ClassVar[int]
    TRITON_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    MIN_COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    KERNELS_BUILD_FIELD_NUMBER: _ClassVar[int]
    nib: str
    python: str
    torch: str
    cuda_runtime: str
    cuda_driver: str
    nvidia_driver: str
    triton: str
    gpu: str
    compute_capability: str
    min_compute_capability: str
    kernels_build: str
    def __init__(self, nib: _Optional[str] = ..., python: _Optional[str] = ..., torch: _Optional[str] = ..., cuda_runtime: _Optional[str] = ..., cuda_driver: _Optional[str] = ..., nvidia_driver: _Optional[str] = ..., triton: _Optional[str] = ..., gpu: _Optional[str] = ..., compute_capability: _Optional[str] = ..., min_compute_capability: _Optional[str] = ..., kernels_build: _Optional[str] = ...) -> None: ...

class KernelPath(_message.Message):
    __slots__ = ("layer", "op", "rows", "kernel", "graphs", "fallback")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_FIELD_NUMBER: _ClassVar[int]
    layer: str
    op: str
    rows: str
    kernel: str
    graphs: str
    fallback: bool
    def __init__(self, layer: _Optional[str] = ..., op: _Optional[str] = ..., rows: _Optional[str] = ..., kernel: _Optional[str] = ..., graphs: _Optional[str] = ..., fallback: _Optional[bool] = ...) -> None: ...

class GetHealthDetailRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetHealthDetailResponse(_message.Message):
    __slots__ = ("state", "error", "kernel_mode", "self_check", "graphs", "kernel_paths", "kernel_fallbacks", "versions", "gpu", "telemetry_note", "memory", "model", "device", "server_version")
    class KernelFallbacksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    KERNEL_MODE_FIELD_NUMBER: _ClassVar[int]
    SELF_CHECK_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_PATHS_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    TELEMETRY_NOTE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    state: ServerState
    error: str
    kernel_mode: str
    self_check: SelfCheck
    graphs: _containers.RepeatedCompositeFieldContainer[GraphInfo]
    kernel_paths: _containers.RepeatedCompositeFieldContainer[KernelPath]
    kernel_fallbacks: _containers.ScalarMap[str, int]
    versions: Versions
    gpu: GpuState
    telemetry_note: str
    memory: MemoryHealth
    model: str
    device: str
    server_version: str
    def __init__(self, state: _Optional[_Union[ServerState, str]] = ..., error: _Optional[str] = ..., kernel_mode: _Optional[str] = ..., self_check: _Optional[_Union[SelfCheck, _Mapping]] = ..., graphs: _Optional[_Iterable[_Union[GraphInfo, _Mapping]]] = ..., kernel_paths: _Optional[_Iterable[_Union[KernelPath, _Mapping]]] = ..., kernel_fallbacks: _Optional[_Mapping[str, int]] = ..., versions: _Optional[_Union[Versions, _Mapping]] = ..., gpu: _Optional[_Union[GpuState, _Mapping]] = ..., telemetry_note: _Optional[str] = ..., memory: _Optional[_Union[MemoryHealth, _Mapping]] = ..., model: _Optional[str] = ..., device: _Optional[str] = ..., server_version: _Optional[str] = ...) -> None: ...

class SelfCheck(_message.Message):
    __slots__ = ("status", "note", "checks", "duration_ms")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    status: SelfCheckStatus
    note: str
    checks: _containers.RepeatedCompositeFieldContainer[KernelCheck]
    duration_ms: float
    def __init__(self, status: _Optional[_Union[SelfCheckStatus, str]] = ..., note: _Optional[str] = ..., checks: _Optional[_Iterable[_Union[KernelCheck, _Mapping]]] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class KernelCheck(_message.Message):
    __slots__ = ("kernel", "shape", "path", "passed", "error", "tolerance", "message", "duration_ms")
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PASSED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    kernel: str
    shape: str
    path: str
    passed: bool
    error: float
    tolerance: float
    message: str
    duration_ms: float
    def __init__(self, kernel: _Optional[str] = ..., shape: _Optional[str] = ..., path: _Optional[str] = ..., passed: _Optional[bool] = ..., error: _Optional[float] = ..., tolerance: _Optional[float] = ..., message: _Optional[str] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class GpuState(_message.Message):
    __slots__ = ("age_seconds", "temperature_celsius", "power_watts", "power_limit_watts", "sm_clock_mhz", "sm_clock_max_mhz", "memory_clock_mhz", "throttle_reasons", "pcie_rx_bytes_per_second", "pcie_tx_bytes_per_second", "pcie_link_bytes_per_second", "pcie_generation", "pcie_width", "pcie_max_generation", "pcie_max_width", "memory_used_bytes", "memory_total_bytes", "utilization")
    AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_CELSIUS_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    SM_CLOCK_MAX_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    PCIE_RX_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PCIE_TX_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PCIE_LINK_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    PCIE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_MAX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    age_seconds: float
    temperature_celsius: float
    power_watts: float
    power_limit_watts: float
    sm_clock_mhz: float
    sm_clock_max_mhz: float
    memory_clock_mhz: float
    throttle_reasons: _containers.RepeatedScalarFieldContainer[str]
    pcie_rx_bytes_per_second: float
    pcie_tx_bytes_per_second: float
    pcie_link_bytes_per_second: float
    pcie_generation: int
    pcie_width: int
    pcie_max_generation: int
    pcie_max_width: int
    memory_used_bytes: int
    memory_total_bytes: int
    utilization: float
    def __init__(self, age_seconds: _Optional[float] = ..., temperature_celsius: _Optional[float] = ..., power_watts: _Optional[float] = ..., power_limit_watts: _Optional[float] = ..., sm_clock_mhz: _Optional[float] = ..., sm_clock_max_mhz: _Optional[float] = ..., memory_clock_mhz: _Optional[float] = ..., throttle_reasons: _Optional[_Iterable[str]] = ..., pcie_rx_bytes_per_second: _Optional[float] = ..., pcie_tx_bytes_per_second: _Optional[float] = ..., pcie_link_bytes_per_second: _Optional[float] = ..., pcie_generation: _Optional[int] = ..., pcie_width: _Optional[int] = ..., pcie_max_generation: _Optional[int] = ..., pcie_max_width: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., utilization: _Optional[float] = ...) -> None: ...

class MemoryHealth(_message.Message):
    __slots__ = ("allocated_bytes", "reserved_bytes", "graph_pool_bytes", "graph_pool_method", "fragmentation", "fragmentation_threshold")
    ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRAPH_POOL_METHOD_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTATION_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTATION_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    allocated_bytes: int
    reserved_bytes: int
    graph_pool_bytes: int
    graph_pool_method: str
    fragmentation: float
    fragmentation_threshold: float
    def __init__(self, allocated_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., graph_pool_bytes: _Optional[int] = ..., graph_pool_method: _Optional[str] = ..., fragmentation: _Optional[float] = ..., fragmentation_threshold: _Optional[float] = ...) -> None: ...
