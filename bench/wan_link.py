"""A link with real delay for the ``wan`` section, made of network namespaces of our own.

``delayed_link(ms)`` makes one and removes everything it made on the way out (also on an error
or Ctrl-C). Two ways, only loopback-range addresses, only in namespaces made here:

- netem: one fresh namespace, its ``lo`` up with ``tc qdisc ... netem delay`` on it; the server
  and the client both run inside it on 127.0.0.1. Every packet waits ``ms``, so a round trip
  waits twice that.
- a TUN relay (``bench.tun_relay``), where the kernel has no ``sch_netem``: two namespaces, the
  server's and the client's, each with one TUN device (127.77.0.1 and 127.77.0.2, loopback-range
  addresses routed off ``lo``, which holds 127.0.0.1 alone there), joined by a thread that delays
  each packet ``ms``.

Where neither can be made (not root, no ``ip``, no namespaces, no netem and no TUN), it raises
``LinkUnavailable`` saying why.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator

from .tun_relay import TunRelay

PREFIX = "ra-wan-"
TUN_ADDRESSES = ("127.77.0.1", "127.77.0.2")  # the server's, the client's


class LinkUnavailable(RuntimeError):
    """No delayed link can be made here; the message says why."""


@dataclass
class Link:
    kind: str  # "netem", "TUN relay" or "loopback" (no link: ``loopback``)
    delay_ms: float
    server_ns: str
    client_ns: str
    server_host: str
    server_ifname: str
    client_ifname: str
    note: str = ""  # why this kind and not netem

    def inside(self, side: str, argv: list[str]) -> list[str]:
        """``argv`` run in the namespace of ``side`` ("server" or "client")."""
        if self.kind == "loopback":
            return argv
        return ["ip", "netns", "exec", self.server_ns if side == "server" else self.client_ns, *argv]

    def describe(self) -> str:
        if self.kind == "loopback":
            return "no link: both sides on this machine's 127.0.0.1, without delay"
        if self.kind == "netem":
            return (f"netem delay {self.delay_ms:g} ms on lo of namespace {self.server_ns} "
                    f"(server and client inside it, {self.server_host})")
        return (f"a TUN relay delaying each packet {self.delay_ms:g} ms, namespace {self.server_ns} "
                f"(server, {self.server_host}) to {self.client_ns} (client, {TUN_ADDRESSES[1]}); {self.note}")


def loopback() -> Link:
    """Both sides on this machine, as the issue's "on the same machine" asks: no namespace, no delay."""
    return Link("loopback", 0.0, "", "", "127.0.0.1", "lo", "lo")


def missing_prerequisite() -> str | None:
    """Why no link can be made at all here, or None."""
    if os.geteuid() != 0:
        return "not root (network namespaces and qdiscs need CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "no `ip` command (apt-get install -y iproute2)"
    return None


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


def _checked(result: subprocess.CompletedProcess, what: str) -> None:
    if result.returncode != 0:
        first = (result.stderr or result.stdout).strip().splitlines()[:1]
        raise LinkUnavailable(f"{what} failed: {first[0] if first else f'exit status {result.returncode}'}")


def _in_ns(ns: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=20)


def _new_namespace(name: str, made: list[str]) -> None:
    _checked(_ip("netns", "add", name), f"ip netns add {name}")
    made.append(name)


def remove_stale() -> None:
    """Remove namespaces a killed earlier run left (named with a process id no longer alive)."""
    listed = _ip("netns", "list").stdout
    for name in re.findall(rf"^({PREFIX}(\d+)(?:-[sc])?)\b", listed, flags=re.M):
        if not os.path.exists(f"/proc/{name[1]}"):
            _ip("netns", "del", name[0])


def _netem(delay_ms: float, made: list[str]) -> Link:
    if shutil.which("tc") is None:
        raise LinkUnavailable("no `tc` command (apt-get install -y iproute2)")
    ns = f"{PREFIX}{os.getpid()}"
    _new_namespace(ns, made)
    _checked(_ip("-n", ns, "link", "set", "lo", "up"), "bringing lo up")
    added = _in_ns(ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", f"{delay_ms}ms")
    if "qdisc kind is unknown" in added.stderr:
        raise LinkUnavailable("the kernel has no sch_netem (tc: Specified qdisc kind is unknown)")
    _checked(added, "tc qdisc add ... netem")
    return Link("netem", delay_ms, ns, ns, "127.0.0.1", "lo", "lo")


def _tun(delay_ms: float, made: list[str]) -> tuple[Link, TunRelay]:
    if not os.path.exists("/dev/net/tun"):
        raise LinkUnavailable("no /dev/net/tun")
    pid = os.getpid()
    sides = [(f"{PREFIX}{pid}-s", f"ra{pid}s"), (f"{PREFIX}{pid}-c", f"ra{pid}c")]
    for ns, _ in sides:
        _new_namespace(ns, made)
    try:
        relay = TunRelay((sides[0][1], sides[1][1]), delay_ms / 1e3)
    except OSError as exc:
        raise LinkUnavailable(f"making a TUN device failed: {exc}") from None
    try:
        for (ns, dev), here, there in zip(sides, TUN_ADDRESSES, reversed(TUN_ADDRESSES)):
            _checked(_ip("link", "set", dev, "netns", ns), f"moving {dev} into {ns}")
            # 127/8 off lo: allowed by route_localnet; no IPv6 (its link-local chatter would cross the relay)
            _checked(_in_ns(ns, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet && "
                            "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"), f"settings in {ns}")
            # lo up (a packet to one's own address goes through it) but holding 127.0.0.1 alone, not 127/8,
            # so that the peer's 127.77 address is routed out of the TUN device instead of delivered here
            _checked(_ip("-n", ns, "link", "set", "lo", "up"), f"bringing lo up in {ns}")
            _checked(_ip("-n", ns, "addr", "del", "127.0.0.1/8", "dev", "lo"), f"narrowing lo in {ns}")
            _checked(_ip("-n", ns, "addr", "add", "127.0.0.1/32", "dev", "lo"), f"narrowing lo in {ns}")
            _checked(_ip("-n", ns, "link", "set", dev, "mtu", "65000", "up"), f"bringing {dev} up")
            _checked(_ip("-n", ns, "addr", "add", here, "peer", there, "dev", dev), f"addressing {dev}")
    except BaseException:
        relay.close()
        raise
    link = Link("TUN relay", delay_ms, sides[0][0], sides[1][0], TUN_ADDRESSES[0], sides[0][1], sides[1][1])
    return link, relay


@contextlib.contextmanager
def delayed_link(delay_ms: float = 10) -> Iterator[Link]:
    """A link whose packets wait ``delay_ms`` each way: netem, else a TUN relay (the link's ``kind``)."""
    reason = missing_prerequisite()
    if reason:
        raise LinkUnavailable(reason)
    remove_stale()
    made: list[str] = []
    relay = None
    try:
        try:
            link = _netem(delay_ms, made)
        except LinkUnavailable as netem_failed:
            try:
                link, relay = _tun(delay_ms, made)
            except LinkUnavailable as tun_failed:
                raise LinkUnavailable(f"{netem_failed}; and {tun_failed}") from None
            link.note = f"no netem here: {netem_failed}"
        yield link
    finally:
        if relay is not None:
            relay.close()
        for ns in made:
            _ip("netns", "del", ns)
