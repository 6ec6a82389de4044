"""The server's time for a template, the plain way against compiled by inductor (in this process), and
the compile's time cold and warm: ``server_times``, which the ``compile`` and ``gpu`` sections print.

A template here is a ``Case``: its steps as the wire spells them (names of its own), the tensors its
inputs are bound to, its outputs and its numbers. The MLP and the small GPT training steps come from
the SDK: each loop runs a few steps on the in-process server, and its steady program (the last one)
becomes a template as the server would see it (``program_case``: the tensors the program reads from
the session are the inputs, its calls, backward and grad settings the steps, what it fetches of its
own the outputs). The plain way is that template's steps run by the runner as a program (the runner
does for a template what it does for a program); the compiled way is ``compiled_templates``'s run of
the variant inductor compiled. Both runs start from the same tensors and each frees what it made.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from remote_autograd import client
from remote_autograd.proto import decode_tensor, encode_body, encode_tensor
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.engine import compiled_templates, template_graph
from remote_autograd.service.engine.runner import run_program
from remote_autograd.service.engine.template_compile import Compiler, Variant, compiler_missing
from remote_autograd.service.engine.values import ProgramRun, step_refs
from remote_autograd.service.sessions.store import SessionStore
from remote_autograd.service.settings import Settings

from . import _hot
from ._util import measure, row


@dataclass
class Case:
    """A template (steps as wire dicts over its own names), the values its inputs are bound to (a value,
    whether it requires grad, its grad or None), its outputs and its numbers."""

    name: str
    steps: list[dict]
    inputs: dict[str, tuple[torch.Tensor, bool, torch.Tensor | None]]
    outputs: list[str]
    scalars: dict[str, Any] = field(default_factory=dict)

    def template(self) -> types.SimpleNamespace:
        """What ``template_graph.build`` and ``compiled_templates`` read of a template."""
        program = validate_program({"id": "t", "steps": _written(self.steps, self.scalars, keep=True)})
        return types.SimpleNamespace(steps=program.steps, inputs=list(self.inputs), outputs=list(self.outputs),
                                     step=types.SimpleNamespace(id=self.name))

    def layouts(self, device: torch.device) -> list[template_graph.Layout]:
        return [template_graph.Layout.of(v.detach().to(device).requires_grad_(rg), g) for v, rg, g in self.inputs.values()]

    def session(self, settings: Settings, device: torch.device | None = None):
        """A fresh session holding the inputs."""
        store = SessionStore(settings if device is None else Settings.from_env({}, device=device.type))
        session = store.create()
        steps = []
        for name, (value, requires_grad, grad) in self.inputs.items():
            put = {"kind": "put", "id": name, "value": encode_tensor(value), "requires_grad": requires_grad}
            if grad is not None:
                put["grad"] = encode_tensor(grad)
            steps.append(put)
        _run(session, {"id": "inputs", "steps": steps}, store.settings)
        return session

    def made(self) -> list[str]:
        return [name for step in self.steps for name in step.get("out", [])]


def _written(value: Any, scalars: dict, *, keep: bool = False) -> Any:
    """``value`` with each ``{scalar: s}`` its number (``keep``: as it is; a plain program cannot read one)."""
    if isinstance(value, dict):
        if len(value) == 1 and "scalar" in value and not keep:
            return scalars[value["scalar"]]
        return {k: _written(v, scalars, keep=keep) for k, v in value.items()}
    if isinstance(value, list):
        return [_written(v, scalars, keep=keep) for v in value]
    return value


def _run(session, program: dict, settings: Settings) -> None:
    outcome = run_program(session, validate_program(program), encode_body(program, True), False, settings)
    if outcome.status != 200:
        raise RuntimeError(f"{program['id']}: {outcome.body}")


def plain_run(case: Case, session, settings: Settings) -> Callable[[], None]:
    """One run of the template the plain way: its steps through the runner, then what it made freed."""
    program = {"id": "run", "steps": [*_written(case.steps, case.scalars), {"kind": "free", "ids": case.made()}],
               "omit_known_meta": True}
    valid, body, runs = validate_program(program), encode_body(program, True), iter(range(1 << 62))

    def once() -> None:
        n = next(runs)  # a new program id each time: no answer from the retry memory
        outcome = run_program(session, valid.model_copy(update={"id": f"run{n}"}), body + b"%d" % n, False,
                              settings)
        if outcome.status != 200:
            raise RuntimeError(outcome.body)

    return once


def compiled_run(case: Case, variant: Variant, session, settings: Settings, *,
                 keep: bool = False) -> Callable[[], None]:
    """One run of ``variant`` by ``compiled_templates``, its outputs (``out.0``, ...) freed after, or kept."""
    bound = [session.tensors[name] for name in case.inputs]
    step = types.SimpleNamespace(template=case.name, out=[f"out.{i}" for i in range(len(case.outputs))])
    run = ProgramRun(session, settings, omit_known_meta=True)

    def once() -> None:
        with session.lock:
            if compiled_templates._run_graph(run, variant, step, bound) != compiled_templates.RAN:
                raise RuntimeError("the compiled run was refused")
            if not keep:
                session.storages.drop([session.tensors.pop(tid) for tid in step.out])

    return once


def eager_variant(case: Case, device: torch.device) -> Variant:
    """The case's variant as a vouched run finds it: its graph, run eagerly (no compiler)."""
    variant = Variant("graph")
    variant.graph = template_graph.build(case.template(), case.layouts(device), case.scalars, device)
    variant.fn = variant.graph.module
    return variant


