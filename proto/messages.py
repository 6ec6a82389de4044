"""The message shapes of the protocol as typed models, validated on decode.

A program is an ordered list of steps against one session; every tensor it
creates is named by the client (``id``). ``Value`` is the argument language:
JSON scalars and lists plus a few tagged objects (tensor refs, dtypes, slices).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, WithJsonSchema

from .dtypes import DTYPES

PROTOCOL_VERSION = "1"
PROTOCOL_HEADER = "Remote-Autograd-Protocol"

# Tensor ids appear in URLs (GET .../tensors/{tid}), so they are one plain path segment:
# letters, digits, "_", "." and "-", not starting with "." or "-" (no "..", no "/", no
# percent-encoding). ``out_many`` appends ".0", ".1", ... to one of them.
TENSOR_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
TENSOR_ID_RULE = "a tensor id is 1 to 128 of A-Z a-z 0-9 _ . - and starts with a letter, a digit or _"
TensorId = Annotated[str, Field(min_length=1, max_length=128, pattern=TENSOR_ID_PATTERN)]
# An id naming a tensor the session holds, which may be one ``out_many`` made from a 128-character
# prefix: ".", then the output's index (at most 20 digits).
TENSOR_REF_MAX_LENGTH = 128 + 1 + 20
TensorRef = Annotated[str, Field(min_length=1, max_length=TENSOR_REF_MAX_LENGTH, pattern=TENSOR_ID_PATTERN)]

_DATA_SCHEMA = {
    "description": "msgpack: bin of raw little-endian C-contiguous bytes. "
    "JSON: a flat list of numbers (row-major), or a base64 string of the raw bytes.",
    "anyOf": [
        {"type": "string", "format": "binary"},
        {"type": "string", "contentEncoding": "base64"},
        {"type": "array", "items": {"type": ["number", "boolean"]}},
    ],
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorData(_Model):
    """``{dtype, shape, data}``: a tensor's values on the wire."""

    dtype: Literal[tuple(DTYPES)]  # type: ignore[valid-type]
    # Strict: a dim is an integer as sent, never "3", 3.0 or true made one, so the element limit
    # checked on the raw body (service/engine/guards.py, before this validation) sees the shape that is used.
    shape: list[Annotated[StrictInt, Field(ge=0)]]
    data: Annotated[Any, WithJsonSchema(_DATA_SCHEMA)]


_VALUE_SCHEMA = {
    "description": "An argument: null, boolean, number, string, a list of values, or one of "
    "{ref: id} (a tensor of this session), {grad_of: id} (that tensor's .grad), "
    "{dtype: name}, {slice: [start, stop, step]}, {ellipsis: true}, and inside a template "
    "{scalar: name} (one of its numbers).",
}
Value = Annotated[Any, WithJsonSchema(_VALUE_SCHEMA)]


class PutStep(_Model):
    """Upload a tensor under a client-chosen id (a leaf: ``requires_grad`` as given)."""

    kind: Literal["put"]
    id: TensorId
    value: TensorData
    requires_grad: bool = False
    grad: TensorData | None = None


class CallStep(_Model):
    """Apply an op of the table; its outputs are stored under ``out`` (one id per output).

    With ``out_many`` the caller does not know how many outputs there will be:
    ``out`` holds one prefix and the outputs are stored as ``<prefix>.0``, ``<prefix>.1``, …
    """

    kind: Literal["call"]
    op: str = Field(min_length=1, max_length=128)
    # Factories, not ``= []``: pydantic deep-copies a mutable default for every step that leaves the
    # field out (most calls have no kwargs), half the time of validating a training step's program.
    # The schema keeps saying what the default is.
    args: list[Value] = Field(default_factory=list, json_schema_extra={"default": []})
    kwargs: dict[str, Value] = Field(default_factory=dict, json_schema_extra={"default": {}})
    out: list[TensorId] = Field(default_factory=list, json_schema_extra={"default": []})
    out_many: bool = False
    grad_enabled: bool = True
    # run the op as under ``torch.autocast`` on the server's device with this dtype ("float16", "bfloat16")
    autocast: str | None = Field(default=None, max_length=16)


