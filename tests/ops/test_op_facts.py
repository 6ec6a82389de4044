"""Every fact the engine's speed paths and the SDK act on is a field of the op's entry, and the table gives
exactly the ops the hand lists it replaced named (copied here as they were, so nothing changes silently).

The lists were by a spelling's last part (``add_``, ``t_``) or by torch callable; an entry holds the
fact for all its spellings, so each list is compared as the set of entries one of whose in-place
spellings (or torch names) it named.
"""

from __future__ import annotations

import torch

from remote_autograd import client
from remote_autograd.proto import op_contract
from remote_autograd.proto.messages import OpInfo
from remote_autograd.proto.op_contract import is_inplace_name
from remote_autograd.service.ops import OP_TABLE, surface
from remote_autograd.service.ops._registry import FACTS

# service/engine/kept_storages.py's KEEPING, and its rule for every in-place _foreach_ op
KEEPING = {"add_", "sub_", "mul_", "div_", "true_divide_", "lerp_", "addcmul_", "addcdiv_", "copy_", "zero_", "fill_",
           "clamp_", "clamp_min_", "clamp_max_", "sqrt_", "rsqrt_", "neg_", "abs_", "exp_", "log_", "pow_", "sign_",
           "reciprocal_", "tanh_", "sigmoid_", "relu_", "masked_fill_"}
# service/engine/program_plan.py's _RELAYOUT (proto/op_contract.py's SHAPE_INPLACE, and set_)
RELAYOUT = {"squeeze_", "unsqueeze_", "t_", "transpose_", "swapaxes_", "swapdims_", "resize_", "resize_as_",
            "as_strided_", "set_"}
# program_plan.py's _FLOATS_BY_TYPE (entries of torch's surface, by name)
ARITHMETIC = {"add", "sub", "mul", "div", "lerp", "addcdiv", "addcmul"}
FLOATS_BY_TYPE = ARITHMETIC | {f"_foreach_{name}" for name in ARITHMETIC}
# service/engine/replayable.py's FACTORIES_FIT (our own entries that fit a capture)
FACTORIES_FIT = {"zeros", "ones", "empty", "full", "arange"}
# client/device/_device_rule.py's CPU_ARGUMENTS (torch.ctc_loss was listed too: the table has no route for it)
CPU_ARGUMENTS = {
    torch.Tensor.copy_: (1,), torch._pack_padded_sequence: (1,), torch._pad_packed_sequence: (1,),
    torch.lstm: (1,), torch.gru: (1,), torch.rnn_tanh: (1,), torch.rnn_relu: (1,),
    torch.nn.functional.ctc_loss: (2, 3),
}
# client/tensor/_views.py's MAYBE_VIEWS (entry names)
MAYBE_VIEWS = {"reshape", "flatten", "reshape_as", "contiguous", "ravel"}

ENTRIES = list(OP_TABLE)
SURFACE = [e for e in ENTRIES if e.variants]


def _by_inplace_spelling(names) -> set[str]:
    return {e.name for e in SURFACE for w in e.variants if is_inplace_name(w) and w.rpartition(".")[2] in names}


def _with(fact: str) -> set[str]:
    return {e.name for e in ENTRIES if getattr(e, fact)}


def test_keeps_storage_is_the_old_keep_list():
    foreach = {e.name for e in SURFACE for w in e.variants if w.startswith("_foreach_") and is_inplace_name(w)}
    assert _with("keeps_storage") == _by_inplace_spelling(KEEPING) | foreach


def test_relayout_is_the_old_list_and_the_probe_finds_most():
    assert _with("relayout") == _by_inplace_spelling(RELAYOUT)
    assert {"t", "transpose", "squeeze", "unsqueeze", "resize"} <= _with("relayout")


def test_floats_keep_layout_is_the_old_list():
    assert _with("floats_keep_layout") == {e.name for e in SURFACE if e.name in FLOATS_BY_TYPE} == FLOATS_BY_TYPE


def test_capturable_is_the_old_rule():
    """An entry of the surface whose output shapes follow from the layouts, or one of the old list's factories."""
    assert _with("capturable") == {e.name for e in SURFACE if not e.data_dependent} | FACTORIES_FIT


def test_cpu_args_are_the_old_positions():
    by_callable = {surface.walk(t): e.cpu_args for e in SURFACE if e.cpu_args for t in e.torch_names}
    assert by_callable == CPU_ARGUMENTS


def test_maybe_view_and_factory():
    assert _with("maybe_view") == MAYBE_VIEWS
    assert _with("factory") == set(op_contract.FACTORIES)  # the contract's names: the one list of them


def test_the_facts_are_served_and_the_sdk_reads_them():
    served = {e.name: OpInfo.model_validate(e.info()) for e in ENTRIES}
    for fact in FACTS:
        assert {n for n, info in served.items() if getattr(info, fact)} == _with(fact), fact
    with client.connect(transport=client.InProcessTransport()) as sess:
        ops = sess._routes.ops
        assert ops["reshape"].maybe_view and not ops["view"].maybe_view
        assert ops["t"].relayout and not ops["add"].relayout
        assert ops["nn.functional.ctc_loss"].cpu_args == (2, 3) and ops["add"].cpu_args == ()