def compile_case(case: Case, device: torch.device, *, cuda_graphs: bool = False) -> Variant:
    """The case compiled now (a compiler of its own, waited for)."""
    compiler = Compiler()
    variant = compiler.submit("bench", (case.name, time.monotonic()), case.template(), case.layouts(device),
                              case.scalars, device, budget=float("inf"), cuda_graphs=cuda_graphs)
    compiler.wait()
    return variant


@contextlib.contextmanager
def inductor_cache(path: str | None = None) -> Iterator[str]:
    """Inductor's caches in ``path`` (a new temporary directory by default) while inside."""
    with contextlib.ExitStack() as stack:
        path = path or stack.enter_context(tempfile.TemporaryDirectory(prefix="ra-inductor-"))
        saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
        try:
            yield path
        finally:
            if saved is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def server_times(case: Case, repeat: int = 30, device: torch.device | None = None,
                 cuda_graphs: bool = False) -> dict:
    """The server time of one run of ``case`` the plain way, as its graph run eagerly (a vouched run's
    way) and compiled (medians, microseconds), and the compile's seconds, cold (empty caches) and warm
    (the same graph again, inductor's caches filled)."""
    device = device or torch.device("cpu")
    settings = Settings.from_env({}, device=device.type)
    with inductor_cache() as cache:
        cold = compile_case(case, device, cuda_graphs=cuda_graphs)
        if cold.state != "ready":
            return {"state": cold.state, "reason": cold.reason}
        with inductor_cache(cache):
            warm = compile_case(case, device, cuda_graphs=cuda_graphs)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def synced(once: Callable[[], None]) -> Callable[[], None]:  # a run's device work done, on a GPU
        return lambda: (once(), sync())

    plain_once = synced(plain_run(case, case.session(settings, device), settings))
    graph_once = synced(compiled_run(case, eager_variant(case, device), case.session(settings, device), settings))
    compiled_once = synced(compiled_run(case, cold, case.session(settings, device), settings))
    plain, graph = measure(plain_once, repeat=repeat, warmup=3), measure(graph_once, repeat=repeat, warmup=3)
    compiled = measure(compiled_once, repeat=repeat, warmup=3)
    return {"state": "ready", "plain": plain, "graph": graph, "compiled": compiled, "cold_s": cold.seconds,
            "warm_s": warm.seconds, "plain_cpu": _thread_seconds(plain_once, repeat),
            "compiled_cpu": _thread_seconds(compiled_once, repeat)}


def _thread_seconds(fn: Callable[[], object], repeat: int) -> list[float]:
    """CPU seconds of this thread per call: what a run costs, whatever else the machine's cores run (all
    of it, with one intra-op thread; on a GPU, the host's part)."""
    times = []
    for _ in range(repeat):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return times


def print_server_times(label: str, case: Case, repeat: int = 30, device: torch.device | None = None,
                       cuda_graphs: bool = False) -> None:
    times = server_times(case, repeat, device, cuda_graphs)
    if times["state"] != "ready":
        print(f"  {label}: not compiled ({times['state']}: {times['reason'][:200]})")
        return
    plain = row(f"{label}: server, plain (runner)", times["plain"])
    row(f"{label}: server, as its graph (eagerly)", times["graph"], plain)
    row(f"{label}: server, compiled", times["compiled"], plain)
    plain_cpu = row(f"{label}: server CPU time, plain", times["plain_cpu"])
    row(f"{label}: server CPU time, compiled", times["compiled_cpu"], plain_cpu)
    print(f"  {label + ': compile, cold / warm':<48} {times['cold_s']:9.1f} s / {times['warm_s']:.1f} s")


