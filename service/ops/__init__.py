"""The op table. Importing this package registers every built-in family, then torch's own ops
from the committed allow-list (``surface.json``, see ``surface.py``).

``OP_TABLE`` maps a name to an ``OpEntry``; ``load_op_modules`` imports an
operator's own modules (``REMOTE_AUTOGRAD_OP_MODULES``) so their ``@op``
decorators register too.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``testing_ops.py``: ops registered only for tests (out of memory, slow steps, a crash)
- ``_registry.py``: ``OpEntry``, ``OpTable`` (``resolve``: a call step's op name to the callable it runs), the
  ``@op`` decorator
- ``surface.json``: the allow-list: torch's own ops, each with its provenance, spellings and facts; the
  deny-list (generated, committed, reviewed)
- ``surface.py``: registers a native entry per op of ``surface.json`` at import, each spelling walked from
  ``torch`` along its committed path
- ``arg_checks.py``, ``_contracts.py``: argument contracts for kernels whose meta check is missing or too lax
  (torch's CPU fused optimizers)
- ``value_checks.py``: value checks: the integer values a kernel indexes memory by (lengths, offsets, batch
  sizes, labels, pivots), checked before it runs; ``check_of`` makes an entry's ``check`` of its contract and
  its value check
- ``value_fuzz.json``: the value fuzz's result (``python -m tests.fuzz.values --write``): per op of the
  allow-list, its cases' outcomes, what its value check stops (generated, committed, reviewed)
- ``bounds.py``: upper bounds of data-dependent ops' outputs (``nonzero``, ``unique``), from the real
  arguments
- ``adapters.py``: what a call needs before torch's op runs that the wire cannot give (``batch_sizes`` on the
  CPU)
- ``_native.py``: ``session_rng``: random native ops draw from the session's generator
- ``_samples.py``, ``_checks.py``: the sample inputs our own entries declare, and the registration checks of
  an operator's op modules
- ``coverage.py``: writes ``docs/ops.md``'s table
- ``custom.py``, ``factories.py``, ``session.py``, ``indexing.py``, ``casts.py``: our own entries: custom
  gradients, the SDK's factories and session ops, ``getitem``/``setitem`` with the SDK's key form,
  ``Tensor.type``

How the table is derived and checked:

``service/ops`` imports ``proto`` and its own helpers (``_registry.py``, ``_samples.py``, ``_grad.py``,
``_context.py``), never the rest of ``service``, nor the generator (``tools/derive_ops``, outside the installed package); the rest of ``service`` reaches the table through this
package (``OP_TABLE``, ``op``, ``load_op_modules``), and the runner also through ``_context.py`` (what a
running program lends its ops: the session's generator and device). ``tests/e2e/test_docs.py`` checks it.

The table is torch's own surface (DESIGN principle 4). The generator, ``tools/derive_ops`` (a developer's tool, not installed), runs torch's own databases on
the CPU (every OpInfo of ``op_db`` with its variants, every module of ``module_db``, every optimizer of
``optim_db``, a few extra calls) under a ``TorchFunctionMode`` and on a tensor subclass, and records each call
as ``RemoteTensor.__torch_function__`` would see it. The spellings of one op share a base name (``add``,
``Tensor.add``, ``Tensor.add_``, ``Tensor.__radd__``; OpInfo's aliases; an ``nn.functional`` op's ``torch.X``
twin that gives the same values). Each op is probed on its recorded calls: random (the default generator's
state moves, or the outputs follow the seed), uninitialised (two runs with one seed differ: zero-filled on the
server), meta (torch's meta kernels give the real outputs' shapes), data-dependent (the output shapes change
with the input values). The deny-list (``tools/derive_ops/_deny.py``) refuses I/O, process-global state, storage access,
sparse layouts and callables by name; an op without a meta kernel is refused unless ``arg_checks.py`` has its
contract, a data-dependent one unless ``bounds.py`` bounds it. The result, ``surface.json``, is committed. At
import ``surface.py`` registers each op (a spelling our own entries route is theirs). Before any kernel runs,
``service/engine/meta_check.py`` derives the call's outputs on meta with the callable the name resolved to (or
runs its contract; a data-dependent call is charged its bound). Tests: ``tests/ops/test_surface_file.py`` (the
file is the generator's, on a sample of OpInfos; every OpInfo accounted for),
``tests/ops/test_opinfo_remote.py`` and ``tests/ops/test_module_db_remote.py`` (every OpInfo and ``nn`` module
through the SDK against local torch, held to the report in ``docs/ops.md``, which ``tests/ops/db_report.py``
writes), ``tests/ops/test_optim_db_remote.py`` (every optimizer of ``optim_db``, plain, ``foreach`` and
``fused``).

Meta sees shapes, not values. A kernel that indexes memory by the values of its integer arguments
(``segment_reduce``'s lengths, a packed sequence's batch sizes, ``ctc_loss``'s labels, ``embedding_bag``'s
offsets) gets a value check (``service/ops/value_checks.py``), run with the entry's contract before the meta
run, on the plain path and a replayed plan's alike (an op with a check is never captured as a CUDA graph).
They are found by machine: the value fuzz (``python -m tests.fuzz.values``, test tooling) calls every
allow-listed op, through the server's own path in a forked child per case, with its recorded calls' integers
and flags made extreme (0, -1, -2^31, 2^31, 2^62, past the data, out of order), and records crashes, reads
past a tensor (canaries, two runs compared) and leaks in error messages. Its result,
``service/ops/value_fuzz.json``, is committed; ``tests/ops/test_value_fuzz.py`` holds it to the table (every
op accounted for, no finding without a check) and runs the known crashers and a sample again. Re-run it with
``--write`` whenever ``surface.json`` is derived again (a torch upgrade). What of torch's error text reaches a
client goes through ``service/engine/error_text.py``.

Where to add an op:

An op of torch's comes from torch's databases. If a program needs one they do not call, add a sample call to
``tools/derive_ops/_record.py``'s ``_extra_calls`` (with the reason), then ``python -m tools.derive_ops
--write`` and review the diff of ``surface.json``; an op whose meta kernel is missing needs a contract in
``arg_checks.py`` (and a bound in ``bounds.py`` when its outputs depend on values). Then ``python -m
tests.fuzz.values --write``: an op it flags needs a value check in ``value_checks.py`` (or a deny). Refresh
``docs/ops.md`` (both commands there).
"""

