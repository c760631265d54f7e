#!/usr/bin/env python3
"""One TCP transfer for kernel_wg.sh, checked byte for byte by the caller.

  kwg_tcp.py serve PORT READY_FILE RESULT_FILE   accept one connection on [::]:PORT (IPv4 too),
                                                 read to its end, write "BYTES SHA256" to
                                                 RESULT_FILE; READY_FILE appears once listening
  kwg_tcp.py send HOST PORT FILE                 connect, send FILE, close

Every wait is bounded (socket timeouts); errors are one line on stderr and exit status 1.
Only the standard library: the guest runs the host's own python3.
"""

import hashlib
import socket
import sys

ACCEPT_TIMEOUT = 120.0
IO_TIMEOUT = 60.0
CHUNK = 65536


def serve(port: int, ready: str, result: str) -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("::", port))
        listener.listen(1)
        listener.settimeout(ACCEPT_TIMEOUT)
        with open(ready, "w", encoding="ascii"):
            pass
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(IO_TIMEOUT)
            digest = hashlib.sha256()
            count = 0
            while True:
                data = conn.recv(CHUNK)
                if not data:
                    break
                digest.update(data)
                count += len(data)
    with open(result, "w", encoding="ascii") as out:
        out.write(f"{count} {digest.hexdigest()}\n")


def send(host: str, port: int, path: str) -> None:
    with socket.create_connection((host, port), timeout=IO_TIMEOUT) as conn:
        with open(path, "rb") as source:
            while True:
                data = source.read(CHUNK)
                if not data:
                    break
                conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)
        # Wait for the server's close, so the whole file was read before we report success.
        while conn.recv(CHUNK):
            pass


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 5 and argv[1] == "serve":
            serve(int(argv[2]), argv[3], argv[4])
        elif len(argv) == 5 and argv[1] == "send":
            send(argv[2], int(argv[3]), argv[4])
        else:
            print(__doc__.strip(), file=sys.stderr)
            return 2
    except (OSError, ValueError) as e:
        print(f"kwg_tcp {argv[1]}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
