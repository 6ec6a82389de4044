"""What the core's ``RemoteTensor`` (``client/_core``) keeps locally, below it: pure helpers it imports.

``_views`` (which handles share server memory: versions, views, strides, shape-changing in-place ops),
``_autograd_flags`` (the C++ ``requires_grad`` and ``.grad`` of a handle kept the SDK's),
``_factory_outputs`` (``requires_grad=True`` that torch sets on a device kernel's result after it
returns), ``_foreach`` (torch's optimizers take their foreach paths for a RemoteTensor, as for any
accelerator's tensor), ``_func_transforms`` (torch.func transforms around a call: refused),
``_traced`` (a RemoteTensor while ``torch.compile`` traces it: a traceable wrapper subclass).
"""
