"""Around the core's ``call_op`` (``client/_core``): what a call makes, and a user's Function on remote tensors.

Inference: ``_outputs`` (an op's outputs worked out by its shape rule: which are views of which
inputs), ``_infer`` (shapes and dtypes by rule, without torch), ``_meta_memo`` (its speed path: an
answer remembered per call signature; it registers the answer into the core's ``INFERENCE`` table as
it is imported). User Functions: ``_user_functions`` (a ``torch.autograd.Function``'s backward recorded
as a server template; registered into ``session/_callsite``'s watch as it is imported), ``_client_run``
(a backward that reads values, run on the client), ``_checkpoint`` (reentrant checkpoint's extras),
``_closure_saved`` (what torch.compile's Functions keep in a closure), ``_function_step`` (the one builder of
a ``function`` step, for both kinds of node).
"""

from . import _meta_memo, _user_functions  # their registrations (the core's INFERENCE, the callsite's watch)