class TensorHook(_Model):
    """A hook on a session tensor for one ``backward`` or ``grad`` step (``Tensor.register_hook``): when the
    gradient with respect to tensor ``id`` is computed, template ``template`` (one input, the gradient;
    one output, what replaces it) runs on it; or, with ``observe`` instead, the gradient is kept under that
    new id for the client to run its hooks on after the step (hooks that read values). With
    ``post_accumulate`` (and ``observe``; a ``backward`` step only): nothing is kept, ``observe`` is answered
    among the ``observed`` when torch would accumulate the leaf's ``.grad``, for the client to run its
    ``register_post_accumulate_grad_hook`` hooks then."""

    id: TensorRef
    template: TensorId | None = None
    observe: TensorId | None = None
    post_accumulate: bool = False


class NodeHook(_Model):
    """A hook on the node a ``function`` step named ``node`` (torch's module backward hooks, which torch puts on
    its ``BackwardHookFunction``'s node), for one ``backward`` or ``grad`` step: when that node runs, the
    gradients it reads, the node's ``grads`` (``"inputs"``: those it passes on; ``"outputs"``: those it is
    given), are kept, each under its id in ``keep`` (one per gradient; one that is ``None`` is not kept),
    and ``observe`` is answered among the ``observed`` then, for the client to run the hook after the step."""

    node: TensorId
    grads: Literal["inputs", "outputs"]
    observe: TensorId
    keep: list[TensorId] = Field(max_length=4096)


class ModuleHook(_Model):
    """torch's backward hooks of one module call that return new gradients, recorded into template
    ``template`` (its inputs: the gradients the node ``outputs_node`` is given, then those the node
    ``inputs_node`` passes on; ``null``: no such node; ``template`` ``null``: one that computes nothing), run
    inside a ``backward`` or ``grad`` step: each node passes on, in place of its gradients, ``outputs`` /
    ``inputs`` (one per gradient: an index into the template's inputs, then its outputs; ``null``: none)."""

    outputs_node: TensorId | None = None
    inputs_node: TensorId | None = None
    template: TemplateId | None = None
    outputs: list[Annotated[StrictInt, Field(ge=0)] | None] = Field(max_length=4096)
    inputs: list[Annotated[StrictInt, Field(ge=0)] | None] = Field(max_length=4096)


class Capture(_Model):
    """The gradient reaching output ``output`` of the ``client_backward`` function node named ``node``, kept
    under the new id ``out`` (none when none reaches it: the step's result says which, ``captured``)."""

    node: TensorId
    output: Annotated[StrictInt, Field(ge=0)]
    out: TensorId


class BackwardStep(_Model):
    """``torch.autograd.backward``: gradients accumulate into the leaves' ``.grad``."""

    kind: Literal["backward"]
    tensors: list[TensorRef] = Field(min_length=1)
    grad_tensors: list[Value] | None = None
    retain_graph: bool | None = None
    create_graph: bool = False
    inputs: list[TensorRef] | None = None
    # as under ``torch.autograd.detect_anomaly(check_nan=...)``: a node whose gradient has a NaN raises torch's error
    detect_anomaly: bool = False
    check_nan: bool = True
    hooks: list[TensorHook] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    node_hooks: list[NodeHook] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    module_hooks: list[ModuleHook] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    capture: list[Capture] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})


class GradStep(_Model):
    """``torch.autograd.grad``: the gradients are new tensors named by ``out``."""

    kind: Literal["grad"]
    outputs: list[TensorRef] = Field(min_length=1)
    inputs: list[TensorRef] = Field(min_length=1)
    grad_outputs: list[Value] | None = None
    retain_graph: bool | None = None
    create_graph: bool = False
    allow_unused: bool = False
    out: list[TensorId]
    detect_anomaly: bool = False
    check_nan: bool = True
    hooks: list[TensorHook] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    node_hooks: list[NodeHook] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    module_hooks: list[ModuleHook] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    capture: list[Capture] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})


class SetGradStep(_Model):
    """Set (``grad``: a value) or clear (``grad``: null) a tensor's ``.grad``."""

    kind: Literal["set_grad"]
    id: TensorRef
    grad: Value = None


class ClearGradsStep(_Model):
    """Clear the ``.grad`` of each tensor of ``ids`` (``set_grad`` with ``null`` for each, as one step: an
    optimizer's ``zero_grad``)."""

    kind: Literal["clear_grads"]
    ids: list[TensorRef] = Field(min_length=1)


class SetRequiresGradStep(_Model):
    kind: Literal["set_requires_grad"]
    id: TensorRef
    requires_grad: bool


class RetainGradStep(_Model):
    kind: Literal["retain_grad"]
    id: TensorRef


class FreeStep(_Model):
    """Forget tensors; ids the session does not hold are ignored (frees are idempotent)."""

    kind: Literal["free"]
    ids: list[TensorRef]


