"""What of torch's error text reaches a client (``service/engine/error_text.py``): no address, no C++ backtrace.

torch's message is the answer to a refused call, but a pointer it prints (``0x7f3a5c000b20``) tells a
client where the server's heap lies. Every failed step's message passes ``scrubbed`` in the runner's
error conversion (``runner._as_protocol_error``); short hex (a flag, a code) stays.
"""

from __future__ import annotations

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.service.engine.error_text import scrubbed
from remote_autograd.service.engine.runner import _as_protocol_error


def test_addresses_and_a_backtrace_are_dropped_and_the_rest_kept():
    text = ("storage at 0x7f3a5c000b20 of size 4 (flags 0x10)\nException raised from check at Storage.cpp:1 "
            "(most recent call first):\nframe #0: c10::Error::Error + 0x96 (0x7f3a5c001234 in libc10.so)")
    assert scrubbed(text) == "storage at 0x<address> of size 4 (flags 0x10)"
    assert scrubbed("index 5 is out of bounds for dimension 0 with size 4") == \
        "index 5 is out of bounds for dimension 0 with size 4"


def test_every_failed_steps_message_is_scrubbed():
    err = _as_protocol_error(RuntimeError("got 0x55d2c0ffee00 where 0x55d2c0ffee08 was due"), 3, "op")
    assert err.message == "got 0x<address> where 0x<address> was due" and (err.step, err.op) == (3, "op")
    refused = _as_protocol_error(ProtocolError(ErrorCode.OP_ERROR, "meta said 0xdeadbeefcafe"), 0, "op")
    assert refused.message == "meta said 0x<address>" and refused.status == 422
    odd = _as_protocol_error(KeyError("0x00007ffe12345678"), 1, "op")  # a bug of ours: its text too
    assert "0x00007ffe" not in odd.message
