#!/usr/bin/env python3
"""Opens N connections to a server at the same instant (a thread barrier), sends GET /health on each
and prints the latency distribution; a dropped SYN (listen-queue overflow) shows as a ~1 s outlier.

  python3 bench/connect_burst.py --port 8000 --n 128 --reps 3
"""
import argparse
import socket
import threading
import time


def burst(host, port, n):
    barrier = threading.Barrier(n)
    lat = [0.0] * n

    def one(i):
        barrier.wait()
        t = time.time()
        s = socket.create_connection((host, port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        s.recv(1000)
        lat[i] = time.time() - t
        s.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(lat)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    for _ in range(a.reps):
        lat = burst(a.host, a.port, a.n)
        print("p50 %.4f s  p90 %.4f s  max %.4f s  over 0.5 s: %d of %d" %
              (lat[a.n // 2], lat[int(a.n * 0.9)], lat[-1], sum(x > 0.5 for x in lat), a.n))


if __name__ == "__main__":
    main()
