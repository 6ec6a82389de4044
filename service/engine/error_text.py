"""What of an exception's text reaches a client: torch's words, never the server's memory.

torch's own messages are the answer to a refused call (correct like torch), but a few carry what is
the server's alone: a pointer printed in hex (a storage's, a function's: ``0x7f3a5c000b20``), and,
with ``TORCH_SHOW_CPP_STACKTRACES=1``, a C++ backtrace (addresses and library paths). ``scrubbed``
keeps the message and drops those; the runner passes every failed step's message through it. (A
value read past a tensor never reaches a message: the value checks keep kernels within their
arguments, ``service/ops/value_checks.py``.)
"""

from __future__ import annotations

import re

_ADDRESS = re.compile(r"0x[0-9a-fA-F]{8,}")  # shorter hex (a flag, a dtype's code) is no address
_BACKTRACE = "\nException raised from "  # c10::Error's what() when torch shows C++ stack traces


def scrubbed(message: str) -> str:
    """``message`` without addresses (each becomes ``0x<address>``) and without a C++ backtrace."""
    return _ADDRESS.sub("0x<address>", message.split(_BACKTRACE, 1)[0])
