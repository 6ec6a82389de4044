"""A torch call on RemoteTensors made into a queued step: the one builder of steps.

``_dispatch`` (``call_op``: the arguments encoded, the outputs' metadata inferred, the step
queued; every op call of the SDK goes through it), ``_infer`` (outputs' shapes and dtypes by
rule, without torch), ``_outputs`` (which outputs are views of which inputs), ``_meta_memo``
(the speed path of inference: an answer remembered per call signature).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_dispatch.py``: ``call_op``, the one verb for an op (a torch callable or an op name) and the one builder
  of its ``call`` step: arguments encoded, outputs' metadata inferred, the step queued
- ``_infer.py``: output shapes and dtypes without the server: the cheap rules (broadcasting, promotion), and
  torch on the meta device
- ``_outputs.py``: an op's outputs worked out on the client from its shape rule (``_infer``), and which of
  them are views of which input (the plain path of the meta memo)
- ``_meta_memo.py``: the meta memo: ``_outputs``' answers kept by the op and its arguments' metadata, so a
  repeated op skips inference
- ``_user_functions.py``: ``attach``: a user's ``autograd.Function`` torch records on remote tensors, its
  backward recorded into a template as ``apply`` returns (a stand-in ``ctx`` answering saved tensors with the
  recording's handles; the real session refusing every step meanwhile) and sent with a ``function`` step;
  wired into ``session/_callsite`` by ``client/__init__.py``
- ``_closure_saved.py``: torch.compile's form of a user Function (dynamo's ``autograd_function_apply``) keeps
  what its forward saved in a closure, not on ``ctx``: that cell found, and the recording's handles put in it
  while ``attach`` records the backward
- ``_client_run.py``: a user Function whose backward reads values (refused as a template by ``attach``) made a
  client-run node: a ``function`` step with ``client_backward`` (the server's node cuts the graph), a
  ``ClientRun`` record riding in its outputs' ``_leaves`` (so it lives while a handle depends on it), and
  ``run``: the Function's own backward called here on the captured gradients, its result checked as torch's
  engine does
- ``_checkpoint.py``: ``torch.utils.checkpoint(..., use_reentrant=True)`` recorded as a user Function: the
  module's parameters and buffers bound live (its own backward fills their ``.grad`` on the server), the
  session's random state at the forward kept there and set for the recomputation (as torch does for CUDA)

In the walk of one op:

``call_op`` (``client/dispatch/_dispatch.py``), the SDK's one verb for an op and the one builder of its step:
torch calls come here from ``__torch_function__`` and the handlers, ops by name (factories,
``sess.manual_seed``, ``sess.ops.X``) from ``Session`` and the device kernels, with a route from the same
``RouteTable``. Its ``Encoder`` turns each argument into a wire value: a RemoteTensor into ``{"ref": id}``, a
Python value as itself. A local tensor follows torch's device rule: a 0-d CPU tensor becomes a ``put`` step
queued just before (a constant), any other raises torch's "Expected all tensors to be on the same device" at
once; where torch itself takes CPU tensors beside another device's (index tensors, ``copy_``'s source, a basic
assignment's value, packed sequences' lengths) they are put on purpose. The outputs' shape and dtype come from
``client/dispatch/_outputs.py`` according to the op's ``shape_rule`` (the cheap rules of
``client/dispatch/_infer.py``, or torch's meta kernels, which also say which outputs are views of which input,
for ``client/tensor/_views.py``), through the meta memo (``client/dispatch/_meta_memo.py``): the second time
an op meets arguments with the same metadata, the answer is a dictionary look-up. So a new ``RemoteTensor`` is
returned at once with an id of the client's choosing (``SessionCore.new_id``). Nothing has been sent.
"""