class FetchStep(_Model):
    """Read a tensor back: its value and/or its grad."""

    kind: Literal["fetch"]
    id: TensorRef
    value: bool = True
    grad: bool = True


class LoadStep(_Model):
    """New tensors from a safetensors file in the server's model directory (``GET /v1/models``):
    ``tensors`` maps a key of the file to the new tensor's id."""

    kind: Literal["load"]
    file: str = Field(min_length=1, max_length=1024)
    tensors: dict[Annotated[str, Field(max_length=1024)], TensorId] = Field(min_length=1)


class FunctorchStep(_Model):
    """A call of ``torch.func``'s machinery that dynamo inlined into a template's graph (template-only).

    ``vmap_enter``/``grad_enter`` open a region (``batch``, ``randomness``: ``vmap``'s) and
    ``vmap_exit``/``grad_exit`` close the innermost one (its level is the server's own); ``batch`` is a
    number or, for a graph traced with dynamic shapes, ``{scalar: id}``. Between them the
    region's tensors are per-sample (vmap) or tracked at the region's level (grad): ``add_batch_dim``
    (``dim``: the batched dim of ``id``) and ``wrap_for_grad`` bring tensor ``id`` into the innermost region
    as ``out``; ``remove_batch_dim`` (``dim``: where the batch goes) and ``unwrap_for_grad`` take it out of
    it. ``requires_grad`` marks ``id`` as an input the grad region differentiates; ``autograd_grad`` is
    functorch's ``torch.autograd.grad`` of ``outputs`` by ``inputs`` (``grad_outputs``, ``retain_graph``,
    ``create_graph``), one gradient per input in ``out`` (zeros where an input is unused)."""

    kind: Literal["functorch"]
    fn: Literal["vmap_enter", "vmap_exit", "grad_enter", "grad_exit", "add_batch_dim", "remove_batch_dim",
                "wrap_for_grad", "unwrap_for_grad", "requires_grad", "autograd_grad"]
    id: TensorRef | None = None
    out: list[TensorId] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    dim: StrictInt | None = None
    batch: Annotated[StrictInt, Field(ge=0)] | dict[Literal["scalar"], TensorId] | None = None
    randomness: Literal["error", "different", "same"] | None = None
    outputs: list[TensorRef] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    inputs: list[TensorRef] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    grad_outputs: list[TensorRef] | None = Field(default=None, max_length=4096)
    retain_graph: bool = False
    create_graph: bool = True


# What a template's own steps may be: the steps a captured graph needs. Never put, fetch, load,
# free or another template: a template reads only its inputs and numbers, and names only its own tensors.
TemplateBodyStep = Annotated[
    Union[CallStep, BackwardStep, GradStep, SetGradStep, SetRequiresGradStep, FunctorchStep],
    Field(discriminator="kind"),
]
TemplateId = Annotated[str, Field(min_length=1, max_length=128, pattern=TENSOR_ID_PATTERN)]


class TemplateInput(_Model):
    """An input of a template: its name inside the template and the layout every run must bind
    (a dim ``null``: any size, as a graph traced with dynamic shapes takes it)."""

    id: TensorId
    dtype: Literal[tuple(DTYPES)]  # type: ignore[valid-type]
    shape: list[Annotated[StrictInt, Field(ge=0)] | None]
    requires_grad: bool = False


class TemplateScalar(_Model):
    """A number each run gives (``{scalar: id}`` reads it in the template's steps)."""

    id: TensorId
    kind: Literal["float", "int", "bool"]


class TemplateStep(_Model):
    """Define a template: steps run again by ``run_template`` with other tensors and numbers.

    Its steps name only its ``inputs`` and the tensors its own steps make (names of the
    template, not of the session); an argument ``{scalar: id}`` reads one of its ``scalars``;
    ``outputs`` are the tensors a run keeps (under the run's ``out`` ids). The server
    validates it once (every op in the table, every name made before it is read) and keeps
    it for the session (``max_templates_per_session``); a restart keeps none.
    ``mode``: how the client would like it compiled, as ``torch.compile``'s ``mode`` says (a hint).
    """

    kind: Literal["template"]
    id: TemplateId
    inputs: list[TemplateInput] = Field(default_factory=list, json_schema_extra={"default": []})
    scalars: list[TemplateScalar] = Field(default_factory=list, json_schema_extra={"default": []})
    steps: list[TemplateBodyStep] = Field(min_length=1)
    outputs: list[TensorId] = Field(default_factory=list, json_schema_extra={"default": []})
    mode: str | None = Field(default=None, max_length=64)


