"""What the core's ``RemoteTensor`` (``client/_core``) keeps locally, below it: pure helpers it imports.

``_views`` (which handles share server memory: versions, views, strides, shape-changing in-place ops),
``_autograd_flags`` (the C++ ``requires_grad`` and ``.grad`` of a handle kept the SDK's),
``_factory_outputs`` (``requires_grad=True`` that torch sets on a device kernel's result after it
returns), ``_foreach`` (torch's optimizers take their foreach paths for a RemoteTensor, as for any
accelerator's tensor), ``_func_transforms`` (torch.func transforms around a call: refused),
``_traced`` (a RemoteTensor while ``torch.compile`` traces it: a traceable wrapper subclass).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_autograd_flags.py``: the C++ ``requires_grad`` and ``.grad`` of a handle kept equal to the SDK's (dynamo's
  guards and a compiled ``opt.step()`` read them)
- ``_func_transforms.py``: torch.func's transforms (``grad``, ``vmap``, ``jacrev``, ...) meeting a remote
  tensor in eager code: the first op under one refuses, naming the transform and ``torch.compile(...,
  backend="remote")`` (they run locally on wrapped tensors); while dynamo traces, forward-mode transforms
  refused
- ``_traced.py``: a RemoteTensor while ``torch.compile`` traces it: a traceable wrapper subclass whose inner
  tensor is its meta stand-in (``__tensor_flatten__``, the traced wrappers' dispatch on fakes), the refusal of
  a backend that would compile kernels here, and the C++ autograd facts kept those of the handle
- ``_views.py``: which RemoteTensors share memory on the server (views, ``detach``), their strides and version
  counters, and the new layout after a shape-changing in-place op
- ``_foreach.py``: torch's optimizers and ``clip_grad_norm_`` take their ``foreach`` paths for RemoteTensors,
  as for a ``cuda`` tensor (one op per group, not one per parameter)
- ``_factory_outputs.py``: the kernels' outputs whose ``requires_grad`` torch sets after the kernel returns,
  settled at the next ``__torch_function__``

In the walk of one op:

``RemoteTensor.__torch_function__`` (``client/_core.py``). torch calls it for every function, method
and operator that sees a RemoteTensor. A call the tensor answers itself is looked up first in
``LOCAL_HANDLERS`` (filled from ``client/handlers/_metadata.py``, ``client/handlers/_autograd.py``, ...):
``shape``, ``requires_grad``, ``backward``, ``item``, ... Otherwise the session's ``RouteTable``
(``client/session/_routes.py``, built once from ``GET /v1/ops``) names the op; a callable the table lacks
raises ``NotImplementedError`` naming it.
"""
