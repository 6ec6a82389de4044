"""What torch's own databases call, recorded: the first half of the surface generator (``derive.py``).

Each source runs torch code on CPU under ``Recorder``, a ``TorchFunctionMode`` that sees every torch
call a ``RemoteTensor.__torch_function__`` would see (the top-level ones: a composite's inner calls
are not recorded, as the SDK never sees them either), and keeps the first few calls of each
callable with copies of their arguments, for ``_facts`` to probe.

- ``op_db``: every OpInfo of ``torch.testing._internal.common_methods_invocations``: its ``op``,
  method, in-place, operator and alias variants, on its first two samples.
- ``module_db``: every ``torch.nn`` module of ``common_modules``: forward on its samples, in
  training and eval mode (construction only calls factories and ``nn.init``, whose tensor calls
  are OpInfos of their own).
- ``optim``: every optimizer of ``common_optimizers`` (plain, ``foreach`` and ``fused`` where the
  CPU has it) stepping a tiny model; the utilities every training loop runs with them
  (``clip_grad_norm_``, ``clip_grad_value_``, ``GradScaler``) and packed sequences.
- ``extra``: a few calls torch's databases miss (``EXTRA``, each with the reason): samples, not
  names; the spellings still come from their base names.

Nothing here runs in the server: this module imports torch's test databases, only when called.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._pytree import tree_map

CALLS_KEPT = 8  # per callable: enough variety for the probes (a dropout seen in training and eval, p > 0)
SAMPLES_PER_OP = 5  # OpInfo's first samples are often the degenerate ones (p=0, 0-d inputs)
SAMPLES_SCANNED = 100


def spelling(func: Callable) -> str | None:
    """The dotted name the SDK routes ``func`` by (``torch.overrides.resolve_name``, or ``torch.<name>``
    for builtins it cannot name, such as ``torch._foreach_add_``); None for anything else."""
    try:
        name = resolve_name(func)
    except Exception:
        name = None
    if name:
        return name
    short = getattr(func, "__name__", None)
    return f"torch.{short}" if short and getattr(torch, short, None) is func else None


def _copy(value: Any) -> Any:
    """Plain copies of the tensors in ``value`` (a ``Probe`` becomes a plain tensor)."""
    def one(v):
        if isinstance(v, torch.Tensor):
            with torch._C.DisableTorchFunctionSubclass():
                return v.detach().clone().as_subclass(torch.Tensor)
        return v
    return tree_map(one, value)


def _kinds(args: tuple, kwargs: dict) -> tuple[str, str]:
    """What kind of call this is: its tensors' shapes; its other values and keywords (``p=0.5``)."""
    leaves = [*args, *kwargs.values()]
    shapes = [(tuple(v.shape), v.dtype) for v in leaves if isinstance(v, torch.Tensor)]
    values = ([a for a in args if not isinstance(a, torch.Tensor)],
              sorted((k, v) for k, v in kwargs.items() if not isinstance(v, torch.Tensor)))
    return repr(shapes)[:300], repr(values)[:300]


@dataclass
class Call:
    """One recorded call: the callable and copies of its arguments."""

    func: Callable
    args: tuple
    kwargs: dict


@dataclass
class Record:
    """Everything recorded of one spelling: where it was seen and its first calls."""

    spelling: str
    func: Callable
    sources: set[str] = field(default_factory=set)
    opinfos: set[str] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    shapes: set = field(default_factory=set)  # the kinds of call kept (past half the calls, only new kinds are):
    values: set = field(default_factory=set)  # their tensors' shapes, and their other arguments


class Recorder(TorchFunctionMode):
    """Records each top-level torch call into ``records`` (spelling -> ``Record``)."""

    def __init__(self, records: dict[str, Record], source: str) -> None:
        super().__init__()
        self.records, self.source = records, source
        self.seen: list[str] = []  # the spellings recorded, in order

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.note(func, args, kwargs)
        return func(*args, **kwargs)

    def note(self, func, args, kwargs) -> None:
        try:
            self._note(func, args, kwargs)
        except RuntimeError:  # a sparse argument: no shapes and strides to read
            pass

    def _note(self, func, args, kwargs) -> None:
        name = spelling(func)
        if name is None:
            return
        rec = self.records.get(name)
        if rec is None:
            rec = self.records[name] = Record(name, func)
        rec.sources.add(self.source)
        self.seen.append(name)
        kinds = _kinds(args, kwargs)
        if len(rec.calls) < CALLS_KEPT and (len(rec.calls) < CALLS_KEPT // 2 or kinds[0] not in rec.shapes or (
                kinds[1] not in rec.values and len(rec.calls) < CALLS_KEPT - 2)):
            rec.shapes.add(kinds[0])
            rec.values.add(kinds[1])
            rec.calls.append(Call(func, _copy(tuple(args)), _copy(dict(kwargs))))