class RunTemplateStep(_Model):
    """Run a template: ``inputs`` bound in order (``{ref}`` or ``{grad_of}``), ``scalars`` its numbers,
    its outputs kept under ``out`` (one id each). Atomic: a run that fails keeps no output."""

    kind: Literal["run_template"]
    template: TemplateId
    inputs: list[Value] = Field(default_factory=list, json_schema_extra={"default": []})
    scalars: list[StrictBool | StrictInt | StrictFloat] = Field(default_factory=list,
                                                                  json_schema_extra={"default": []})
    out: list[TensorId] = Field(default_factory=list, json_schema_extra={"default": []})


class FunctionVariant(_Model):
    """A ``function`` step's backward for one pattern of grads (``materialize_grads`` false): ``present[j]``
    whether ``outputs[j]`` gets a grad; it binds the grads present, then ``saved`` and ``live``, as the
    step's own ``backward`` and ``grads`` do."""

    present: list[bool] = Field(min_length=1, max_length=4096)
    backward: TemplateId | None = None
    grads: list[Annotated[StrictInt, Field(ge=0)] | None] = Field(max_length=4096)


class FunctionStep(_Model):
    """A user's ``torch.autograd.Function`` applied on the client (its forward's steps came before):
    ``outputs`` become the outputs of one autograd node whose inputs are ``inputs``. Its backward binds
    the grads of the outputs (one each; zeros where none flows), ``saved``, then ``live`` (the session's
    tensors themselves, read when the backward runs: a checkpoint's module parameters, whose ``.grad``
    its own backward fills) as the inputs of template ``backward`` (``null``: a backward that computes
    nothing) and runs it; ``grads[i]``, the grad of ``inputs[i]``, indexes those bound tensors followed
    by the template's outputs (``null``: none). ``reentrant``: the backward runs a backward of its own
    (torch's reentrant checkpoint), refused under a ``grad`` step or a ``backward`` with ``inputs``.
    ``dirty``: indices of ``inputs`` the forward wrote in place (each is also an output: its history is
    rebased); ``non_differentiable``: indices of ``outputs``; ``once_differentiable``: a backward through
    the backward raises, as torch's decorator makes it. ``materialize_grads`` false
    (``ctx.set_materialize_grads(False)``): an output no gradient reaches gets none (torch's None), and the
    backward runs the ``variants`` entry of that pattern (``backward`` and ``grads`` are every grad's).
    ``name``: the Function's, for errors. ``node``: an id the session knows the node by (weakly: while the
    graph holds it) for later steps' ``node_hooks``. ``client_backward``: the Function's backward runs on the
    client (it reads values): the node cuts the graph, its outputs requiring grad with no way back to any
    tensor; a ``backward`` step's ``capture`` keeps their gradients (no ``inputs``, ``grads``, ``backward``,
    ``saved``, ``live``, ``dirty``, ``variants`` with it)."""

    kind: Literal["function"]
    name: str = Field(min_length=1, max_length=256)
    backward: TemplateId | None = None
    inputs: list[TensorRef] = Field(max_length=4096)
    outputs: list[TensorRef] = Field(min_length=1, max_length=4096)
    saved: list[TensorRef] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    grads: list[Annotated[StrictInt, Field(ge=0)] | None] = Field(max_length=4096)
    dirty: list[Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=list, max_length=4096,
                                                             json_schema_extra={"default": []})
    non_differentiable: list[Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=list, max_length=4096,
                                                                          json_schema_extra={"default": []})
    live: list[TensorRef] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    once_differentiable: bool = False
    reentrant: bool = False
    materialize_grads: bool = True
    variants: list[FunctionVariant] = Field(default_factory=list, max_length=64, json_schema_extra={"default": []})
    node: TensorId | None = None
    client_backward: bool = False


class CheckpointStep(_Model):
    """Open a region of ``torch.utils.checkpoint(fn, *args, use_reentrant=False)``: the steps from here to its
    ``checkpoint_end`` (in this program or later ones) are ``fn``'s. What their ops save for backward is not
    kept: the first backward that needs it runs the region's steps again (on ``inputs``, the checkpoint's
    tensor arguments, saved here as torch saves them; any other tensor they read is kept as ``fn``'s closure
    keeps it), with the session's generator as it was here when ``preserve_rng_state``. ``determinism_check``
    and ``early_stop`` as torch's arguments. A region opened inside an open one nests, as torch's do; a
    backward, grad or load step inside one is refused."""

    kind: Literal["checkpoint"]
    region: TensorId
    inputs: list[TensorRef] = Field(default_factory=list, max_length=4096, json_schema_extra={"default": []})
    preserve_rng_state: bool = True
    determinism_check: Literal["default", "none"] = "default"
    early_stop: bool = True


