from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SplitRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLIT_RULE_UNSPECIFIED: _ClassVar[SplitRule]
    SPLIT_RULE_FLAT: _ClassVar[SplitRule]
    SPLIT_RULE_NESTED: _ClassVar[SplitRule]

class ScaleMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCALE_MODE_UNSPECIFIED: _ClassVar[ScaleMode]
    SCALE_MODE_NONE: _ClassVar[ScaleMode]
    SCALE_MODE_TENSOR: _ClassVar[ScaleMode]
    SCALE_MODE_BLOCK128: _ClassVar[ScaleMode]
    SCALE_MODE_BLOCK128_UE8M0: _ClassVar[ScaleMode]
    SCALE_MODE_MX32: _ClassVar[ScaleMode]

class Derive(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DERIVE_UNSPECIFIED: _ClassVar[Derive]
    DERIVE_NONE: _ClassVar[Derive]
    DERIVE_AMAX: _ClassVar[Derive]
    DERIVE_SCALES: _ClassVar[Derive]
    DERIVE_OWN_SCALES: _ClassVar[Derive]

class Strategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STRATEGY_UNSPECIFIED: _ClassVar[Strategy]
    STRATEGY_SEND_RECV: _ClassVar[Strategy]
    STRATEGY_ALLGATHER: _ClassVar[Strategy]
    STRATEGY_BROADCAST: _ClassVar[Strategy]

class TaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_KIND_UNSPECIFIED: _ClassVar[TaskKind]
    TASK_KIND_COPY: _ClassVar[TaskKind]
    TASK_KIND_SEND: _ClassVar[TaskKind]
    TASK_KIND_BROADCAST: _ClassVar[TaskKind]
    TASK_KIND_REDUCE: _ClassVar[TaskKind]
    TASK_KIND_ALLGATHER: _ClassVar[TaskKind]
    TASK_KIND_ALLREDUCE: _ClassVar[TaskKind]

class Buffer(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BUFFER_UNSPECIFIED: _ClassVar[Buffer]
    BUFFER_SRC: _ClassVar[Buffer]
    BUFFER_DST: _ClassVar[Buffer]

class Schedule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SCHEDULE_UNSPECIFIED: _ClassVar[Schedule]
    SCHEDULE_1F1B: _ClassVar[Schedule]
    SCHEDULE_EAGER_1F1B: _ClassVar[Schedule]
    SCHEDULE_INTERLEAVED_1F1B: _ClassVar[Schedule]
    SCHEDULE_ZB_V: _ClassVar[Schedule]
    SCHEDULE_DUALPIPE_V: _ClassVar[Schedule]

class Moves(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MOVES_UNSPECIFIED: _ClassVar[Moves]
    MOVES_PRICED: _ClassVar[Moves]
    MOVES_FREE: _ClassVar[Moves]

class SearchMethod(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SEARCH_METHOD_UNSPECIFIED: _ClassVar[SearchMethod]
    SEARCH_METHOD_DESCENT: _ClassVar[SearchMethod]
    SEARCH_METHOD_MCMC: _ClassVar[SearchMethod]

class Baseline(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BASELINE_UNSPECIFIED: _ClassVar[Baseline]
    BASELINE_ALPA: _ClassVar[Baseline]
    BASELINE_MEGATRON: _ClassVar[Baseline]
SPLIT_RULE_UNSPECIFIED: SplitRule
SPLIT_RULE_FLAT: SplitRule
SPLIT_RULE_NESTED: SplitRule
SCALE_MODE_UNSPECIFIED: ScaleMode
SCALE_MODE_NONE: ScaleMode
SCALE_MODE_TENSOR: ScaleMode
SCALE_MODE_BLOCK128: ScaleMode
SCALE_MODE_BLOCK128_UE8M0: ScaleMode
SCALE_MODE_MX32: ScaleMode
DERIVE_UNSPECIFIED: Derive
DERIVE_NONE: Derive
DERIVE_AMAX: Derive
DERIVE_SCALES: Derive
DERIVE_OWN_SCALES: Derive
STRATEGY_UNSPECIFIED: Strategy
STRATEGY_SEND_RECV: Strategy
STRATEGY_ALLGATHER: Strategy
STRATEGY_BROADCAST: Strategy
TASK_KIND_UNSPECIFIED: TaskKind
TASK_KIND_COPY: TaskKind
TASK_KIND_SEND: TaskKind
TASK_KIND_BROADCAST: TaskKind
TASK_KIND_REDUCE: TaskKind
TASK_KIND_ALLGATHER: TaskKind
TASK_KIND_ALLREDUCE: TaskKind
BUFFER_UNSPECIFIED: Buffer
BUFFER_SRC: Buffer
BUFFER_DST: Buffer
SCHEDULE_UNSPECIFIED: Schedule
SCHEDULE_1F1B: Schedule
SCHEDULE_EAGER_1F1B: Schedule
SCHEDULE_INTERLEAVED_1F1B: Schedule
SCHEDULE_ZB_V: Schedule
SCHEDULE_DUALPIPE_V: Schedule
MOVES_UNSPECIFIED: Moves
MOVES_PRICED: Moves
MOVES_FREE: Moves
SEARCH_METHOD_UNSPECIFIED: SearchMethod
SEARCH_METHOD_DESCENT: SearchMethod
SEARCH_METHOD_MCMC: SearchMethod
BASELINE_UNSPECIFIED: Baseline
BASELINE_ALPA: Baseline
BASELINE_MEGATRON: Baseline

class Mesh(_message.Message):
    __slots__ = ("shape", "devices", "axis_names")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    AXIS_NAMES_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    devices: _containers.RepeatedScalarFieldContainer[int]
    axis_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., devices: _Optional[_Iterable[int]] = ..., axis_names: _Optional[_Iterable[str]] = ...) -> None: ...

class MeshAxes(_message.Message):
    __slots__ = ("axes",)
    AXES_FIELD_NUMBER: _ClassVar[int]
    axes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, axes: _Optional[_Iterable[int]] = ...) -> None: ...

class ShardingSpec(_message.Message):
    __slots__ = ("dims", "partial", "split_rule", "text")
    DIMS_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    SPLIT_RULE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    dims: _containers.RepeatedCompositeFieldContainer[MeshAxes]
    partial: _containers.RepeatedScalarFieldContainer[int]
    split_rule: SplitRule
    text: str
    def __init__(self, dims: _Optional[_Iterable[_Union[MeshAxes, _Mapping]]] = ..., partial: _Optional[_Iterable[int]] = ..., split_rule: _Optional[_Union[SplitRule, str]] = ..., text: _Optional[str] = ...) -> None: ...

class Layout(_message.Message):
    __slots__ = ("mesh", "spec")
    MESH_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    mesh: Mesh
    spec: ShardingSpec
    def __init__(self, mesh: _Optional[_Union[Mesh, _Mapping]] = ..., spec: _Optional[_Union[ShardingSpec, _Mapping]] = ...) -> None: ...

class LinkFigures(_message.Message):
    __slots__ = ("intra_bandwidth", "nic_bandwidth", "latency", "intra_latency", "copy_bandwidth", "nics_per_host", "relay_piece", "shared_bandwidth", "message_cost", "part_cost", "cast_bandwidth")
    INTRA_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    NIC_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    INTRA_LATENCY_FIELD_NUMBER: _ClassVar[int]
    COPY_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    NICS_PER_HOST_FIELD_NUMBER: _ClassVar[int]
    RELAY_PIECE_FIELD_NUMBER: _ClassVar[int]
    SHARED_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COST_FIELD_NUMBER: _ClassVar[int]
    PART_COST_FIELD_NUMBER: _ClassVar[int]
    CAST_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    intra_bandwidth: float
    nic_bandwidth: float
    latency: float
    intra_latency: float
    copy_bandwidth: float
    nics_per_host: int
    relay_piece: int
    shared_bandwidth: float
    message_cost: float
    part_cost: float
    cast_bandwidth: float
    def __init__(self, intra_bandwidth: _Optional[float] = ..., nic_bandwidth: _Optional[float] = ..., latency: _Optional[float] = ..., intra_latency: _Optional[float] = ..., copy_bandwidth: _Optional[float] = ..., nics_per_host: _Optional[int] = ..., relay_piece: _Optional[int] = ..., shared_bandwidth: _Optional[float] = ..., message_cost: _Optional[float] = ..., part_cost: _Optional[float] = ..., cast_bandwidth: _Optional[float] = ...) -> None: ...

class PresetCluster(_message.Message):
    __slots__ = ("name", "num_hosts", "devices_per_host")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_HOSTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_PER_HOST_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_hosts: int
    devices_per_host: int
    def __init__(self, name: _Optional[str] = ..., num_hosts: _Optional[int] = ..., devices_per_host: _Optional[int] = ...) -> None: ...

class RegularCluster(_message.Message):
    __slots__ = ("num_hosts", "devices_per_host", "preset", "figures")
    NUM_HOSTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_PER_HOST_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    num_hosts: int
    devices_per_host: int
    preset: str
    figures: LinkFigures
    def __init__(self, num_hosts: _Optional[int] = ..., devices_per_host: _Optional[int] = ..., preset: _Optional[str] = ..., figures: _Optional[_Union[LinkFigures, _Mapping]] = ...) -> None: ...

class Host(_message.Message):
    __slots__ = ("devices",)
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, devices: _Optional[_Iterable[int]] = ...) -> None: ...

class HostsCluster(_message.Message):
    __slots__ = ("hosts", "preset", "figures", "name")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    hosts: _containers.RepeatedCompositeFieldContainer[Host]
    preset: str
    figures: LinkFigures
    name: str
    def __init__(self, hosts: _Optional[_Iterable[_Union[Host, _Mapping]]] = ..., preset: _Optional[str] = ..., figures: _Optional[_Union[LinkFigures, _Mapping]] = ..., name: _Optional[str] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("preset", "regular", "hosts")
    PRESET_FIELD_NUMBER: _ClassVar[int]
    REGULAR_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    preset: PresetCluster
    regular: RegularCluster
    hosts: HostsCluster
    def __init__(self, preset: _Optional[_Union[PresetCluster, _Mapping]] = ..., regular: _Optional[_Union[RegularCluster, _Mapping]] = ..., hosts: _Optional[_Union[HostsCluster, _Mapping]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("shape", "dtype", "src", "dst", "cast", "scale", "derive", "link")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    CAST_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    DERIVE_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    src: Layout
    dst: Layout
    cast: str
    scale: ScaleMode
    derive: Derive
    link: int
    def __init__(self, shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., src: _Optional[_Union[Layout, _Mapping]] = ..., dst: _Optional[_Union[Layout, _Mapping]] = ..., cast: _Optional[str] = ..., scale: _Optional[_Union[ScaleMode, str]] = ..., derive: _Optional[_Union[Derive, str]] = ..., link: _Optional[int] = ...) -> None: ...

class Range(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class Box(_message.Message):
    __slots__ = ("dims",)
    DIMS_FIELD_NUMBER: _ClassVar[int]
    dims: _containers.RepeatedCompositeFieldContainer[Range]
    def __init__(self, dims: _Optional[_Iterable[_Union[Range, _Mapping]]] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("kind", "tensor", "box", "root", "receivers", "nbytes", "step", "source", "pieces", "through", "parents", "addends", "addend_parents")
    KIND_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    RECEIVERS_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PIECES_FIELD_NUMBER: _ClassVar[int]
    THROUGH_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    ADDENDS_FIELD_NUMBER: _ClassVar[int]
    ADDEND_PARENTS_FIELD_NUMBER: _ClassVar[int]
    kind: TaskKind
    tensor: int
    box: Box
    root: int
    receivers: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    step: int
    source: Buffer
    pieces: _containers.RepeatedCompositeFieldContainer[Box]
    through: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    addends: _containers.RepeatedScalarFieldContainer[int]
    addend_parents: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, kind: _Optional[_Union[TaskKind, str]] = ..., tensor: _Optional[int] = ..., box: _Optional[_Union[Box, _Mapping]] = ..., root: _Optional[int] = ..., receivers: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., step: _Optional[int] = ..., source: _Optional[_Union[Buffer, str]] = ..., pieces: _Optional[_Iterable[_Union[Box, _Mapping]]] = ..., through: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ..., addends: _Optional[_Iterable[int]] = ..., addend_parents: _Optional[_Iterable[int]] = ...) -> None: ...

class Plan(_message.Message):
    __slots__ = ("format", "strategy", "cluster", "tensors", "tasks")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    format: int
    strategy: Strategy
    cluster: Cluster
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    def __init__(self, format: _Optional[int] = ..., strategy: _Optional[_Union[Strategy, str]] = ..., cluster: _Optional[_Union[Cluster, _Mapping]] = ..., tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ...) -> None: ...

class Cost(_message.Message):
    __slots__ = ("seconds", "lower_bound_seconds", "num_tasks", "num_steps", "bytes_moved")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOWER_BOUND_SECONDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TASKS_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    BYTES_MOVED_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    lower_bound_seconds: float
    num_tasks: int
    num_steps: int
    bytes_moved: int
    def __init__(self, seconds: _Optional[float] = ..., lower_bound_seconds: _Optional[float] = ..., num_tasks: _Optional[int] = ..., num_steps: _Optional[int] = ..., bytes_moved: _Optional[int] = ...) -> None: ...

class PlanRequest(_message.Message):
    __slots__ = ("tensors", "cluster", "strategy", "include_cost", "max_chunk_tasks")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_COST_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_TASKS_FIELD_NUMBER: _ClassVar[int]
    tensors: _containers.RepeatedCompositeFieldContainer[Tensor]
    cluster: Cluster
    strategy: Strategy
    include_cost: bool
    max_chunk_tasks: int
    def __init__(self, tensors: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ..., cluster: _Optional[_Union[Cluster, _Mapping]] = ..., strategy: _Optional[_Union[Strategy, str]] = ..., include_cost: _Optional[bool] = ..., max_chunk_tasks: _Optional[int] = ...) -> None: ...

class PlanReply(_message.Message):
    __slots__ = ("plan", "cost")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    cost: Cost
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ..., cost: _Optional[_Union[Cost, _Mapping]] = ...) -> None: ...

class PlanChunk(_message.Message):
    __slots__ = ("index", "count", "part", "cost")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    index: int
    count: int
    part: Plan
    cost: Cost
    def __init__(self, index: _Optional[int] = ..., count: _Optional[int] = ..., part: _Optional[_Union[Plan, _Mapping]] = ..., cost: _Optional[_Union[Cost, _Mapping]] = ...) -> None: ...

class EstimateManyRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[PlanRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[PlanRequest, _Mapping]]] = ...) -> None: ...

class EstimateResult(_message.Message):
    __slots__ = ("index", "seconds", "error", "error_type")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_TYPE_FIELD_NUMBER: _ClassVar[int]
    index: int
    seconds: float
    error: str
    error_type: str
    def __init__(self, index: _Optional[int] = ..., seconds: _Optional[float] = ..., error: _Optional[str] = ..., error_type: _Optional[str] = ...) -> None: ...

class EstimateManyReply(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EstimateResult]
    def __init__(self, results: _Optional[_Iterable[_Union[EstimateResult, _Mapping]]] = ...) -> None: ...

class ArrayRef(_message.Message):
    __slots__ = ("handle", "data")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    handle: str
    data: bytes
    def __init__(self, handle: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("plan", "inputs", "fetch", "keep", "free_inputs")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    FREE_INPUTS_FIELD_NUMBER: _ClassVar[int]
    plan: Plan
    inputs: _containers.RepeatedCompositeFieldContainer[ArrayRef]
    fetch: bool
    keep: bool
    free_inputs: bool
    def __init__(self, plan: _Optional[_Union[Plan, _Mapping]] = ..., inputs: _Optional[_Iterable[_Union[ArrayRef, _Mapping]]] = ..., fetch: _Optional[bool] = ..., keep: _Optional[bool] = ..., free_inputs: _Optional[bool] = ...) -> None: ...

class ArrayOut(_message.Message):
    __slots__ = ("handle", "shape", "dtype", "layout", "data")
    HANDLE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    handle: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    layout: Layout
    data: bytes
    def __init__(self, handle: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., layout: _Optional[_Union[Layout, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ExecuteReply(_message.Message):
    __slots__ = ("outputs", "seconds")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[ArrayOut]
    seconds: float
    def __init__(self, outputs: _Optional[_Iterable[_Union[ArrayOut, _Mapping]]] = ..., seconds: _Optional[float] = ...) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ("handles",)
    HANDLES_FIELD_NUMBER: _ClassVar[int]
    handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, handles: _Optional[_Iterable[str]] = ...) -> None: ...

class FreeReply(_message.Message):
    __slots__ = ("freed",)
    FREED_FIELD_NUMBER: _ClassVar[int]
    freed: int
    def __init__(self, freed: _Optional[int] = ...) -> None: ...

class VersionRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VersionReply(_message.Message):
    __slots__ = ("reshard_version", "api", "plan_format", "readable_formats", "backend", "strategies", "presets", "split_rules", "max_message_bytes", "max_inline_bytes", "grpc_version", "protobuf_version")
    RESHARD_VERSION_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    PLAN_FORMAT_FIELD_NUMBER: _ClassVar[int]
    READABLE_FORMATS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    PRESETS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_RULES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_INLINE_BYTES_FIELD_NUMBER: _ClassVar[int]
    GRPC_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_VERSION_FIELD_NUMBER: _ClassVar[int]
    reshard_version: str
    api: str
    plan_format: int
    readable_formats: _containers.RepeatedScalarFieldContainer[int]
    backend: str
    strategies: _containers.RepeatedScalarFieldContainer[str]
    presets: _containers.RepeatedScalarFieldContainer[str]
    split_rules: _containers.RepeatedScalarFieldContainer[SplitRule]
    max_message_bytes: int
    max_inline_bytes: int
    grpc_version: str
    protobuf_version: str
    def __init__(self, reshard_version: _Optional[str] = ..., api: _Optional[str] = ..., plan_format: _Optional[int] = ..., readable_formats: _Optional[_Iterable[int]] = ..., backend: _Optional[str] = ..., strategies: _Optional[_Iterable[str]] = ..., presets: _Optional[_Iterable[str]] = ..., split_rules: _Optional[_Iterable[_Union[SplitRule, str]]] = ..., max_message_bytes: _Optional[int] = ..., max_inline_bytes: _Optional[int] = ..., grpc_version: _Optional[str] = ..., protobuf_version: _Optional[str] = ...) -> None: ...

class SubmeshShape(_message.Message):
    __slots__ = ("hosts", "devices")
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    hosts: int
    devices: int
    def __init__(self, hosts: _Optional[int] = ..., devices: _Optional[int] = ...) -> None: ...

class SearchCandidate(_message.Message):
    __slots__ = ("name", "compute", "input", "output", "memory", "grads", "activations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    GRADS_FIELD_NUMBER: _ClassVar[int]
    ACTIVATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    compute: float
    input: str
    output: str
    memory: int
    grads: int
    activations: int
    def __init__(self, name: _Optional[str] = ..., compute: _Optional[float] = ..., input: _Optional[str] = ..., output: _Optional[str] = ..., memory: _Optional[int] = ..., grads: _Optional[int] = ..., activations: _Optional[int] = ...) -> None: ...

class SubmeshCandidates(_message.Message):
    __slots__ = ("shape", "candidates")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    shape: SubmeshShape
    candidates: _containers.RepeatedCompositeFieldContainer[SearchCandidate]
    def __init__(self, shape: _Optional[_Union[SubmeshShape, _Mapping]] = ..., candidates: _Optional[_Iterable[_Union[SearchCandidate, _Mapping]]] = ...) -> None: ...

class SearchLayer(_message.Message):
    __slots__ = ("name", "output_shape", "dtype", "submeshes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SUBMESHES_FIELD_NUMBER: _ClassVar[int]
    name: str
    output_shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    submeshes: _containers.RepeatedCompositeFieldContainer[SubmeshCandidates]
    def __init__(self, name: _Optional[str] = ..., output_shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., submeshes: _Optional[_Iterable[_Union[SubmeshCandidates, _Mapping]]] = ...) -> None: ...

class SearchEdge(_message.Message):
    __slots__ = ("producer", "consumer")
    PRODUCER_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    producer: int
    consumer: int
    def __init__(self, producer: _Optional[int] = ..., consumer: _Optional[int] = ...) -> None: ...

class SearchGraph(_message.Message):
    __slots__ = ("edges",)
    EDGES_FIELD_NUMBER: _ClassVar[int]
    edges: _containers.RepeatedCompositeFieldContainer[SearchEdge]
    def __init__(self, edges: _Optional[_Iterable[_Union[SearchEdge, _Mapping]]] = ...) -> None: ...

class SearchReplicas(_message.Message):
    __slots__ = ("degrees",)
    DEGREES_FIELD_NUMBER: _ClassVar[int]
    degrees: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, degrees: _Optional[_Iterable[int]] = ...) -> None: ...

class SearchRequest(_message.Message):
    __slots__ = ("layers", "graph", "cluster", "microbatches", "schedule", "memory_limit", "moves", "rerank", "block", "method", "few", "steps", "seed", "beta", "replicas", "time_limit", "chunks")
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    GRAPH_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MOVES_FIELD_NUMBER: _ClassVar[int]
    RERANK_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    FEW_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    BETA_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TIME_LIMIT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    layers: _containers.RepeatedCompositeFieldContainer[SearchLayer]
    graph: SearchGraph
    cluster: Cluster
    microbatches: int
    schedule: Schedule
    memory_limit: int
    moves: Moves
    rerank: int
    block: int
    method: SearchMethod
    few: int
    steps: int
    seed: int
    beta: float
    replicas: SearchReplicas
    time_limit: float
    chunks: int
    def __init__(self, layers: _Optional[_Iterable[_Union[SearchLayer, _Mapping]]] = ..., graph: _Optional[_Union[SearchGraph, _Mapping]] = ..., cluster: _Optional[_Union[Cluster, _Mapping]] = ..., microbatches: _Optional[int] = ..., schedule: _Optional[_Union[Schedule, str]] = ..., memory_limit: _Optional[int] = ..., moves: _Optional[_Union[Moves, str]] = ..., rerank: _Optional[int] = ..., block: _Optional[int] = ..., method: _Optional[_Union[SearchMethod, str]] = ..., few: _Optional[int] = ..., steps: _Optional[int] = ..., seed: _Optional[int] = ..., beta: _Optional[float] = ..., replicas: _Optional[_Union[SearchReplicas, _Mapping]] = ..., time_limit: _Optional[float] = ..., chunks: _Optional[int] = ...) -> None: ...

class Submesh(_message.Message):
    __slots__ = ("shape", "first")
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    shape: SubmeshShape
    first: int
    def __init__(self, shape: _Optional[_Union[SubmeshShape, _Mapping]] = ..., first: _Optional[int] = ...) -> None: ...

class SearchStage(_message.Message):
    __slots__ = ("first", "last", "placement", "choices", "compute", "inner", "move_in")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    INNER_FIELD_NUMBER: _ClassVar[int]
    MOVE_IN_FIELD_NUMBER: _ClassVar[int]
    first: int
    last: int
    placement: Submesh
    choices: _containers.RepeatedScalarFieldContainer[str]
    compute: float
    inner: float
    move_in: float
    def __init__(self, first: _Optional[int] = ..., last: _Optional[int] = ..., placement: _Optional[_Union[Submesh, _Mapping]] = ..., choices: _Optional[_Iterable[str]] = ..., compute: _Optional[float] = ..., inner: _Optional[float] = ..., move_in: _Optional[float] = ...) -> None: ...

class SearchChoice(_message.Message):
    __slots__ = ("stages", "microbatches", "schedule", "time", "compute", "transfer", "bubble", "simulated", "chunks")
    STAGES_FIELD_NUMBER: _ClassVar[int]
    MICROBATCHES_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    BUBBLE_FIELD_NUMBER: _ClassVar[int]
    SIMULATED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    stages: _containers.RepeatedCompositeFieldContainer[SearchStage]
    microbatches: int
    schedule: Schedule
    time: float
    compute: float
    transfer: float
    bubble: float
    simulated: float
    chunks: int
    def __init__(self, stages: _Optional[_Iterable[_Union[SearchStage, _Mapping]]] = ..., microbatches: _Optional[int] = ..., schedule: _Optional[_Union[Schedule, str]] = ..., time: _Optional[float] = ..., compute: _Optional[float] = ..., transfer: _Optional[float] = ..., bubble: _Optional[float] = ..., simulated: _Optional[float] = ..., chunks: _Optional[int] = ...) -> None: ...

class BaselineResult(_message.Message):
    __slots__ = ("baseline", "choice", "missing", "beaten")
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    BEATEN_FIELD_NUMBER: _ClassVar[int]
    baseline: Baseline
    choice: SearchChoice
    missing: str
    beaten: bool
    def __init__(self, baseline: _Optional[_Union[Baseline, str]] = ..., choice: _Optional[_Union[SearchChoice, _Mapping]] = ..., missing: _Optional[str] = ..., beaten: _Optional[bool] = ...) -> None: ...

class ReplicaTried(_message.Message):
    __slots__ = ("replicas", "time", "error")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    time: float
    error: str
    def __init__(self, replicas: _Optional[int] = ..., time: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class SearchReplicated(_message.Message):
    __slots__ = ("replicas", "cluster", "layers", "tried")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    TRIED_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    cluster: Cluster
    layers: _containers.RepeatedCompositeFieldContainer[SearchLayer]
    tried: _containers.RepeatedCompositeFieldContainer[ReplicaTried]
    def __init__(self, replicas: _Optional[int] = ..., cluster: _Optional[_Union[Cluster, _Mapping]] = ..., layers: _Optional[_Iterable[_Union[SearchLayer, _Mapping]]] = ..., tried: _Optional[_Iterable[_Union[ReplicaTried, _Mapping]]] = ...) -> None: ...

class SearchReply(_message.Message):
    __slots__ = ("choice", "baselines", "replicated")
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    BASELINES_FIELD_NUMBER: _ClassVar[int]
    REPLICATED_FIELD_NUMBER: _ClassVar[int]
    choice: SearchChoice
    baselines: _containers.RepeatedCompositeFieldContainer[BaselineResult]
    replicated: SearchReplicated
    def __init__(self, choice: _Optional[_Union[SearchChoice, _Mapping]] = ..., baselines: _Optional[_Iterable[_Union[BaselineResult, _Mapping]]] = ..., replicated: _Optional[_Union[SearchReplicated, _Mapping]] = ...) -> None: ...