class Probe(torch.Tensor):
    """A tensor subclass that tells ``PROBING`` every call made with it, as a ``RemoteTensor`` would see
    it: some torch functions dispatch only for subclasses, not for a mode (``torch.svd_lowrank``)."""

    PROBING: list[Recorder] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if cls.PROBING:
            with torch._C.DisableTorchFunctionSubclass():  # reading the arguments' shapes is no call to record
                cls.PROBING[-1].note(func, args, kwargs)
        return super().__torch_function__(func, types, args, kwargs)


def probed(value: Any) -> Any:
    return tree_map(lambda v: v.as_subclass(Probe) if type(v) is torch.Tensor and v.layout == torch.strided else v,
                    value)


def _quietly(fn: Callable[[], Any]) -> bool:
    try:
        fn()
        return True
    except Exception:
        return False


# -- op_db ------------------------------------------------------------------------------------

def sample_dtype(opinfo) -> torch.dtype | None:
    """float32 where the op takes it, else float64, else its first CPU dtype."""
    dtypes = opinfo.supported_dtypes("cpu")
    for dt in (torch.float32, torch.float64):
        if dt in dtypes:
            return dt
    return sorted(dtypes, key=str)[0] if dtypes else None


def opinfo_samples(opinfo, requires_grad: bool = False) -> list:
    """The first samples, and later ones of other kinds: OpInfo's first are often degenerate (``p=0``,
    0-d inputs, where ``unique`` cannot show that its output size follows the values)."""
    dtype = sample_dtype(opinfo)
    if dtype is None:
        return []
    samples, shapes, values = [], set(), set()
    try:
        for i, s in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=requires_grad)):
            shape, value = _kinds((s.input, *s.args), s.kwargs)
            # new shapes always; new values while two places are left for shapes still to come
            if len(samples) < 2 or shape not in shapes or (value not in values and len(samples) < SAMPLES_PER_OP - 2):
                samples.append(s)
                shapes.add(shape)
                values.add(value)
            if len(samples) == SAMPLES_PER_OP or i == SAMPLES_SCANNED:
                break
    except Exception:
        pass
    return samples


def operator_dunders(opinfo) -> list[str]:
    """The Tensor dunders an OpInfo's operator variants reach: ``operator.add`` gives ``__add__`` and
    ``__radd__``, ``operator.iadd`` gives ``__iadd__`` (those Tensor has)."""
    names = []
    for op in (opinfo.operator_variant, opinfo.inplace_operator_variant):
        if op is None:
            continue
        base = op.__name__.strip("_")
        candidates = [f"__{base}__"] + ([f"__r{base}__"] if op is opinfo.operator_variant else [])
        names += [n for n in candidates if hasattr(torch.Tensor, n)]
    return names


def declared_variants(opinfo) -> list[Callable]:
    """Every callable OpInfo declares for the op: op, method, in-place, operators, aliases."""
    found = [opinfo.op, opinfo.method_variant, opinfo.inplace_variant, opinfo.operator_variant,
             opinfo.inplace_operator_variant]
    for alias in opinfo.aliases:
        found += [alias.op, alias.method_variant, alias.inplace_variant]
    return [f for f in found if f is not None]


def record_op_db(records: dict[str, Record], only: set[str] | None = None) -> dict[str, list[str]]:
    """Record what every OpInfo's variants call (``only``: those OpInfos); returns each OpInfo name's
    declared spellings (its op and variants that are torch callables themselves, not lambdas)."""
    from torch.testing._internal.common_methods_invocations import op_db

    declared: dict[str, list[str]] = {}
    for opinfo in op_db:
        if only is not None and opinfo.name not in only:
            continue
        names = declared.setdefault(opinfo.name, [])
        for f in declared_variants(opinfo):
            name = spelling(f)
            if name and name not in names:
                names.append(name)
        names += [f"torch.Tensor.{d}" for d in operator_dunders(opinfo) if f"torch.Tensor.{d}" not in names]
        for sample in opinfo_samples(opinfo):
            for variant in declared_variants(opinfo):
                inplace = variant in (opinfo.inplace_variant, opinfo.inplace_operator_variant) or any(
                    variant is a.inplace_variant for a in opinfo.aliases)
                target = sample.input.clone() if inplace and isinstance(sample.input, torch.Tensor) else sample.input
                recorder = Recorder(records, "op_db")
                with recorder:
                    _quietly(lambda: variant(target, *sample.args, **sample.kwargs))
                if recorder.seen:  # a lambda's last call is the op it tests (``x.clone().resize_(...)``)
                    records[recorder.seen[-1]].opinfos.add(opinfo.name)
                _record_as_subclass(records, variant, (target, list(sample.args), dict(sample.kwargs)))
    return declared


def _record_as_subclass(records: dict[str, Record], variant: Callable, call: tuple) -> None:
    """The call again on ``Probe`` tensors: what dispatches only for a subclass is recorded too."""
    try:
        target, args, kwargs = probed(_copy(call))
    except Exception:  # a sparse sample: no subclass of it
        return
    Probe.PROBING.append(Recorder(records, "op_db"))
    try:
        _quietly(lambda: variant(target, *args, **kwargs))
    finally:
        Probe.PROBING.pop()


