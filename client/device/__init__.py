"""The ``remote`` device as torch sees it, and torch's rules about devices.

``_device`` (torch's PrivateUse1 backend renamed ``remote``: ``sess.device`` is
``torch.device("remote", k)``, its device module, which session an index names),
``_device_rule`` (a local tensor beside a remote one: torch's error, or the cases where torch
takes CPU tensors on purpose), ``_autocast`` (whether ``torch.autocast`` applies to remote ops,
and its dtype).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_device.py``: the ``remote`` torch device (PrivateUse1 renamed), which session each index ``remote:k``
  means, and ``torch.remote``, the device module (device count, the sessions' generator state, autocast
  dtypes)
- ``_device_rule.py``: torch's device rule: which local tensors an op with remote tensors may take (a 0-d CPU
  one, and the arguments torch takes from the CPU), and torch's error for the rest
- ``_autocast.py``: whether a ``torch.autocast`` applies to remote ops (one for the ``remote`` device type, as
  torch's regions apply to their own device's tensors), and the dtype a step carries for it

How calls reach the server:

Importing the SDK renames PyTorch's spare backend slot, PrivateUse1, to ``remote``
(``torch.utils.backend_registration``, pure Python, with a small device module as ``torch.remote``); each open
session takes an index, so ``sess.device`` is ``torch.device("remote", k)`` and a ``RemoteTensor`` (a wrapper
subclass) reports it as its ``device``. How calls reach the server (``client/device/_device.py``,
``client/handlers/_kernels.py``, ``client/handlers/_moves.py``):

- A call with a remote tensor among its arguments reaches ``RemoteTensor.__torch_function__`` and becomes a
  queued step, as before.
- A factory naming the device has no tensor argument (``torch.zeros(3, device=device)``, ``torch.arange(T,
  device=idx.device)``, everything inside ``with torch.device(device):``). The dispatcher sends it to Python
  kernels registered with ``torch.library`` for the PrivateUse1 key (``zeros``, ``empty``, ``randn``,
  ``arange``, ...), which queue the server's op of the same name. ``local.to(device)``, ``torch.tensor(data,
  device=device)`` and an optimizer's state load all reach the ``_to_copy`` kernel, which uploads.
- We chose kernels over a ``TorchFunctionMode`` that inspects every call's ``device`` keyword: a mode must be
  on all the time, so it taxes every local torch op in the process (about twice the cost of a small CPU op,
  measured), while kernels are only reached by calls that name the remote device. Local code in the same
  process pays nothing.
- ``nn.Module._apply`` (behind ``model.to``, ``cpu()``) keeps a ``Parameter`` object only when the converted
  tensor fits into the old one; a CPU tensor and a remote handle do not, so the move converts the parameter
  object itself in place (what ``torch.utils.swap_tensors`` does) and gives it back. Identity,
  ``requires_grad`` and ``.grad`` move with it.
- Moves are not differentiable; none loses a gradient silently (see the known differences).
- Devices follow torch's rule (``client/device/_device_rule.py``, applied by ``Encoder.value`` in
  ``client/dispatch/_dispatch.py``): a local tensor with dimensions beside remote ones raises torch's own
  error, so no upload hides in a training step and code that runs here runs on CUDA. The few arguments torch
  takes from the CPU beside another device's tensors are listed there by position (``CPU_ARGUMENTS``) or by
  kind (indices, a basic assignment's value); the Encoder uploads those on purpose.
- The device module (``torch.remote``, ``client/device/_device.py``) is what torch calls for the current
  accelerator, which a registered PrivateUse1 backend always is (even beside CUDA). ``is_available()`` answers
  False: torch asks it before pinning a ``DataLoader``'s batches, synchronising a benchmark timer, choosing
  checkpointing's or ``DataParallel``'s device, and the remote device has no local memory, streams or kernels
  for any of these, so local code behaves as on a CPU-only machine. The rng calls read and write the session's
  generator with the session ops ``get_rng_state`` / ``set_rng_state`` (``service/ops/session.py``; one round
  trip to read), which is what ``fork_rng`` needs; ``get_amp_supported_dtype`` lets
  ``torch.autocast(device_type="remote")`` stay on.
- ``torch.load(..., map_location=device)`` moves storages, not tensors, and builds each tensor with ``empty(0,
  device=...).set_(storage, offset, size, stride)``. ``client/handlers/_copies.py`` registers a deserializer
  for ``remote`` locations (``torch.serialization.register_package``, ahead of torch's PrivateUse1 one, which
  would need device-side storage) that keeps the bytes in client memory and marks the storage with its device;
  the ``set_``, which torch's binding sends past ``__torch_function__`` straight to ``__torch_dispatch__``,
  uploads the storage once as a flat tensor and makes the tensor that view of it on the server (``.data =``,
  then ``as_strided_``), so tensors that shared a storage share memory there. Below autograd, the queueing
  goes through the session's ops directly (torch calls on the handle would not reach ``__torch_function__``
  there).
- ``copy.deepcopy`` reaches ``Tensor.__deepcopy__`` through ``__torch_function__``: a ``clone`` step, with
  torch's rules for what a copy keeps (a Parameter: data and ``requires_grad``; a plain tensor: also a copy of
  ``.grad`` and of its Python attributes), the handle's own fields never copied, and deepcopy's memo keeping
  one object one copy.
"""
