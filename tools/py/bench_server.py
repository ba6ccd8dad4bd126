"""A server a bench starts, waits for and stops: `shoal serve` or llama-server alike."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request

# Every server started, so that a bench failing part-way can stop them all.
RUNNING: list["Server"] = []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, cmd: list[str], port: int, wait_s: float = 600):
        RUNNING.append(self)
        self.url = f"http://127.0.0.1:{port}"
        # Warnings go to SHOAL_BENCH_LOG when set (a file), else nowhere.
        log = open(os.environ["SHOAL_BENCH_LOG"], "ab") if os.environ.get("SHOAL_BENCH_LOG") else subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log,
                                     env={**os.environ, "SHOAL_LOG": os.environ.get("SHOAL_LOG", "warn")})
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited")
            time.sleep(0.5)
        raise RuntimeError(f"{cmd[0]} did not start")

    def model(self) -> str:
        """The id the server lists first (llama-server answers whatever is asked)."""
        with urllib.request.urlopen(f"{self.url}/v1/models", timeout=10) as r:
            return json.load(r)["data"][0]["id"]

    def stop(self) -> None:
        """Gracefully (SIGTERM), so a Shoal server's last cache writes land."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stop_all() -> None:
    for s in RUNNING:
        s.stop()
