"""Reading an answer's whole body, the one place every response's bytes come through."""

from __future__ import annotations

import httpx

from remote_autograd._fill_buffer import FillBuffer

from . import _progress


def read_body(response: httpx.Response) -> memoryview | bytes:
    """The whole answer body: into one preallocated buffer when its length is known (no joining
    copy, and framed tensors can view it), with a progress bar when it is big and someone watches."""
    if response.is_stream_consumed:  # a transport that read it already (httpx.MockTransport's answers)
        return response.content
    size = response.headers.get("content-length", "")
    total = int(size) if size.isdigit() else 0
    show = _progress.shows_bar(total)
    if total < _progress.CHUNK and not show:  # the raw bytes: our server never encodes an answer (gzip...)
        return b"".join(response.iter_raw())
    buf = FillBuffer(total)  # every byte is overwritten, or the answer refused below
    bar = _progress.bar(total, "download") if show else None
    try:
        for piece in response.iter_raw():
            if buf.filled + len(piece) > total:
                raise httpx.RemoteProtocolError(f"answer longer than its Content-Length {total}")
            buf.append(piece)
            if bar is not None:
                bar.update(len(piece))
    finally:
        if bar is not None:
            bar.close()
    if buf.filled != total:
        raise httpx.RemoteProtocolError(f"answer of {buf.filled} bytes, but Content-Length said {total}")
    return buf.view