from __future__ import annotations

import importlib

from . import (  # noqa: F401  (importing a family registers its ops)
    casts,
    custom,
    factories,
    indexing,
    session,
)
from . import surface  # noqa: F401,E402  (last: torch's own ops the families above do not serve)
from ._checks import OpRegistrationError, check_entry
from ._registry import OP_TABLE, OpEntry, OpTable, op
from ._samples import S, Sample, T

__all__ = ["OP_TABLE", "OpEntry", "OpRegistrationError", "OpTable", "S", "Sample", "T", "check_entry",
           "load_configured_ops", "load_op_modules", "op"]


def load_configured_ops(op_modules: tuple[str, ...] | list[str], *, test_ops: bool) -> None:
    """The ops a server's settings add to the table: the operator's modules, and the test-only ops
    when asked (a front and every Ray worker load the same)."""
    load_op_modules(op_modules)
    if test_ops:
        from . import testing_ops  # noqa: F401  (registers test-only ops)


def load_op_modules(names: tuple[str, ...] | list[str]) -> None:
    """Import operator-supplied modules by dotted name (from settings, never from the wire), then check their ops.

    An op that fails a registration check is removed from the table and the error re-raised,
    so a server never starts with an op whose gradient is broken.
    """
    for name in names:
        before = set(OP_TABLE.names())
        importlib.import_module(name)
        for op_name in sorted(set(OP_TABLE.names()) - before):
            try:
                check_entry(OP_TABLE.get(op_name))
            except OpRegistrationError:
                OP_TABLE.remove(op_name)
                raise
