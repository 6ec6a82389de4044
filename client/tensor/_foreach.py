"""torch's optimizers and ``clip_grad_norm_`` take their ``foreach`` paths for RemoteTensors (a speed path).

torch picks an optimizer's implementation at each step (``_default_to_fused_or_foreach``):
``foreach`` (one ``torch._foreach_*`` call for all of a group's tensors) when every parameter is on
a device with foreach kernels, as the PrivateUse1 device ``remote`` is, and of a plain tensor's
type. A RemoteTensor is of a subclass, so torch takes the single-tensor path (the plain path this
replaces): Adam queues 9 ops per parameter and ``clip_grad_norm_`` 2, where the foreach paths
queue about one per group.

Only where the two paths agree bit for bit on the CPU: torch's foreach ops there loop over the
same per-tensor kernels, and SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, Adadelta and Rprop
order their arithmetic the same both ways, so a remote step equals local torch's (whose CPU run
takes the single-tensor path). NAdam, RAdam and ASGD round differently in the last bits: they
keep the single-tensor path. ``tests/client/tensor/test_foreach_default.py`` trains each both ways.

How: a step pre-hook common to all optimizers (``register_optimizer_step_pre_hook``, torch's public
API) sets ``foreach=True`` on a group of RemoteTensors whose ``foreach`` and ``fused`` the user left
unset, and the post-hook sets it back, so ``param_groups`` and ``state_dict()`` read as the user
made them. Local optimizers are looked at and left alone. (Patching the function torch decides
with is not an option: ``torch.distributed.optim`` compiles it with TorchScript.)
``clip_grad_norm_`` decides from ``torch.utils._foreach_utils._foreach_supported_types``, which
lists RemoteTensor; where a torch version lacks that list, clipping keeps its per-tensor path.
"""

from __future__ import annotations

import importlib

import torch
from torch._C._dynamo.eval_frame import get_eval_frame_callback as _eval_frame_callback
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

# the optimizers whose foreach path equals their single-tensor path, bit for bit on the CPU
SAME_BOTH_WAYS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop, torch.optim.Adagrad,
                  torch.optim.Adamax, torch.optim.Adadelta, torch.optim.Rprop)
_SET = "_remote_autograd_foreach"  # a group's mark: foreach is ours for the length of one step


def take_foreach_paths(tensor_type: type) -> None:
    """Let the optimizers of ``SAME_BOTH_WAYS`` and ``clip_grad_norm_`` take foreach for ``tensor_type``."""
    def before_step(optimizer, args, kwargs) -> None:
        if type(optimizer) not in SAME_BOTH_WAYS:  # exact types: a subclass may compute otherwise
            return
        compiled = _eval_frame_callback() is not None
        for group in optimizer.param_groups:
            if not (group["params"] and all(type(p) is tensor_type for p in group["params"])):
                continue
            if group.get("foreach") is None and not group.get("fused") and not group.get("differentiable"):
                group["foreach"], group[_SET] = True, True
            if compiled and group.get("capturable") is False and all(p not in optimizer.state for p in group["params"]):
                # a step torch.compile traces: its state made on the device, as dynamo makes a CUDA
                # parameter's (its steps made on the CPU would be moved there between two groups'
                # first steps, the first graph left counting the CPU ones). Kept: the state is there.
                group["capturable"] = True

    def after_step(optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            if group.pop(_SET, False):
                group["foreach"] = None

    register_optimizer_step_pre_hook(before_step)
    register_optimizer_step_post_hook(after_step)
    utils = importlib.import_module("torch.utils._foreach_utils")  # clip_grad_norm_'s _has_foreach_support
    supported = getattr(utils, "_foreach_supported_types", None)
    if isinstance(supported, list) and tensor_type not in supported:
        supported.append(tensor_type)