# -- module_db ----------------------------------------------------------------------------------

MODULE_INPUTS = 40  # per module and mode (an LSTM has 32: dropout, projections, packed input)


def record_module_db(records: dict[str, Record]) -> None:
    from torch.testing._internal.common_modules import module_db

    for info in module_db:
        for training in (True, False):
            try:
                inputs = info.module_inputs_func(info, device="cpu", dtype=torch.float32, requires_grad=True,
                                                 training=training)[:MODULE_INPUTS]
            except Exception:
                continue
            for mi in inputs:
                ctor, fwd = mi.constructor_input, mi.forward_input
                built = _build(info.module_cls, ctor.args, ctor.kwargs)
                if built is None:
                    continue
                built.train(training)
                with Recorder(records, "module_db"):
                    _quietly(lambda: built(*fwd.args, **fwd.kwargs))


def _build(cls, args, kwargs):
    try:
        torch.manual_seed(0)
        return cls(*args, **kwargs)
    except Exception:
        return None


# -- optim and the training loop's utilities -------------------------------------------------

def _tiny_params(two_d_only: bool = False) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 2)] if two_d_only else [(3, 2), (3,)]
    params = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)
    return params


def _impls(info) -> Iterator[dict]:
    """The implementations an optimizer has on the CPU: its plain loop, ``foreach``, ``fused``."""
    if "foreach" not in info.supported_impls:  # LBFGS, Muon: one implementation, no such argument
        yield {}
        return
    yield {"foreach": False}
    yield {"foreach": True}
    if "fused" in info.supported_impls and "cpu" in info.supports_fused_on:
        yield {"fused": True}


def record_optim(records: dict[str, Record]) -> None:
    from torch.testing._internal.common_optimizers import optim_db

    for info in optim_db:
        if info.only_supports_sparse_grads:
            continue
        for optim_input in info.optim_inputs_func(device="cpu"):
            kwargs = {k: v for k, v in optim_input.kwargs.items() if k not in ("foreach", "fused", "differentiable")}
            if kwargs.get("capturable"):
                continue
            for impl in _impls(info):
                _step_twice(records, info, {**kwargs, **impl})
    _record_training_utilities(records)


def _step_twice(records, info, kwargs) -> None:
    for two_d_only in (False, True):  # Muon takes matrices only
        params = _tiny_params(two_d_only)
        try:
            opt = info.optim_cls(params, **kwargs)
        except Exception:
            continue

        def closure():
            loss = sum((p * p).sum() for p in params)
            return loss

        with Recorder(records, "optim"):
            ok = _quietly(lambda: [opt.step(closure) if info.step_requires_closure else opt.step() for _ in range(2)])
        if ok:
            return


def _extra_calls() -> list[tuple[str, Callable[[], Any]]]:
    """(why, call): ops real programs call that no database exercises."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, generator=gen)
    return [
        ("OpInfo 'rand_like' tests torch.randn_like", lambda: torch.rand_like(x)),
        ("no nn module of module_db calls F.dropout1d", lambda: torch.nn.functional.dropout1d(x, 0.5)),
        ("nn.Fold is not in module_db", lambda: torch.nn.functional.fold(torch.randn(1, 4, 4), (3, 3), (2, 2))),
        ("F.embedding's kernel, called directly by some models", lambda: torch.embedding(x[0], torch.tensor([0, 2]))),
        ("a foreach optimizer path optim_db does not take", lambda: torch._foreach_pow([x, x], 2.0)),
        ("torch.distributions' argument validation", lambda: (torch._is_all_true(x > -10), torch._is_any_true(x > 0))),
    ]


EXTRA_REASONS = [why for why, _ in _extra_calls()]


def record_extras(records: dict[str, Record]) -> None:
    for _, call in _extra_calls():
        with Recorder(records, "extra"):
            _quietly(call)


def _record_training_utilities(records) -> None:
    for foreach in (False, True):
        params = _tiny_params()
        with Recorder(records, "optim"):
            _quietly(lambda: torch.nn.utils.clip_grad_norm_(params, 0.5, foreach=foreach))
            _quietly(lambda: torch.nn.utils.clip_grad_value_(params, 0.1, foreach=foreach))
    params = _tiny_params()
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    opt = torch.optim.SGD(params, lr=0.1)
    with Recorder(records, "optim"):
        _quietly(lambda: (scaler.scale(sum(p.sum() for p in params)), scaler.unscale_(opt), scaler.step(opt),
                          scaler.update()))
    rnn = torch.nn.utils.rnn
    seqs = [torch.randn(3, 2), torch.randn(2, 2)]
    with Recorder(records, "module_db"):
        _quietly(lambda: rnn.pad_packed_sequence(rnn.pack_padded_sequence(rnn.pad_sequence(seqs), [3, 2])))
