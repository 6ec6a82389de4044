"""Around the core's ``call_op`` (``client/_core``): what a call makes, and a user's Function on remote tensors.

Inference: ``_outputs`` (an op's outputs worked out by its shape rule: which are views of which
inputs), ``_infer`` (shapes and dtypes by rule, without torch), ``_meta_memo`` (its speed path: an
answer remembered per call signature; it registers the answer into the core's ``INFERENCE`` table as
it is imported). User Functions: ``_user_functions`` (a ``torch.autograd.Function``'s backward recorded
as a server template; registered into ``session/_callsite``'s watch as it is imported), ``_client_run``
(a backward that reads values, run on the client), ``_checkpoint`` (reentrant checkpoint's extras),
``_closure_saved`` (what torch.compile's Functions keep in a closure), ``_function_step`` (the one builder of
a ``function`` step, for both kinds of node).

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``_infer.py``: output shapes and dtypes without the server: the cheap rules (broadcasting, promotion), and
  torch on the meta device
- ``_outputs.py``: an op's outputs worked out on the client from its shape rule (``_infer``), and which of
  them are views of which input (the plain path of the meta memo)
- ``_meta_memo.py``: the meta memo: ``_outputs``' answers kept by the op and its arguments' metadata, so a
  repeated op skips inference
- ``_user_functions.py``: ``attach``: a user's ``autograd.Function`` torch records on remote tensors, its
  backward recorded into a template as ``apply`` returns (a stand-in ``ctx`` answering saved tensors with the
  recording's handles; the real session refusing every step meanwhile) and sent with a ``function`` step;
  registered into ``session/_callsite`` as it is imported
- ``_closure_saved.py``: torch.compile's form of a user Function (dynamo's ``autograd_function_apply``) keeps
  what its forward saved in a closure, not on ``ctx``: that cell found, and the recording's handles put in it
  while ``attach`` records the backward
- ``_client_run.py``: a user Function whose backward reads values (refused as a template by ``attach``) made a
  client-run node: a ``function`` step with ``client_backward`` (the server's node cuts the graph), a
  ``ClientRun`` record riding in its outputs' ``_leaves`` (so it lives while a handle depends on it), and
  ``run``: the Function's own backward called here on the captured gradients, its result checked as torch's
  engine does
- ``_function_step.py``: the one builder of a ``function`` step, for both kinds of node (a recorded
  backward, a client-run one)
- ``_checkpoint.py``: ``torch.utils.checkpoint(..., use_reentrant=True)`` recorded as a user Function: the
  module's parameters and buffers bound live (its own backward fills their ``.grad`` on the server), the
  session's random state at the forward kept there and set for the recomputation (as torch does for CUDA)

In the walk of one op:

``call_op`` (``client/_core.py``), the SDK's one verb for an op and the one builder of its step:
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

from . import _meta_memo, _user_functions  # their registrations (the core's INFERENCE, the callsite's watch)
