"""A server a bench starts, waits for and stops: `shoal serve` or llama-server alike."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator

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


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[str]:
    """A bench's own data directory; on the way out, however the bench ends,
    every server it started is stopped and the directory removed."""
    data = tempfile.mkdtemp(prefix=prefix)
    try:
        yield data
    finally:
        stop_all()
        shutil.rmtree(data, ignore_errors=True)


def shoal_cmd(shoal: str, model: str, port: int, db: str, threads: int, *extra: str) -> list[str]:
    """`shoal serve` as the benches run it: the llama backend on one GGUF,
    a store of its own, never unloading while idle."""
    cmd = [shoal, "serve", "--backend", "llama", "--model", model, "--port", str(port),
           "--db", db, "--idle-unload-secs", "0"]
    if threads:
        cmd += ["--threads", str(threads)]
    return [*cmd, *extra]
