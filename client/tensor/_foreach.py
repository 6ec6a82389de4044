"""torch's optimizers and ``clip_grad_norm_`` take their ``foreach`` paths for RemoteTensors (a speed path).

torch picks an optimizer's implementation per step (``_default_to_fused_or_foreach``, imported by
each ``torch.optim`` module): ``foreach`` (one ``torch._foreach_*`` call for all of a group's
tensors) when every parameter is on a device with foreach kernels, as the PrivateUse1 device
``remote`` is, and of a plain tensor's type. A RemoteTensor is of a subclass, so torch takes the
single-tensor path (the plain path this replaces): Adam queues 9 ops per parameter and
``clip_grad_norm_`` 2, where the foreach paths queue about one per group.

Only where the two paths agree bit for bit on the CPU: torch's foreach ops there loop over the
same per-tensor kernels, and SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta and Rprop
order their arithmetic the same both ways, so a remote step equals local torch's (a CPU run
takes the single-tensor path). NAdam, RAdam and ASGD do not (their foreach paths round
differently in the last bits): they keep the single-tensor path. An explicit ``foreach=False``
is torch's to honour. ``tests/client/tensor/test_foreach_default.py`` trains each optimizer both
ways and compares.

The names changed are torch's private module state; where a torch version lacks one, nothing
is changed there and the single-tensor path stays (slower, never different).
"""

from __future__ import annotations

import importlib

import torch

# the torch.optim modules whose foreach path equals their single-tensor path, bit for bit on the CPU
SAME_BOTH_WAYS = ("sgd", "adam", "rmsprop", "adagrad", "adamax", "adadelta", "rprop")


def take_foreach_paths(tensor_type: type) -> None:
    """Let the optimizers of ``SAME_BOTH_WAYS`` and ``clip_grad_norm_`` take foreach for ``tensor_type``."""
    for name in SAME_BOTH_WAYS:
        module = importlib.import_module(f"torch.optim.{name}")
        decide = getattr(module, "_default_to_fused_or_foreach", None)
        if decide is not None and getattr(decide, "for_type", None) is not tensor_type:
            module._default_to_fused_or_foreach = _counting_as_plain(decide, tensor_type)
    utils = importlib.import_module("torch.utils._foreach_utils")  # clip_grad_norm_'s _has_foreach_support
    supported = getattr(utils, "_foreach_supported_types", None)
    if isinstance(supported, list) and tensor_type not in supported:
        supported.append(tensor_type)


def _counting_as_plain(decide, tensor_type: type):
    """torch's ``decide``, where a group of ``tensor_type`` tensors gets what plain tensors on their device get."""
    def decide_with_remote(params, differentiable, use_fused=False):
        fused, foreach = decide(params, differentiable, use_fused)
        if fused or foreach or differentiable or torch.jit.is_scripting():
            return fused, foreach
        devices = _foreach_devices()
        if params and all(p is None or (type(p) is tensor_type and p.device.type in devices) for p in params):
            return False, True
        return fused, foreach

    decide_with_remote.for_type = tensor_type
    return decide_with_remote


def _foreach_devices() -> list[str]:
    return importlib.import_module("torch.utils._foreach_utils")._get_foreach_kernels_supported_devices()