class CheckpointEndStep(_Model):
    """Close region ``region`` (the function returned), and every region opened inside it; a region that is
    not open (its ``checkpoint`` step never ran) is ignored."""

    kind: Literal["checkpoint_end"]
    region: TensorId


Step = Annotated[
    Union[PutStep, CallStep, BackwardStep, GradStep, SetGradStep, ClearGradsStep, SetRequiresGradStep, RetainGradStep,
          FreeStep, FetchStep, LoadStep, TemplateStep, RunTemplateStep, FunctionStep, CheckpointStep, CheckpointEndStep],
    Field(discriminator="kind"),
]


class TorchGlobals(_Model):
    """The client's process-global torch settings that change an op's result (``proto/torch_globals.py``);
    the server runs the program's steps under them. A field left out is torch's default."""

    default_dtype: Literal["float32", "float64", "float16", "bfloat16"] = "float32"
    deterministic_algorithms: bool = False
    deterministic_warn_only: bool = False
    fill_uninitialized_memory: bool = True
    float32_matmul_precision: Literal["highest", "high", "medium"] = "highest"
    cudnn_allow_tf32: bool = True
    cudnn_deterministic: bool = False
    cudnn_benchmark: bool = False


class Program(_Model):
    """An ordered list of steps; ``id`` makes a retried program recognisable.

    ``omit_known_meta``: the client names every output and infers its metadata itself, so the
    steps whose result would only repeat that answer ``null`` (SPEC §6 lists which).
    ``answer_early``: the server may answer once the fetches at the program's end are known and run the
    steps they do not wait for after the answer (SPEC §3, running ahead).
    ``torch_globals``: run under these (null: torch's defaults). ``detect_anomaly``: the call steps
    record which step made each autograd node, for a backward under anomaly detection to name.
    """

    id: str = Field(min_length=1, max_length=128)
    steps: list[Step]
    omit_known_meta: bool = False
    torch_globals: TorchGlobals | None = None
    detect_anomaly: bool = False
    answer_early: bool = False


class TensorMeta(_Model):
    id: str
    dtype: str
    shape: list[int]
    requires_grad: bool


class TensorMessage(_Model):
    """A tensor as read back: value, grad (null when there is none) and the flag."""

    id: str
    value: TensorData | None = None
    grad: TensorData | None = None
    requires_grad: bool


class StepResult(_Model):
    """What a step produced: metadata of new tensors, or a fetched tensor.

    ``tuple`` is true when the op returned a sequence of tensors (even of one).
    """

    tensors: list[TensorMeta | None] | None = None
    tuple: bool | None = None
    no_grad: list[str] | None = None
    observed: list[str] | None = None
    hooked: list[str] | None = None
    gone: list[str] | None = None
    accumulated: list[str] | None = None
    captured: list[bool] | None = None  # per ``capture`` of a backward or grad step: whether a gradient reached it
    tensor: TensorMessage | None = None


class ForwardStep(_Model):
    """The step of a program whose call made the autograd node a backward under anomaly detection
    failed in (torch's "Traceback of forward call that caused the error")."""

    program: str
    step: int
    op: str
    node: str  # the node's name (``SqrtBackward0``)


class ErrorBody(_Model):
    code: str
    message: str
    step: int | None = None
    op: str | None = None
    forward: ForwardStep | None = None
    program: str | None = None  # the earlier program whose step this is (one run after its answer)


class ProgramResult(_Model):
    """The answer to a program: one result per completed step, and the error if one failed;
    ``pending``: the steps of an ``answer_early`` program still to run when it was answered."""

    id: str | None = None
    results: list[StepResult | None] = []
    error: ErrorBody | None = None
    pending: list[int] | None = None


class ErrorResponse(_Model):
    """Every failure: the error, and for a program the id and the results of the steps before it."""

    id: str | None = None
    error: ErrorBody
    results: list[StepResult | None] = []


