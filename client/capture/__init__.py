"""``torch.compile(fn, backend="remote")``: a graph dynamo captured runs on the server as a template.

``_backend`` (the backend dynamo calls with each graph), ``_translate`` (a graph made a template once,
by recording its remote calls through the SDK's own eager path into a ``Recorder`` (``session/_recorder``), and
the plan of each call), ``_compiled`` (each call: one ``run_template`` step), ``_symbols`` (sizes of
a graph traced with dynamic shapes, evaluated per call).

Loaded by the package's ``torch_dynamo_backends`` entry point the first time ``torch.compile`` asks
for ``backend="remote"``, never on ``import remote_autograd.client`` (dynamo takes seconds to import).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_backend.py``: ``remote_backend``: each graph dynamo captured made a template, or run as it is (nothing
  remote) or call by call (what a template cannot hold, said once); the SDK's files kept out of dynamo's
  tracing
- ``_translate.py``: ``translate``: a graph split into its remote nodes (recorded: the template) and its local
  ones (sizes, numbers, CPU tensors: run by each call), and ``Plan``, what each call does
- ``_functorch.py``: ``Regions``: ``torch.func``'s ``vmap`` and ``grad`` (and ``vjp``, ``jacrev``) as dynamo
  inlines them, recorded as ``functorch`` steps around the region's calls on handles of the per-sample
  layouts; forward-mode transforms refused, and a graph with functorch calls never run call by call
- ``_compiled.py``: ``CompiledGraph``: each call of a compiled graph, one ``run_template`` step with new
  handles of known metadata (leaves, views, versions)
- ``_symbols.py``: sizes of a graph traced with dynamic shapes, bound from each call's inputs and evaluated
"""

from ._backend import remote_backend

__all__ = ["remote_backend"]
