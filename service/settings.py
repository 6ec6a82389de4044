"""Server settings: defaults, overridden by ``REMOTE_AUTOGRAD_*`` variables, then by flags."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

_PREFIX = "REMOTE_AUTOGRAD_"

# Every limit a client can run into; each error naming one says ``<name>=<value>``.
ADVERTISED_LIMITS = (
    "max_body_bytes",
    "max_steps_per_program",
    "max_tensor_elements",
    "max_tensors_per_session",
    "max_session_bytes",
    "max_total_bytes",
    "max_sessions",
    "max_sessions_per_token",
    "max_bytes_per_token",
    "max_concurrent_programs",
    "session_ttl_seconds",
    "body_timeout_seconds",
    # admission and fair work (issue 19): see README "Limits"
    "max_tensor_dims",
    "max_list_values",
    "max_program_seconds",
    "max_programs_per_session",
    "max_programs_per_token",
    "max_header_bytes",
    "header_timeout_seconds",
    "idle_timeout_seconds",
    # memory outside the tensors (issue 19 item 2): see docs/limits.md
    "answer_timeout_seconds",
    "max_body_bytes_in_flight",
    # torch.compile's templates (issue 29): see docs/limits.md
    "max_templates_per_session",
    # a step's cost, known before its kernel runs (issue 31): see docs/limits.md
    "max_step_flops",
    # isolation (issue 31): a step cut by ending its worker; slow readers (see docs/limits.md)
    "step_grace_seconds",
    "min_answer_bytes_per_second",
)


@dataclass(frozen=True)
class Settings:
    """Everything configurable. Sizes are bytes or elements; times are seconds.

    ``max_session_bytes`` counts the storages a session's values, grads and autograd graphs
    hold (``storage_ledger``, ``values.counting_saved``); ``max_total_bytes`` the
    same across all sessions (of one worker, with the Ray backend); ``max_bytes_per_token`` and
    ``max_sessions_per_token`` bound one token across all of them (cluster-wide with Ray).
    ``sweep_interval_seconds`` is how often idle sessions are
    freed; ``body_timeout_seconds`` how long a request body may take to arrive.

    A token's shares (``max_sessions_per_token``, ``max_bytes_per_token``,
    ``max_programs_per_token``) and ``max_programs_per_session`` left at 0 are resolved when the
    settings are made (``_SHARES``), so every reader sees a number; ``dataclasses.replace`` on
    made settings keeps the resolved numbers (make new ones with ``from_env`` instead).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "auto"
    tokens: tuple[str, ...] = ()
    insecure: bool = False
    op_modules: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 30
    max_steps_per_program: int = 4096
    max_tensor_elements: int = 1 << 28
    max_tensors_per_session: int = 100_000
    max_session_bytes: int = 8 << 30
    max_total_bytes: int = 0  # 0: automatic, a part of the device's memory (see default_total_bytes)
    max_sessions: int = 256
    max_sessions_per_token: int = 0  # 0: automatic (see _SHARES)
    max_bytes_per_token: int = 0  # 0: automatic
    max_concurrent_programs: int = 64
    session_ttl_seconds: float = 3600.0
    sweep_interval_seconds: float = 30.0
    body_timeout_seconds: float = 60.0
    workers: int = 0  # worker threads for programs; 0: automatic (see resolved_workers)
    program_cache_size: int = 64
    test_ops: bool = False
    log_level: str = "warning"
    backend: str = "inprocess"  # or "ray": sessions live in worker actors (service.backends.ray_sessions)
    model_dir: str = ""  # safetensors files sessions may load by name (service.engine.model_dir); "": none
    tenant_processes: str = "on"  # inprocess: "on" (a worker process per token, the default) or "off" (one process)
    tenant_idle_seconds: float = 300.0  # a token's worker process stops after this long without a session
    state_dir: str = ""  # sessions are written here on SIGTERM and restored at start (service.backends.state_volume)
    ray_namespace: str = "remote-autograd"
    # -- admission, fair work and connections (service/engine/guards.py,
    #    service/engine/program_watch.py, service/http/http_protocol.py) --
    max_tensor_dims: int = 64  # dims of one tensor on the wire
    max_list_values: int = 1 << 20  # values a body's lists hold in all (JSON: counted by its separators)
    max_program_seconds: float = 300.0  # checked between steps
    max_programs_per_session: int = 0  # 0: automatic (see _SHARES)
    max_programs_per_token: int = 0  # 0: automatic
    max_header_bytes: int = 64 << 10  # a request's line and headers
    header_timeout_seconds: float = 10.0  # from a request's first byte to the end of its headers
    idle_timeout_seconds: float = 5.0  # a connection with no request under way
    # "off": a repeated program is checked call by call again (service/engine/program_plan.py), and a template
    # runs every step through the runner, never as a graph (service/engine/compiled_templates.py)
    replay: str = "on"
    # "on": a repeated program runs as a CUDA graph on a cuda device (service/engine/graph_steps.py);
    # "emulate": the same with graph_capture.RecordedGraph on any device (tests). Off until a GPU run vouches for it
    cuda_graphs: str = "off"
    # "on"/"auto": a template runs compiled by inductor once compiled in the background (after its first
    # run, or its third in a row); "off": always the plain way (service/engine/compiled_templates.py)
    compile: str = "off"
    compile_budget_seconds: float = 600.0  # compile time each tenant may take in all (template_compile.py)
    answer_timeout_seconds: float = 60.0  # an answer its client takes nothing of for this long is dropped
    max_body_bytes_in_flight: int = 4 << 30  # request bodies the server holds, all connections together
    max_templates_per_session: int = 64  # captured graphs a session keeps (service/engine/templates.py)
    metrics_token: str = ""  # the operator's token: /metrics shows everything with it
    # -- a step's cost, estimated on meta before its kernel runs (service/engine/step_cost.py). 0: the
    #    device's default (_STEP_COST; docs/limits.md says how they were chosen) --
    max_step_flops: int = 0  # the work one call step may do, in FLOPs (service/engine/cost_formulas.py)
    device_flops_per_second: float = 0.0  # the device's rate: what the time a program has left is worth in FLOPs
    # -- isolation (issue 31): a step stopped by ending its worker, a worker's memory, a restart's
    #    grace, slow readers (service/backends/step_deadline.py, service/backends/tenant_worker.py,
    #    service/__main__.py, service/http/http_protocol.py; docs/tenants.md) --
    step_grace_seconds: float = 10.0  # a step still running this long past the time limit or its client's leaving ends its worker
    worker_memory_bytes: int = 0  # a tenant worker's private memory above its start (RLIMIT_DATA); 0: automatic, -1: none
    shutdown_grace_seconds: float = 10.0  # on SIGTERM: answers and programs still open after this are cut, then the save
    min_answer_bytes_per_second: int = 64 << 10  # an answer read slower than this (each answer_timeout_seconds) is dropped
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.max_total_bytes == 0:  # (before the shares: they are parts of it)
            object.__setattr__(self, "max_total_bytes", default_total_bytes(self._device_type(), self.device))
        # 0 (the default) for a share means a fraction of the server-wide limit on a server with
        # tokens (so no tenant can take it all), and all of it without tokens (one tenant)
        for name, (whole, fraction, without_tokens) in _SHARES.items():
            if getattr(self, name) == 0:
                share = getattr(self, whole) // (fraction if self.tokens else without_tokens)
                object.__setattr__(self, name, max(1, share))
        for name, by_device in _STEP_COST.items():
            if not getattr(self, name):
                object.__setattr__(self, name, by_device["cuda" if self._device_type() == "cuda" else "cpu"])

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> "Settings":
        """Defaults, then ``REMOTE_AUTOGRAD_<FIELD>`` variables, then keyword overrides."""
        env = os.environ if environ is None else environ
        values: dict = {}
        for f in fields(cls):
            raw = env.get(_PREFIX + f.name.upper())
            if raw is None or f.name == "extra":
                continue
            values[f.name] = _parse(f.type, raw, f.name)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # not replace(cls(), ...): the automatic shares are resolved from these values

    def limits(self) -> dict:
        """What a session may use, as the session-creation answer advertises it (clients size queues by it)."""
        return {name: getattr(self, name) for name in ADVERTISED_LIMITS}

    def resolved_workers(self) -> int:
        """Worker threads running programs (a new session goes to the one with fewest live sessions).

        On a GPU, 8. On the CPU, one per two cores and at least 2 (two sessions always run
        concurrently): each thread's torch ops open their own OpenMP team, and idle teams
        slow the busy one down on a small machine (on a 2-core VM a CNN training step's
        server time was 11.8 ms with 8 workers, 9.8 ms with 2).
        """
        if self.workers > 0:
            return self.workers
        if self.resolved_device().type == "cuda":
            return 8
        return max(2, min(8, (os.cpu_count() or 2) // 2))

    def per_tenant_processes(self) -> bool:
        """Whether each token's sessions run in a worker process of their own (``service.backends.tenant_processes``):
        yes unless ``off`` (``auto``, the default of old, is ``on``: a worker even for one token or none)."""
        if self.tenant_processes not in ("auto", "on", "off"):
            raise ValueError(f"REMOTE_AUTOGRAD_TENANT_PROCESSES={self.tenant_processes!r}: use on or off")
        return self.tenant_processes != "off"

    def replays(self) -> bool:
        """Whether a repeated program's calls are checked by its plan (``service/engine/program_plan.py``)."""
        if self.replay not in ("on", "off"):
            raise ValueError(f"REMOTE_AUTOGRAD_REPLAY={self.replay!r}: use on or off")
        return self.replay == "on"

    def graph_mode(self) -> str:
        """How repeated programs are captured (``service/engine/graph_steps.py``): off, on or emulate."""
        if self.cuda_graphs not in ("off", "on", "emulate"):
            raise ValueError(f"REMOTE_AUTOGRAD_CUDA_GRAPHS={self.cuda_graphs!r}: use off, on or emulate")
        return self.cuda_graphs

    def _device_type(self) -> str:
        """``resolved_device``'s type, or "cpu" for a device torch cannot name (its own error comes later)."""
        try:
            return self.resolved_device().type
        except RuntimeError:
            return "cpu"

    def compile_mode(self) -> str:
        """Whether templates compile (``service/engine/compiled_templates.py``): off, on or auto."""
        if self.compile not in ("off", "on", "auto"):
            raise ValueError(f"REMOTE_AUTOGRAD_COMPILE={self.compile!r}: use off, on or auto")
        return self.compile

    def resolved_device(self) -> torch.device:
        import torch  # here, not at the top: the entry point reads settings before torch loads (openmp_wait.py)

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


# The automatic shares (a setting left at 0): share -> (the server-wide limit it is a part of,
# the part with tokens, the part without). Without tokens the caller is the only tenant.
_SHARES = {
    "max_sessions_per_token": ("max_sessions", 4, 1),
    "max_bytes_per_token": ("max_total_bytes", 4, 1),
    "max_programs_per_token": ("max_concurrent_programs", 4, 1),
    "max_programs_per_session": ("max_concurrent_programs", 8, 8),
}


# A step's cost settings left at 0 (``service/engine/step_cost.py``): per device type. The rates are
# float32 matmul rates: 33-39 GFLOP/s measured on the 2 threads of the CPU the project runs on
# (``python -m bench cost``), 19.5 TFLOP/s for an A100's float32 (no GPU measured yet; an H100's
# is about 3x). The budgets are about 3 s (CPU) and 5 s (GPU) of work at those rates.
_STEP_COST = {
    "max_step_flops": {"cpu": 10**11, "cuda": 10**14},
    "device_flops_per_second": {"cpu": 3e10, "cuda": 2e13},
}


# What part of the memory the byte limits may count by default: on a GPU, of the device's (its
# CUDA context, the caching allocator's rounding and each tenant worker's own context take the
# rest); on the CPU, of the host's (or the container's): each worker process's own memory
# (torch, about 300 MB), kernels' temporaries and the page cache need the rest.
GPU_MEMORY_FRACTION, HOST_MEMORY_FRACTION = 0.75, 0.5


def default_total_bytes(device_type: str, device: str) -> int:
    """``max_total_bytes`` left at 0: a part of the device's memory (the host's for a CPU server)."""
    if device_type == "cuda":
        import torch  # (loaded already: the device type was asked of it)

        try:
            return int(torch.cuda.get_device_properties(device if device != "auto" else "cuda").total_memory
                       * GPU_MEMORY_FRACTION)
        except (AssertionError, RuntimeError):  # no such device here: torch's own error comes when it is used
            pass
    return int(host_memory_bytes() * HOST_MEMORY_FRACTION)


@functools.cache
def host_memory_bytes() -> int:
    """The memory this process's host gives it: ``MemTotal``, or its container's limit (cgroup v2
    ``memory.max``, v1 ``memory.limit_in_bytes``) where that is smaller."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total


def _parse(kind: str, raw: str, name: str):
    if kind.startswith("tuple"):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    if kind == "bool":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind == "int":
        return int(raw)
    if kind == "float":
        return float(raw)
    return raw
