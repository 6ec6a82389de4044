"""``torch.compile(fn, backend="remote")``: a graph dynamo captured runs on the server as a template.

``_backend`` (the backend dynamo calls with each graph), ``_translate`` (a graph made a template once,
by recording its remote calls through the SDK's own eager path into a ``Recorder`` (``session/_recorder``), and
the plan of each call), ``_compiled`` (each call: one ``run_template`` step), ``_symbols`` (sizes of
a graph traced with dynamic shapes, evaluated per call).

Loaded by the package's ``torch_dynamo_backends`` entry point the first time ``torch.compile`` asks
for ``backend="remote"``, never on ``import remote_autograd.client`` (dynamo takes seconds to import).
"""

from ._backend import remote_backend

__all__ = ["remote_backend"]
