"""The handle: ``RemoteTensor`` and the local knowledge it keeps.

``_tensor`` (``RemoteTensor``: a ``torch.Tensor`` wrapper whose values live on the server; its
``__torch_function__`` is where every torch call on it starts), ``_views`` (which handles share
server memory: versions, views, strides, shape-changing in-place ops), ``_factory_outputs``
(``requires_grad=True`` that torch sets on a device kernel's result after it returns), ``_foreach``
(torch's optimizers take their foreach paths for a RemoteTensor, as for any accelerator's tensor),
``_traced`` (a RemoteTensor while ``torch.compile`` traces it: a traceable wrapper subclass).
"""
