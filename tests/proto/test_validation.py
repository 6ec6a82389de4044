"""Unit tests of ``proto``'s validation: tensor objects refused with the field that is wrong, a
validated TensorData, the body codec, and validate_program. No server."""

from __future__ import annotations

import base64

import msgpack
import pytest

from remote_autograd.proto import ErrorCode, ProtocolError, decode_body, decode_tensor
from remote_autograd.proto.messages import Program, TensorData, validate_program
from remote_autograd.proto.codec import decode_tensor_data

from .tensor_samples import assert_bitwise_equal


def _raises(obj, *, status: int = 400, names: str | None = None, **kw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_tensor(obj, **kw)
    err = info.value
    assert err.status == status, err
    if names is not None:
        assert names in err.message, err.message
    return err


# -- validation errors --------------------------------------------------------------------

GOOD = {"dtype": "float32", "shape": [2], "data": b"\0" * 8}


def test_data_wrong_type():
    for data in (5, 1.5, None, {"x": 1}, True):
        _raises({**GOOD, "data": data}, names="value.data")
    _raises({k: v for k, v in GOOD.items() if k != "data"}, names="value.data")


def test_unknown_dtype():
    for dt in ("float8", "Float32", "", None, 5, ["float32"], "torch.float32"):
        err = _raises({**GOOD, "dtype": dt}, names="value.dtype")
        assert "unknown dtype" in err.message
    _raises({k: v for k, v in GOOD.items() if k != "dtype"}, names="value.dtype")


def test_negative_dim():
    err = _raises({**GOOD, "shape": [2, -1]}, names="value.shape.1")
    assert "negative" in err.message


def test_non_int_dim():
    for dim in (2.0, "2", None, True, [2]):
        _raises({**GOOD, "shape": [dim]}, names="value.shape.0")
    for shape in ("2", 2, None, {"a": 1}):
        _raises({**GOOD, "shape": shape}, names="value.shape")


def test_field_name_is_the_callers():
    _raises({**GOOD, "dtype": "nope"}, names="steps.3.grad.dtype", field="steps.3.grad")


def test_bytes_length_mismatch():
    for n in (0, 7, 9, 16):
        err = _raises({**GOOD, "data": b"\0" * n}, names="value.data")
        assert str(n) in err.message and "8" in err.message
    _raises({"dtype": "float32", "shape": [], "data": b""}, names="value.data")  # 0-d needs one element
    _raises({"dtype": "float32", "shape": [0], "data": b"\0" * 4}, names="value.data")


def test_base64_length_mismatch():
    _raises({**GOOD, "data": base64.b64encode(b"\0" * 12).decode()}, names="value.data")


def test_list_length_mismatch():
    for data in ([], [1.0], [1.0, 2.0, 3.0]):
        err = _raises({**GOOD, "data": data}, names="value.data")
        assert "values" in err.message
    _raises({"dtype": "float32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}, names="value.data")  # not flat


def test_invalid_base64():
    for s in ("!!!!", "AAA", "AA AA", "AAAA\n", "é"):
        err = _raises({**GOOD, "data": s}, names="value.data")
        assert "base64" in err.message


def test_list_with_a_string_inside():
    err = _raises({**GOOD, "data": [1.0, "2"]}, names="value.data.1")
    assert "str" in err.message
    _raises({**GOOD, "data": [None, 1.0]}, names="value.data.0")
    _raises({**GOOD, "data": [{"a": 1}, 1.0]}, names="value.data.0")


def test_list_value_out_of_range():
    _raises({"dtype": "int8", "shape": [1], "data": [1000]}, names="value.data")
    _raises({"dtype": "int64", "shape": [1], "data": [2**64]}, names="value.data")
    _raises({"dtype": "float32", "shape": [1], "data": [10**400]}, names="value.data")


def test_list_values_that_do_not_fit_the_dtype_are_refused():
    for obj in ({"dtype": "int32", "shape": [1], "data": [1.5]},
                {"dtype": "uint8", "shape": [1], "data": [-1]},
                {"dtype": "float16", "shape": [1], "data": [1e300]}):
        _raises(obj, names="value.data")


def test_unknown_keys():
    err = _raises({**GOOD, "strides": [1]}, names="value")
    assert "strides" in err.message and "unknown keys" in err.message
    _raises({**GOOD, "requires_grad": True}, names="requires_grad")


def test_not_an_object():
    for obj in (None, [], "x", b"\0", 5):
        _raises(obj, names="value")


def test_claimed_shape_over_limit_is_413_before_any_data_check():
    err = _raises({"dtype": "float32", "shape": [10**12], "data": b"\0" * 16}, status=413, max_elements=1 << 28)
    assert err.code == ErrorCode.TOO_LARGE
    assert "max_tensor_elements" in err.message and str(10**12) in err.message
    # whatever is wrong with the data, the limit answers first
    for data in (5, "!!!", [1, "x"], b"", None):
        err = _raises({"dtype": "float32", "shape": [10**12], "data": data}, status=413, max_elements=1000)
        assert err.code == ErrorCode.TOO_LARGE
    # at the limit is fine, one over is not
    assert decode_tensor({"dtype": "uint8", "shape": [10], "data": b"\0" * 10}, max_elements=10).shape == (10,)
    _raises({"dtype": "uint8", "shape": [11], "data": b"\0" * 11}, status=413, max_elements=10)
    # the product counts, not each dim
    _raises({"dtype": "uint8", "shape": [2**20, 2**20], "data": b""}, status=413, max_elements=2**30)


def test_huge_shape_without_limit_is_a_400():
    _raises({"dtype": "float32", "shape": [10**12], "data": b"\0" * 16}, names="value.data")
    _raises({"dtype": "float32", "shape": [2**40, 2**40], "data": [1.0]}, names="value.shape")


def test_zero_element_shape_with_overflowing_dims_is_a_protocol_error():
    for shape in ([0, 10**20], [2**62, 2**62, 0]):
        err = _raises({"dtype": "float32", "shape": shape, "data": b""}, names="shape")
        assert err.status == 400


# -- a validated TensorData (a put step's value or grad) -------------------------------------

# What validation lets through and only decoding can refuse: the data against the shape and dtype.
VALIDATED = {
    "bytes": {"dtype": "float32", "shape": [2], "data": b"\0\0\x80\x3f\0\0\0\xc0"},
    "base64": {"dtype": "bfloat16", "shape": [2], "data": "gD8AwA=="},
    "list": {"dtype": "int16", "shape": [2, 2], "data": [1, 2, 3, 256]},
    "bool-list": {"dtype": "bool", "shape": [2], "data": [True, False]},
    "0-d": {"dtype": "float64", "shape": [], "data": [3.5]},
    "empty": {"dtype": "float32", "shape": [0, 3], "data": []},
    "bytes-short": {"dtype": "float32", "shape": [2], "data": b"\0" * 7},
    "base64-short": {"dtype": "float32", "shape": [2], "data": base64.b64encode(b"\0" * 4).decode()},
    "base64-invalid": {"dtype": "float32", "shape": [2], "data": "!!!!"},
    "list-short": {"dtype": "float32", "shape": [2], "data": [1.0]},
    "list-string": {"dtype": "float32", "shape": [2], "data": [1.0, "2"]},
    "list-out-of-range": {"dtype": "int8", "shape": [1], "data": [1000]},
    "list-bfloat16": {"dtype": "bfloat16", "shape": [1], "data": [1.0]},
    "data-wrong-type": {"dtype": "float32", "shape": [2], "data": 5},
    "shape-too-large": {"dtype": "float32", "shape": [2**40, 2**40], "data": [1.0]},
    "zero-elements-overflowing": {"dtype": "float32", "shape": [0, 10**20], "data": b""},
}


@pytest.mark.parametrize("field", ["value", "grad"])
@pytest.mark.parametrize("case", list(VALIDATED))
def test_a_validated_tensor_decodes_as_its_wire_object(case: str, field: str):
    """``decode_tensor_data`` skips what validation checked, and nothing else: the same tensor, or
    the same 400 with the same field path, as ``decode_tensor`` of the object."""
    obj = VALIDATED[case]
    typed = TensorData.model_validate(obj)
    try:
        want = decode_tensor(obj, field=field)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as info:
            decode_tensor_data(typed, field=field)
        assert (info.value.status, info.value.message) == (exc.status, exc.message)
        assert info.value.message.startswith(f"{field}.")
        return
    assert_bitwise_equal(decode_tensor_data(typed, field=field), want)


def test_a_validated_tensor_from_a_writable_buffer_is_a_view_of_it_unless_copied():
    buf = bytearray(b"\0\0\x80\x3f" * 2)
    typed = TensorData.model_validate({"dtype": "float32", "shape": [2], "data": memoryview(buf)})
    view, copied = decode_tensor_data(typed, copy=False), decode_tensor_data(typed)
    buf[:4] = b"\0\0\0\x40"
    assert view.tolist() == [2.0, 1.0] and copied.tolist() == [1.0, 1.0]


# -- codec --------------------------------------------------------------------------------


def test_decode_body_malformed():
    for body, ct, word in [
        (b"\xc1", "application/msgpack", "msgpack"),
        (b"\x92\x01", "application/msgpack", "msgpack"),      # truncated array
        (b"\x01\x02", "application/msgpack", "msgpack"),      # extra data
        (b"{", "application/json", "JSON"),
        (b"\xff\xfe\x00", "application/json", "JSON"),
        (b"[" * 100_000, "application/json", "JSON"),          # nesting past the recursion limit
        (b"{}", "text/plain", "Content-Type"),
    ]:
        with pytest.raises(ProtocolError) as info:
            decode_body(body, ct)
        assert info.value.status == 400 and word in info.value.message, (body[:10], info.value.message)


def test_decode_body_msgpack_refuses_non_string_keys():
    with pytest.raises(ProtocolError) as info:
        decode_body(msgpack.packb({1: 2}), "application/msgpack")
    assert info.value.status == 400


def test_decode_body_defaults_to_json():
    assert decode_body(b'{"a": 1}', None) == {"a": 1}
    assert decode_body(b"", "application/json") is None
    assert decode_body(b'{"a": 1}', "application/json; charset=utf-8") == {"a": 1}


# -- validate_program ---------------------------------------------------------------------


def _program_error(obj) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        validate_program(obj)
    assert info.value.status == 400 and info.value.code == ErrorCode.BAD_REQUEST
    return info.value


PUT = {"kind": "put", "id": "a", "value": {"dtype": "float32", "shape": [1], "data": [1.0]}}


@pytest.mark.parametrize(
    "obj, where",
    [
        (None, "body"),
        ([], "body"),
        ({"steps": []}, "id"),
        ({"id": "p"}, "steps"),
        ({"id": 5, "steps": []}, "id"),
        ({"id": "", "steps": []}, "id"),
        ({"id": "p", "steps": [], "extra": 1}, "extra"),
        ({"id": "p", "steps": {}}, "steps"),
        ({"id": "p", "steps": [{"kind": "nope"}]}, "steps.0"),
        ({"id": "p", "steps": [{}]}, "steps.0"),
        ({"id": "p", "steps": [{"kind": 5}]}, "steps.0"),
        ({"id": "p", "steps": [PUT, {"kind": "put", "id": "b"}]}, "steps.1.put.value"),
        ({"id": "p", "steps": [{**PUT, "value": {"dtype": "f", "shape": [1], "data": []}}]}, "steps.0.put.value.dtype"),
        ({"id": "p", "steps": [{**PUT, "value": {"dtype": "float32", "shape": [-1], "data": []}}]},
         "steps.0.put.value.shape.0"),
        ({"id": "p", "steps": [{**PUT, "requires_grad": "maybe"}]}, "steps.0.put.requires_grad"),
        ({"id": "p", "steps": [{**PUT, "id": ""}]}, "steps.0.put.id"),
        ({"id": "p", "steps": [{**PUT, "id": "x" * 129}]}, "steps.0.put.id"),
        ({"id": "p", "steps": [{"kind": "call", "op": "add", "args": "x"}]}, "steps.0.call.args"),
        ({"id": "p", "steps": [{"kind": "call", "args": []}]}, "steps.0.call.op"),
        ({"id": "p", "steps": [{"kind": "call", "op": "add", "kwargs": []}]}, "steps.0.call.kwargs"),
        ({"id": "p", "steps": [{"kind": "call", "op": "add", "out": "c"}]}, "steps.0.call.out"),
        ({"id": "p", "steps": [{"kind": "backward", "tensors": []}]}, "steps.0.backward.tensors"),
        ({"id": "p", "steps": [{"kind": "backward"}]}, "steps.0.backward.tensors"),
        ({"id": "p", "steps": [{"kind": "grad", "outputs": ["y"], "inputs": ["x"]}]}, "steps.0.grad.out"),
        ({"id": "p", "steps": [{"kind": "set_requires_grad", "id": "a"}]}, "steps.0.set_requires_grad.requires_grad"),
        ({"id": "p", "steps": [{"kind": "retain_grad"}]}, "steps.0.retain_grad.id"),
        ({"id": "p", "steps": [{"kind": "free", "ids": "a"}]}, "steps.0.free.ids"),
        ({"id": "p", "steps": [{"kind": "fetch", "id": "a", "value": "zz"}]}, "steps.0.fetch.value"),
        ({"id": "p", "steps": [{"kind": "fetch", "id": "a", "extra": 1}]}, "steps.0.fetch.extra"),
    ],
)
def test_validate_program_errors_name_the_field(obj, where):
    err = _program_error(obj)
    assert err.message.startswith(where + ":"), err.message


def test_validate_program_defaults():
    p = validate_program({"id": "p", "steps": [
        PUT,
        {"kind": "call", "op": "add"},
        {"kind": "backward", "tensors": ["a"]},
        {"kind": "grad", "outputs": ["y"], "inputs": ["x"], "out": ["gx"]},
        {"kind": "set_grad", "id": "a"},
        {"kind": "fetch", "id": "a"},
        {"kind": "free", "ids": []},
    ]})
    put, call, bwd, grad, set_grad, fetch, free = p.steps
    assert put.requires_grad is False and put.grad is None
    assert call.args == [] and call.kwargs == {} and call.out == [] and call.grad_enabled is True
    assert bwd.grad_tensors is None and bwd.retain_graph is None and bwd.create_graph is False and bwd.inputs is None
    assert grad.grad_outputs is None and grad.retain_graph is None and not grad.create_graph and not grad.allow_unused
    assert set_grad.grad is None
    assert fetch.value is True and fetch.grad is True
    assert isinstance(p, Program)


def test_a_call_step_left_without_args_kwargs_or_out_gets_empty_ones_of_its_own():
    """The defaults come from factories (validating copied them per step): each step still gets its own."""
    from remote_autograd.proto.messages import CallStep

    a, b = (CallStep.model_validate({"kind": "call", "op": "zeros_like"}) for _ in range(2))
    assert (a.args, a.kwargs, a.out) == ([], {}, [])
    a.kwargs["x"] = 1
    a.args.append(1)
    assert (b.args, b.kwargs) == ([], {})
    assert CallStep.model_json_schema()["properties"]["kwargs"]["default"] == {}
