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

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_handler_table.py``: ``HandlerTable``, the table each handler module fills, and ``merge``, which refuses a
  callable claimed twice
- ``_metadata.py``, ``_autograd.py``: calls answered without a step (metadata, value reads) or with their own
  step kind (backward, grad, requires_grad)
- ``_moves.py``: moves between the client and a session: ``.to(device)``, ``.to(other_tensor)``, ``.cpu()``,
  ``module.to`` (and ``module.to(tensor)``; a move that would drop a parameter's hooks refused; a lazy
  module's uninitialized tensors materialize in the session at its first forward), ``.data``,
  ``type``/``type_as``, ``.cuda()``'s refusal, ``x.new(...)`` and ``x.new_*``
- ``_addresses.py``: ``data_ptr()``, ``untyped_storage()``, ``storage()``, ``storage_offset()``: which server
  memory a tensor is in and where it starts there, as numbers no process maps (identities, never addresses)
- ``_copies.py``: copies made on the server: ``copy.deepcopy`` of remote tensors (a ``clone`` step), and
  ``torch.load(..., map_location=device)`` (storages uploaded once, tensors rebuilt on them)
- ``_composites.py``: ``nn.init.*`` on RemoteTensors, run as the tensor calls they are made of
- ``_packed.py``: packed sequences: the data packed on the server, ``batch_sizes`` and ``lengths`` (which
  torch keeps on the CPU) computed locally
- ``_staged.py``: a ``backward()`` / ``torch.autograd.grad`` whose roots reach client-run nodes, in stages:
  the server's step capturing the gradients at those nodes, then latest node first its backward here and the
  server's step again from its inputs; ``create_graph``, hooks and a freed graph refused there, naming the
  Function
- ``_hooks.py``: ``Tensor.register_hook`` on a remote tensor: kept on the handle, recorded anew into a
  template at each ``backward()`` / ``autograd.grad`` call (the step's ``hooks``), never replayed from an old
  recording, or observed (run after the step on the gradient the server kept);
  ``register_post_accumulate_grad_hook``: run after the backward step on the leaf, in the order the server
  answers
- ``_node_hooks.py``: module full backward (pre-)hooks: torch's ``BackwardHook`` closures taken by the
  ``grad_fn`` of its ``BackwardHookFunction``'s remote outputs; at each backward/grad call, a module call
  whose hooks may return new gradients is recorded into a template (``module_hooks``, run inside the server's
  backward; gradients the hooks kept made the real ones after the step), the others observed (``node_hooks``:
  run after the step on the gradients the server kept, in torch's order)
- ``_weights.py``: ``sess.load_weights``: a model on the device filled from a file of the server's model
  directory, by torch's own ``load_state_dict``
- ``_kernels.py``: factories and uploads that name the device (``torch.zeros(..., device=sess.device)``,
  ``with torch.device(...)``, ``local.to(device)``): Python kernels on the PrivateUse1 key
"""

from __future__ import annotations

from .. import _core
from . import _addresses, _autograd, _composites, _copies, _hooks, _kernels, _metadata, _moves, _packed
from ._handler_table import merge

HANDLER_MODULES = (_metadata, _autograd, _hooks, _moves, _addresses, _packed, _composites, _copies)
LOCAL_HANDLERS = merge(*(m.HANDLERS for m in HANDLER_MODULES))
_core.LOCAL_HANDLERS.update(LOCAL_HANDLERS)
