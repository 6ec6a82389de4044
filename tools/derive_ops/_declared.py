"""Facts about torch's ops no probe can decide, declared once here and committed per entry in ``surface.json``.

A probe runs an op's recorded calls and sees what they did (``_facts``); it cannot see what a call
never does on any input. Each fact below is such a promise, given by name, for the entries of the
surface (their OpInfo or base name, ``derive._entries``' keys); the server and the SDK read it from
the entry (``OpEntry`` and ``GET /v1/ops``), never from a list of their own:

- ``keeps_storage``: an in-place call writes into its target as it is: the result has the target's
  shape (broadcasting never grows a target), no storage is swapped or resized, and a kernel that
  fails stops before its first write or writes in place. The runner counts no byte again after one
  (``service/engine/kept_storages.py``). torch's elementwise in-place arithmetic, and every in-place
  ``_foreach_`` op (lists of the same).
- ``floats_keep_layout``: its Python float arguments (a learning rate, a bias correction, an
  optimizer's betas) change neither an output's layout nor whether torch accepts the call: a plan
  keys them by type (``service/engine/program_plan.py``). Any other op's floats are by value (an
  interpolation's scale factor makes the output's shape; a random fill's bounds can be refused).
- ``relayout``, beside the probe's: in-place spellings that change their target's layout on some
  input but not on their samples (``as_strided_`` to the sizes it has, ``resize_as_`` of a tensor
  of the same shape).
- ``cpu_args``: positions of tensor arguments torch takes from the CPU beside another device's
  tensors, which the SDK uploads on purpose (``copy_``'s source; a packed sequence's batch sizes,
  which torch keeps on the CPU; CTC's input and target lengths).
- ``maybe_view``: gives a view or a copy depending on its input's strides (or the input itself):
  the SDK does not know which until the server says (``client/tensor/_views.py``).
"""

from __future__ import annotations

from typing import Any

_ARITHMETIC = ("add", "sub", "mul", "div", "lerp", "addcdiv", "addcmul")

KEEPS_STORAGE = frozenset({
    *_ARITHMETIC, "true_divide", "copy_", "zero_", "fill", "clamp", "clamp_min", "clamp_max", "sqrt", "rsqrt",
    "neg", "abs", "exp", "log", "pow", "sign", "reciprocal", "tanh", "sigmoid", "nn.functional.relu", "masked_fill",
})
FLOATS_KEEP_LAYOUT = frozenset({*_ARITHMETIC, *(f"_foreach_{name}" for name in _ARITHMETIC)})
RELAYOUT = frozenset({"as_strided", "resize_as"})
CPU_ARGS: dict[str, list[int]] = {
    "copy_": [1], "_pack_padded_sequence": [1], "_pad_packed_sequence": [1],
    "lstm": [1], "gru": [1], "rnn_tanh": [1], "rnn_relu": [1],  # a packed input's batch sizes
    "nn.functional.ctc_loss": [2, 3],  # input and target lengths
}
MAYBE_VIEW = frozenset({"reshape", "flatten", "reshape_as", "contiguous", "ravel"})


def facts(name: str, inplace: bool, relayout_probed: bool) -> dict[str, Any]:
    """The declared facts of entry ``name`` (``inplace``: it has an in-place spelling), only those that
    hold: the file lists a fact where it is true."""
    found: dict[str, Any] = {}
    if inplace and (name in KEEPS_STORAGE or name.startswith("_foreach_")):
        found["keeps_storage"] = True
    if name in FLOATS_KEEP_LAYOUT:
        found["floats_keep_layout"] = True
    if relayout_probed or name in RELAYOUT:
        found["relayout"] = True
    if name in CPU_ARGS:
        found["cpu_args"] = CPU_ARGS[name]
    if name in MAYBE_VIEW:
        found["maybe_view"] = True
    return found


def unknown(ops: dict[str, Any]) -> list[str]:
    """Names declared here that the surface has no entry for (a torch upgrade renamed or refused one)."""
    declared = KEEPS_STORAGE | FLOATS_KEEP_LAYOUT | RELAYOUT | set(CPU_ARGS) | MAYBE_VIEW
    return sorted(declared - set(ops))
