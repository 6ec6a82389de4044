"""Errors for torch calls the SDK does not run, in the words the user wrote.

``not_in_table`` names the call as the user spelled it (``Tensor.data``, ``nn.LSTM``),
not torch's internal (``Tensor.data.__get__``, ``torch._VF.lstm``), and says what to do.
The "register a custom op" hint is given only for a plain torch function the server's
table lacks; calls that cannot work through a proxy (hooks on tensors, storage access,
function transforms) say why instead.
"""

from __future__ import annotations

from typing import Callable

import torch

from ._routes import torch_name

# torch internals that public modules and functions call: the name the user wrote.
_MODULE_NAMES = {  # torch._VF.<name> reaches us as torch.<name>
    "lstm": "nn.LSTM", "gru": "nn.GRU", "rnn_tanh": "nn.RNN", "rnn_relu": "nn.RNN(nonlinearity='relu')",
    "lstm_cell": "nn.LSTMCell", "gru_cell": "nn.GRUCell", "rnn_tanh_cell": "nn.RNNCell", "rnn_relu_cell": "nn.RNNCell",
    "_native_multi_head_attention": "nn.MultiheadAttention", "embedding_bag": "nn.EmbeddingBag",
}
_USER_NAMES = {
    **{f"torch.{k}": v for k, v in _MODULE_NAMES.items()}, **{f"torch._VF.{k}": v for k, v in _MODULE_NAMES.items()},
    "torch._C._nn.scaled_dot_product_attention": "F.scaled_dot_product_attention",
    "torch._C._nn.pad": "F.pad",
}

# Calls that cannot be honoured through a proxy whose values live elsewhere.
_WHY_NOT = {
    "Tensor.share_memory_": "the values live on the server",
    "Tensor.pin_memory": "the values live on the server",
}


def user_name(func: Callable) -> str:
    """``Tensor.data`` for ``Tensor.data.__get__``, ``nn.LSTM`` for ``torch._VF.lstm``."""
    name = torch_name(func)
    for suffix in (".__get__", ".__set__", ".__delete__"):
        if name.endswith(suffix):
            name = name[: -len(suffix)] + (" = ..." if suffix == ".__set__" else "")
    name = name.replace("torch._C.TensorBase.", "Tensor.").replace("torch.Tensor.", "Tensor.")
    if name.startswith("torch.functional."):  # torch.istft, torch.meshgrid: defined there, called as torch.*
        name = "torch." + name[len("torch.functional."):]
    return _USER_NAMES.get(name, name)


def not_in_table(func: Callable) -> Exception:
    name = user_name(func)
    why = _WHY_NOT.get(name)
    if why is not None:
        return RuntimeError(f"{name} is not supported on a remote tensor: {why}")
    if name.startswith("torch._") or name.startswith("nn."):
        return NotImplementedError(f"{name} is not supported on a remote tensor yet: the server's op table has no "
                                   f"entry for it (GET /v1/ops lists the table). {_LOCALLY}")
    return NotImplementedError(
        f"{name} is not supported on RemoteTensor: the server's op table has no entry for it "
        f"(GET /v1/ops lists the table; custom ops are registered on the server, see README). {_LOCALLY}"
    )


# What works today for any call the table lacks: the call on local copies. Moves are not differentiable
# (client/handlers/_moves.py), so the copies are detached and the result comes back as a constant.
_LOCALLY = ("To run it anyway, call it on local copies (`x.detach().cpu()`) and move the result back with "
            "`.to(x.device)`; no gradient flows through these moves")


def refuse_local_leaf(t: torch.Tensor, where: str | None) -> None:
    """A local tensor that requires grad, in an op with remote tensors while grad is recorded: it would
    be uploaded as a constant and never get its gradient. Raised, never ignored."""
    raise RuntimeError(
        f"a local tensor that requires grad (shape {list(t.shape)}) is used with remote tensors: it would be "
        f"uploaded as a constant and never get a gradient. Move it to the remote device first "
        f"(`t.to(device)`, or `model.to(device)` for the module that owns it) ({where or '?'})"
    )


# saved_tensors_hooks that change nothing a backward computes (where tensors wait, not their values): allowed.
# torch.utils.checkpoint(use_reentrant=False) sets its own around the function (the server then recomputes
# what its ops save: _checkpoint_regions); save_on_cpu offloads (the server keeps them on its device).
_HARMLESS_PACK_HOOKS = frozenset({("torch.utils.checkpoint", "_checkpoint_hook.__init__.<locals>.pack_hook"),
                                  ("torch.autograd.graph", "save_on_cpu.__init__.<locals>.pack_to_cpu")})
# torch's recomputation of a checkpointed function on the client: only a Function's saved tensors, read as the SDK
# records its backward, unpack there (no client node saves anything else)
_RECOMPUTING = ("torch.utils.checkpoint", "_recomputation_hook.__init__.<locals>.pack_hook")


def refuse_saved_tensors_hooks(hooks: tuple, op_name: str, where: str | None) -> None:
    """A graph recorded on remote tensors inside ``torch.autograd.graph.saved_tensors_hooks(pack, unpack)``:
    the server's autograd saves what its backward needs and never calls the client's hooks, so an unpack
    that changes values (quantised activations) would change the gradient silently. Raised, never ignored."""
    pack = hooks[0]
    name = (getattr(pack, "__module__", None), getattr(pack, "__qualname__", None))
    if name in _HARMLESS_PACK_HOOKS:
        return
    if name == _RECOMPUTING:
        raise RuntimeError(
            f"{op_name}: torch.utils.checkpoint(use_reentrant=False) is recomputing its function on the client, "
            "which reads a tensor a torch.autograd.Function saved (ctx.save_for_backward) inside the checkpointed "
            "function: not supported on remote tensors yet (the server recomputes the function's other ops). Apply "
            f"the Function outside the checkpointed function ({where or '?'})")
    raise RuntimeError(
        f"{op_name} on remote tensors that require grad inside torch.autograd.graph.saved_tensors_hooks: the "
        "server's autograd saves the tensors its backward needs and cannot call hooks written on the client, so "
        "they would be skipped silently. Run the forward outside the hooks (torch.utils.checkpoint("
        f"use_reentrant=False) and save_on_cpu are allowed: they change no value) ({where or '?'})"
    )