class Limits(_Model):
    """What a session may use; clients size their queues from these (``Settings.limits()``)."""

    max_body_bytes: int
    max_steps_per_program: int
    max_tensor_elements: int
    max_tensors_per_session: int
    max_session_bytes: int
    max_total_bytes: int | None = None
    max_sessions: int | None = None
    max_sessions_per_token: int | None = None
    max_bytes_per_token: int | None = None
    max_concurrent_programs: int | None = None
    session_ttl_seconds: float
    body_timeout_seconds: float | None = None
    max_tensor_dims: int | None = None
    max_list_values: int | None = None
    max_program_seconds: float | None = None
    max_programs_per_session: int | None = None
    max_programs_per_token: int | None = None
    max_header_bytes: int | None = None
    header_timeout_seconds: float | None = None
    idle_timeout_seconds: float | None = None
    answer_timeout_seconds: float | None = None
    max_body_bytes_in_flight: int | None = None
    max_templates_per_session: int | None = None
    max_step_flops: int | None = None
    step_grace_seconds: float | None = None
    min_answer_bytes_per_second: int | None = None


class SessionCreated(_Model):
    """The answer to ``POST /v1/sessions``; ``gpu_*`` are null on a CPU server."""

    session_id: str
    protocol: str
    device: str
    server_version: str
    gpu_name: str | None = None
    gpu_memory_bytes: int | None = None
    limits: Limits


class SessionInfo(_Model):
    """``GET /v1/sessions/{sid}``: the tensors a session holds, the bytes of their values, and where it lives."""

    session_id: str
    tensors: int
    bytes: int
    worker: str | None = None  # "in-process", the tenant's worker process ("tenant-1 (pid 123)"), or the Ray actor
    node: str | None = None  # the host name, or the Ray node id


class OpInfo(_Model):
    """One entry of the op table as clients see it."""

    name: str
    signature: str
    torch_names: list[str]
    exact: bool
    double_grad: bool
    differentiable: bool
    shape_rule: str
    inplace: bool = False
    no_grad_args: list[int | str] = []
    doc: str = ""
    kind: str = "function"  # "function": our own autograd.Function; "native": torch's op and derivative
    spelled: bool = False  # each torch name without "torch." is a call step's op name, running that callable
    # the entry's facts (each listed only where it holds; proto/SPEC.md §2 says what each means)
    relayout: bool = False
    keeps_storage: bool = False
    floats_keep_layout: bool = False
    capturable: bool = False
    cpu_args: list[int] = []
    factory: bool = False
    maybe_view: bool = False


class OpList(_Model):
    ops: list[OpInfo]


class ModelFile(_Model):
    """A safetensors file of the server's model directory: its name there and its size."""

    name: str
    bytes: int


class ModelList(_Model):
    """``GET /v1/models``: every ``.safetensors`` file under ``REMOTE_AUTOGRAD_MODEL_DIR``, by name."""

    models: list[ModelFile]


class ModelTensor(_Model):
    """One tensor of a model file: its key, dtype (a wire name, or the file's own for one the wire
    has not) and shape."""

    key: str
    dtype: str
    shape: list[int]


class ModelInfo(_Model):
    """``GET /v1/models/{name}``: the file's tensors, in the file's order."""

    name: str
    bytes: int
    tensors: list[ModelTensor]


class Health(_Model):
    """``GET /healthz``. ``cuda_graphs``: the server's ``REMOTE_AUTOGRAD_CUDA_GRAPHS`` (off, on or emulate;
    absent on the Ray backend's front). ``compile``: whether templates run compiled, ``off``, ``on`` or
    ``auto`` (the server's ``REMOTE_AUTOGRAD_COMPILE``; ``off`` where the host has no C++ compiler)."""

    status: str
    device: str
    protocol: str
    cuda_graphs: str | None = None
    compile: str | None = None


class Readiness(_Model):
    """``GET /readyz``: ``ready`` (200) once the device computes, else ``unavailable`` (503) with why.

    With the Ray backend, ``workers`` counts the device slots sessions can be placed on (ready: at
    least one). ``tenant_workers`` counts the worker processes (a process per tenant) or worker
    actors (Ray: one per device slot and token) that are up.
    """

    status: Literal["ready", "unavailable"]
    device: str | None = None
    detail: str | None = None
    workers: int | None = None
    tenant_workers: int | None = None


def validate_program(obj: Any) -> Program:
    """A ``Program`` from a decoded body; the first validation error becomes a 400 naming its field."""
    from pydantic import ValidationError

    from .errors import bad_request

    try:
        return Program.model_validate(obj)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        if err["type"] == "string_pattern_mismatch":  # the one pattern is the tensor id's: say it in words
            raise bad_request(f"{where}: {TENSOR_ID_RULE}; got {err['input']!r}") from None
        raise bad_request(f"{where}: {err['msg']}") from None
