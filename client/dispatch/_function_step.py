"""The one builder of a ``function`` step: a user Function's call made a node of the server's autograd.

Both kinds of node build it here: one whose backward is a recorded template (``_user_functions``) and one
whose backward runs on the client (``_client_run``).
"""

from __future__ import annotations

from remote_autograd.proto.messages import FunctionStep

from ..session._steps import OMIT, make_step


def function_step(name: str, inputs: list, outputs: list, nodes: list, grads: list, *, saved: list | None = None,
                  backward: str | None = None, live: list = (), once: bool = False, reentrant: bool = False,
                  materialize_grads: bool = True, variants: list | None = None, node: str | None = None,
                  client_backward: bool = False) -> dict:
    """The one builder of a ``function`` step: the call of a Function on ``inputs`` made ``outputs`` (``nodes``:
    None for an output torch left without a graph); ``grads``: which gradient each input's is; ``saved``: the
    ids bound to what its backward reads (None: nothing bound); ``backward``: its template (None: no remote backward); ``live``:
    tensors bound live; ``node``: the node's own id (a module hook's, a client-run node's)."""
    position = {id(a): i for i, a in enumerate(inputs)}
    dirty = [position[id(o)] for o in outputs if id(o) in position]
    non_differentiable = [j for j, n in enumerate(nodes) if n is None]
    return make_step(FunctionStep, name=name[:256], inputs=[a._id for a in inputs], outputs=[o._id for o in outputs],
                     saved=OMIT if saved is None else [b for b in saved if b is not None],  # a local one binds None
                     grads=grads, backward=OMIT if backward is None else backward, dirty=dirty or OMIT,
                     non_differentiable=non_differentiable or OMIT, live=[t._id for t in live] or OMIT,
                     once_differentiable=True if once else OMIT, reentrant=True if reentrant else OMIT,
                     materialize_grads=OMIT if materialize_grads else False, variants=variants or OMIT,
                     node=OMIT if node is None else node, client_backward=True if client_backward else OMIT)
