"""Bulk transfer: upload and download of 256 MiB float32, beside a raw loopback socket copy."""

from __future__ import annotations

import socket
import threading
import time

import torch

from remote_autograd import client

from ._util import SERVER_PIDS, peak_rss_bytes, rss_bytes

SIZE = 256 << 20


def _raw_socket_mb_s(nbytes: int) -> float:
    """One stream over loopback TCP: the ceiling for a single connection on this machine."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    payload = memoryview(bytearray(nbytes))

    def sink() -> None:
        conn, _ = server.accept()
        buf = bytearray(1 << 20)
        left = nbytes
        while left:
            left -= conn.recv_into(buf)
        conn.sendall(b"k")
        conn.close()

    thread = threading.Thread(target=sink)
    thread.start()
    with socket.create_connection(("127.0.0.1", port)) as c:
        t0 = time.perf_counter()
        c.sendall(payload)
        c.recv(1)
        elapsed = time.perf_counter() - t0
    thread.join()
    server.close()
    return nbytes / elapsed / 1e6


def run(url: str, repeat: int = 5) -> None:
    print(f"\n[bulk] {SIZE >> 20} MiB float32, {repeat} runs each way (one connection, loopback)")
    t = torch.randn(SIZE // 4)
    raw = [_raw_socket_mb_s(SIZE) for _ in range(3)]
    print(f"  {'raw loopback socket copy':<48} median {sorted(raw)[1]:9.0f} MB/s")
    client_before = peak_rss_bytes()
    server_pid = SERVER_PIDS.get(url)
    with client.connect(url) as sess:
        sess.tensor(0.0).item()  # the server has loaded everything it needs: its baseline
        server_before = rss_bytes(server_pid) if server_pid else 0
        ups, downs = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            x = sess.tensor(t)
            sess.sync()
            ups.append(SIZE / (time.perf_counter() - t0) / 1e6)
            t0 = time.perf_counter()
            back = x.cpu()
            downs.append(SIZE / (time.perf_counter() - t0) / 1e6)
            assert back.shape == t.shape
            del x, back
            sess.sync()  # free it now: each run starts from the same server memory
        for label, figures in (("upload (sess.tensor + sync)", ups), ("download (x.cpu())", downs)):
            ordered = sorted(figures)
            print(f"  {label:<48} median {ordered[len(ordered) // 2]:9.0f} MB/s   worst {ordered[0]:7.0f} MB/s"
                  f"   (target >= 1300)")
    client_peak = peak_rss_bytes()
    print(f"  {'client peak RSS growth / payload':<48} {(client_peak - client_before) / SIZE:9.2f}x")
    if server_pid:
        grown = peak_rss_bytes(server_pid) - server_before
        print(f"  {'server peak RSS growth / payload':<48} {grown / SIZE:9.2f}x   (target <= 2.2x; over a baseline "
              f"of {server_before / 2**20:.0f} MiB, the server's own torch)")