# -- the SDK's steady program as a template -----------------------------------------------------------


def program_case(name: str, loop: Callable[[Any], None]) -> Case:
    """``loop(sess)`` run on the in-process server; its last program as a template, its inputs as the
    session held them before that program."""
    tap = _hot.Tap(client.InProcessTransport())
    with client.connect(transport=tap) as sess, _hot.recording(tap) as programs:
        loop(sess)
        recorded = programs()
    settings = Settings.from_env({})
    session = SessionStore(settings).create()
    for n, program in enumerate(recorded[:-1]):
        _run(session, {**program, "id": f"p{n}"}, settings)
    return _template_of(name, recorded[-1], session)


def _template_of(name: str, program: dict, session) -> Case:
    inputs: dict[str, tuple] = {}
    made: set[str] = set()
    steps, outputs = [], []
    for step in _template_steps(program["steps"]):
        kind = step["kind"]
        if kind == "put":
            grad = step.get("grad")
            inputs[step["id"]] = (decode_tensor(step["value"]), step.get("requires_grad", False),
                                  None if grad is None else decode_tensor(grad))
            continue
        if kind == "free":
            continue
        if kind == "fetch":  # what it reads of its own (the loss, for .item()): an output, detached
            if step["id"] in made and f"{step['id']}.out" not in outputs:
                outputs.append(f"{step['id']}.out")
                steps.append({"kind": "call", "op": "Tensor.detach", "args": [{"ref": step["id"]}],
                              "out": [outputs[-1]]})
            continue
        for tid in _reads(step):
            if tid not in made and tid not in inputs:
                ct = session.tensors[tid]
                inputs[tid] = (ct.value.detach().clone(), ct.value.requires_grad,
                               None if ct.grad is None else ct.grad.clone())
        steps.append(step)
        made.update(step.get("out", []))
    return Case(name, steps, inputs, outputs)


def _template_steps(steps: list[dict]) -> Iterator[dict]:
    """A program's steps as a template holds them: its ``clear_grads`` a ``set_grad`` with null for each id."""
    for step in steps:
        if step["kind"] == "clear_grads":
            yield from ({"kind": "set_grad", "id": tid, "grad": None} for tid in step["ids"])
        else:
            yield step


def _reads(step: dict) -> set[str]:
    kind = step["kind"]
    if kind == "call":
        return step_refs([*step.get("args", []), *step.get("kwargs", {}).values()], set())
    if kind == "backward":
        return set(step["tensors"]) | set(step.get("inputs") or ()) | step_refs(step.get("grad_tensors") or [], set())
    if kind == "grad":
        return set(step["outputs"]) | set(step["inputs"]) | step_refs(step.get("grad_outputs") or [], set())
    if kind == "set_grad":
        return {step["id"]} | step_refs([step.get("grad")], set())
    return {step["id"]} if "id" in step else set()


def mlp_loop(steps: int = 4) -> Callable[[Any], None]:
    """The training section's MLP step (784-128-10, SGD with momentum 0.9 at lr 0.1, batch 64), uploaded once."""
    from .training import _mlp, _step_fn

    def loop(sess) -> None:
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
        model = sess.module(copy.deepcopy(_mlp()))
        step = _step_fn(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), sess.tensor(x), sess.tensor(y))
        for _ in range(steps):
            step()

    return loop


def gpt_loop(steps: int = 4) -> Callable[[Any], None]:
    """The model section's GPT step with AdamW ``capturable=True`` at a fixed lr (its bias corrections on
    the device: a scheduled lr, or bias corrections as Python numbers, make a new variant every step)."""
    from tests.models.gpt import get_batch

    from .real_model import _CONFIG, BATCH, build_gpt, gpt_data

    def loop(sess) -> None:
        model = sess.module(build_gpt())
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, capturable=True, foreach=True)
        data, batches = gpt_data(), torch.Generator().manual_seed(0)
        x, y = get_batch(data, _CONFIG.block_size, BATCH, batches, "cpu")
        x, y = x.to(sess.device), y.to(sess.device)
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss.item()

    return loop


def run(url: str | None = None, repeat: int = 30) -> None:
    """The compiled way against the plain one, on this machine's CPU."""
    print("\n[server compile] a template's server time: the runner, its graph run eagerly, inductor's compile "
          "(in process, CPU)")
    missing = compiler_missing()
    if missing:
        print(f"  skipped: {missing}")
        return
    for label, loop in (("MLP step", mlp_loop()), ("GPT step", gpt_loop())):
        print_server_times(label, program_case(label, loop), repeat)


if __name__ == "__main__":
    run()
