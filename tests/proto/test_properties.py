"""Property tests of ``proto`` (hypothesis): whatever bytes or objects arrive, decoding and
validation raise nothing but a 4xx ProtocolError, and every tensor round-trips bitwise. No server."""

from __future__ import annotations

import math

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remote_autograd.proto import ProtocolError, decode_body, decode_tensor
from remote_autograd.proto.messages import TensorData, validate_program
from remote_autograd.proto.codec import decode_tensor_data

from .tensor_samples import ALL_DTYPES, assert_bitwise_equal, json_round_trip, msgpack_round_trip, sample_tensor


# -- property tests -----------------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.binary(max_size=16),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12,
)
_dtype_names = st.one_of(st.sampled_from(ALL_DTYPES), st.text(max_size=10), _scalars)
# dims stay far enough from int64's edge that even a zero-element shape is allocatable;
# test_zero_element_shape_with_overflowing_dims_is_a_protocol_error covers the edge (xfail)
_dims = st.one_of(st.integers(min_value=-3, max_value=6), st.integers(min_value=-(2**12), max_value=2**12))
_non_ints = st.one_of(st.none(), st.booleans(), st.floats(), st.text(max_size=4), st.binary(max_size=4))
_shapes = st.one_of(
    st.lists(_dims, max_size=4),
    st.lists(st.one_of(_dims, _non_ints, st.lists(_dims, max_size=2)), max_size=3),
    _non_ints,
    st.dictionaries(st.text(max_size=4), _dims, max_size=2),
)
_data = st.one_of(
    st.binary(max_size=64),
    st.text(alphabet="ABCDEFGHIJKLMNOPabcdef0123456789+/=", max_size=40),
    st.lists(st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.booleans()), max_size=24),
    _values,
)
_tensor_objs = st.fixed_dictionaries(
    {},
    optional={"dtype": _dtype_names, "shape": _shapes, "data": _data, "extra": _values},
)
_tensor_ids = st.one_of(st.text(min_size=0, max_size=4), _scalars)
_step_fields = {
    "id": _tensor_ids, "value": st.one_of(_tensor_objs, _values), "grad": st.one_of(_tensor_objs, _values),
    "requires_grad": _values, "op": st.one_of(st.sampled_from(["add", "matmul", "nope"]), _scalars),
    "args": _values, "kwargs": _values, "out": st.one_of(st.lists(_tensor_ids, max_size=3), _values),
    "tensors": st.one_of(st.lists(_tensor_ids, max_size=3), _values), "inputs": _values, "outputs": _values,
    "grad_tensors": _values, "grad_outputs": _values, "retain_graph": _values, "create_graph": _values,
    "allow_unused": _values, "grad_enabled": _values, "ids": _values, "junk": _values,
}
_steps = st.fixed_dictionaries(
    {"kind": st.one_of(st.sampled_from(["put", "call", "backward", "grad", "set_grad", "set_requires_grad",
                                        "retain_grad", "free", "fetch"]), _scalars)},
    optional=_step_fields,
)
_programs = st.fixed_dictionaries(
    {},
    optional={"id": _tensor_ids, "steps": st.one_of(st.lists(_steps, max_size=4), _values), "extra": _values},
)

PROPERTY = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _only_protocol_errors(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except ProtocolError as exc:
        assert 400 <= exc.status < 500, exc
        assert exc.message
        return None


def _decode_everything(obj) -> None:
    """validate_program, then decode_tensor_data on every put's tensors (as the runner does), and
    decode_tensor on the object itself."""
    program = _only_protocol_errors(validate_program, obj)
    if program is not None:
        for step in program.steps:
            for name in ("value", "grad"):
                td = getattr(step, name, None)
                if isinstance(td, TensorData) and math.prod(td.shape) <= 1 << 20:  # the limit: checked before
                    _only_protocol_errors(decode_tensor_data, td, field=name)
    if isinstance(obj, dict):
        _only_protocol_errors(decode_tensor, obj, max_elements=1 << 20)
        _only_protocol_errors(decode_tensor, obj)


@PROPERTY
@given(st.binary(max_size=256))
def test_arbitrary_bytes_as_msgpack(body):
    obj = _only_protocol_errors(decode_body, body, "application/msgpack")
    _decode_everything(obj)


@PROPERTY
@given(st.binary(max_size=256))
def test_arbitrary_bytes_as_json(body):
    obj = _only_protocol_errors(decode_body, body, "application/json")
    _decode_everything(obj)


@pytest.mark.slow  # 200 examples
@PROPERTY
@given(_programs)
def test_wrong_programs_only_raise_protocol_errors(obj):
    _decode_everything(obj)
    # and the same through both codecs, as the server receives them
    try:
        packed = msgpack.packb(obj, use_bin_type=True)
    except (OverflowError, ValueError, TypeError):
        packed = None
    if packed is not None:
        _decode_everything(_only_protocol_errors(decode_body, packed, "application/msgpack"))


@PROPERTY
@given(_tensor_objs)
def test_wrong_tensor_objects_only_raise_protocol_errors(obj):
    _only_protocol_errors(decode_tensor, obj)
    _only_protocol_errors(decode_tensor, obj, max_elements=1 << 16)


@PROPERTY
@given(
    st.sampled_from(ALL_DTYPES),
    st.lists(st.integers(min_value=0, max_value=4), max_size=4),
    st.integers(min_value=0, max_value=2**31),
)
def test_round_trip_property(name, shape, seed):
    t = sample_tensor(name, tuple(shape), seed)
    assert_bitwise_equal(msgpack_round_trip(t), t)
    assert_bitwise_equal(json_round_trip(t), t)


_put_steps = st.fixed_dictionaries(
    {"kind": st.just("put"), "id": st.text(min_size=1, max_size=4),
     "value": st.fixed_dictionaries({"dtype": st.sampled_from(ALL_DTYPES), "shape": st.lists(_dims, max_size=3),
                                     "data": _data})},
    optional={"requires_grad": st.booleans(), "grad": _tensor_objs},
)


@pytest.mark.slow  # 200 examples
@PROPERTY
@given(st.lists(_put_steps, min_size=1, max_size=3))
def test_put_programs_with_wrong_tensors_only_raise_protocol_errors(steps):
    """Programs that validate, so that decode_tensor_data sees every value, as the runner would."""
    _decode_everything({"id": "p", "steps": steps})
