"""The wire format shared by ``client`` and ``service``: tensors, messages, errors, version.

Its modules (ARCHITECTURE.md maps the packages; what each module holds is told here):

- ``messages.py``: the pydantic models of every message (``Program``, the fifteen steps, answers) and
  ``validate_program``
- ``codec.py``: the wire's encodings: bodies as msgpack, JSON or framed (``decode_body``, ``encode_body``);
  ``wants_msgpack``, ``accepts_frames``: an answer's encoding from ``Accept`` and ``Content-Type`` (routes and
  backends decide it alike); framed bodies for big tensors (``pack_frames``, ``unpack_frames``);
  ``encode_tensor`` / ``decode_tensor``: a tensor as ``{dtype, shape, data}`` in each form, ``decode_tensor_data``
  for a validated put
- ``dtypes.py``: the dtype names of the wire
- ``errors.py``: ``ErrorCode``, its HTTP statuses, ``ProtocolError``
- ``schema.py``: writes ``proto/schema.json`` from ``messages.py``
- ``op_contract.py``: the op contract: factories, the in-place rule, shape-changing in-place ops, shape rule
  names, autocast's rule for in-place ops
- ``torch_globals.py``: the process-global torch settings that change an op's result (the default dtype,
  deterministic algorithms, the float32 matmul precision, cuDNN's flags): read and set as torch's own calls
  do, and as a program carries them (``Program.torch_globals``)

The op contract (``proto/op_contract.py``) is what the SDK and the server agree on about ops by their names
and kinds, written once and imported by both: the factories (``FACTORIES``: the server registers exactly
these, the SDK's device kernels and ``sess.zeros`` call them), the in-place spelling rule
(``is_inplace_name``), the in-place ops that change their target's shape (``SHAPE_INPLACE``), the names of the
shape rules, and that autocast leaves in-place ops alone (``autocast_applies``). What only the server can know
per op (its torch names, differentiability, ``shape_rule``) it serves in ``GET /v1/ops``, which the SDK reads
once per server (``client/session/_routes.py``). ``tests/client/test_op_contract.py`` checks that both sides
read the same declarations.
"""

from .codec import JSON, MSGPACK, decode_body, decode_tensor, encode_body, encode_tensor, is_msgpack
from .dtypes import DTYPE_NAMES, DTYPES, ITEMSIZES, dtype_from_name, dtype_name
from .errors import ErrorCode, ProtocolError
from .messages import PROTOCOL_HEADER, PROTOCOL_VERSION

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
