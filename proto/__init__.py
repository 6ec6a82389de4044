"""The wire format shared by ``client`` and ``service``: tensors, messages, errors, version."""

from .codec import JSON, MSGPACK, decode_body, encode_body, is_msgpack
from .dtypes import DTYPE_NAMES, DTYPES, ITEMSIZES, dtype_from_name, dtype_name
from .errors import ErrorCode, ProtocolError
from .messages import PROTOCOL_HEADER, PROTOCOL_VERSION
from .tensors import decode_tensor, encode_tensor

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "ITEMSIZES",
    "JSON",
    "MSGPACK",
    "PROTOCOL_HEADER",
    "PROTOCOL_VERSION",
    "ErrorCode",
    "ProtocolError",
    "decode_body",
    "decode_tensor",
    "dtype_from_name",
    "dtype_name",
    "encode_body",
    "encode_tensor",
    "is_msgpack",
]
