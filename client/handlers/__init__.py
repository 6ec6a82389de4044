"""Torch calls a RemoteTensor answers without a server op of the same name, and the device's kernels.

Each module answers a family in a ``HandlerTable`` of its own (``_handler_table``): ``_metadata``
(shape, dtype, value reads), ``_autograd`` (requires_grad, grad, backward, detach), ``_hooks``
(``register_hook``, recorded at each backward), ``_moves``
(``.to``, ``.cpu``, ``new_*``), ``_addresses`` (``data_ptr``, ``untyped_storage``: which server
memory a tensor is in), ``_packed`` (packed sequences), ``_composites`` (torch functions
run as torch's own Python over our ops: ``nn.init``), ``_copies`` (``copy.deepcopy``, pickling a
state, ``torch.load`` onto the device). ``_weights`` loads server-side weights into a module;
``_kernels`` holds the ``remote`` device's factory kernels (``torch.zeros(..., device=...)``),
which torch's dispatcher calls (registered as it is imported). ``LOCAL_HANDLERS`` is the tables merged, a
callable claimed twice refused; this package registers it into the core's table (``client/_core``'s
``LOCAL_HANDLERS``, which ``RemoteTensor.__torch_function__`` consults) as it is imported.
"""

from __future__ import annotations

from .. import _core
from . import _addresses, _autograd, _composites, _copies, _hooks, _kernels, _metadata, _moves, _packed
from ._handler_table import merge

HANDLER_MODULES = (_metadata, _autograd, _hooks, _moves, _addresses, _packed, _composites, _copies)
LOCAL_HANDLERS = merge(*(m.HANDLERS for m in HANDLER_MODULES))
_core.LOCAL_HANDLERS.update(LOCAL_HANDLERS)
