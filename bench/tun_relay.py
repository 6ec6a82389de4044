"""A delayed point-to-point link without ``sch_netem``: two TUN devices, and a thread that hands each
packet from one to the other after a fixed delay.

What the kernel sends out of either device (each one moved into a network namespace of its own)
the thread reads whole, as IP packets, and writes into the other device ``delay`` later, where the
kernel receives it as if it had come off a wire. Each direction is a FIFO with one constant delay,
so packets keep their order; what the link holds is capped like netem's queue (past the cap a
packet is dropped, as a full queue drops it, and TCP sends it again). There is no rate limit.

The thread runs in the process that made the devices, in no namespace of theirs: a TUN device's
file stays attached to it wherever the device moves.
"""

from __future__ import annotations

import collections
import fcntl
import os
import select
import struct
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
MAX_PACKET = 1 << 16
QUEUE_LIMIT = 10_000  # packets held per direction (netem's default limit is 1000 packets)


def open_tun(name: str) -> int:
    """A new TUN device ``name`` (IP packets, no extra header), non-blocking; gone when the file closes."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class TunRelay:
    """Devices ``names[0]`` and ``names[1]``, joined by a thread delaying each packet ``delay_s``."""

    def __init__(self, names: tuple[str, str], delay_s: float) -> None:
        self.delay_s = delay_s
        self.dropped = 0
        self._fds: list[int] = []
        try:
            for name in names:
                self._fds.append(open_tun(name))
        except OSError:
            self.close()
            raise
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._relay, name="tun-relay", daemon=True)
        self._thread.start()

    def _relay(self) -> None:
        a, b = self._fds
        queues = {a: collections.deque(), b: collections.deque()}  # fd written to -> (due, packet)
        while not self._stop.is_set():
            now = time.monotonic()
            for dst, queue in queues.items():
                while queue and queue[0][0] <= now:
                    self._write(dst, queue.popleft()[1])
            heads = [q[0][0] for q in queues.values() if q]
            wait = min(0.05, max(0.0, min(heads) - now)) if heads else 0.05  # 50 ms: how soon close() is seen
            readable, _, _ = select.select(self._fds, [], [], wait)
            due = time.monotonic() + self.delay_s
            for src in readable:
                queue = queues[b if src == a else a]
                for packet in self._read_all(src):
                    if len(queue) < QUEUE_LIMIT:
                        queue.append((due, packet))
                    else:
                        self.dropped += 1

    @staticmethod
    def _read_all(fd: int) -> list[bytes]:
        packets = []
        while len(packets) < 256:  # then the queues get their turn
            try:
                packets.append(os.read(fd, MAX_PACKET))
            except BlockingIOError:
                break
        return packets

    def _write(self, fd: int, packet: bytes) -> None:
        try:
            os.write(fd, packet)
        except OSError:  # the device is down or going: the packet is lost, as on a wire
            self.dropped += 1

    def close(self) -> None:
        if getattr(self, "_thread", None) is not None:
            self._stop.set()
            self._thread.join(timeout=5)
        for fd in self._fds:
            os.close(fd)
        self._fds = []
