"""A checkpoint volume with real-size timing: hack/slowfs (a FUSE loopback over a real directory)
whose writes and reads take as long as a chosen throughput would.

It is a SIMULATION of a slow shared file system, Amazon FSx for Lustre (about 300 MB/s for a 1.2 TiB
volume: a 96 GB checkpoint takes about 5 minutes to write or to read back), which cannot run here.
The delay is applied at the volume, so the worker and any user's script feel it the same way:

- one write pipe and one read pipe, shared by all clients and files;
- a write returns once copied (blocking only while the pipe is booked more than
  `max_backlog_seconds` ahead, like kernel dirty throttling); fsync/fdatasync, through any handle,
  waits until the file's data is on storage; close does not wait (as on Lustre);
- a read waits its turn on the read pipe; everything else (mkdir, rename, unlink, stat...) is plain.

`scale` makes each byte count as that many bytes, so a test's KB-size state stands for a GB-size one.

    with SlowVolume(backing, mount, write_bps=FSX_BPS, read_bps=FSX_BPS, scale=1e6): ...

Needs root (mount(2) on /dev/fuse) and Go (hack/slowfs/build.sh builds the program once, cached;
$RTJ_SLOWFS_BIN names a folder with a built `slowfs` instead).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

BUILD = Path(__file__).resolve().parents[1] / "slowfs" / "build.sh"
FSX_BPS = 300_000_000  # FSx for Lustre PERSISTENT_2 at 250 MB/s per TiB, 1.2 TiB: ~300 MB/s
MOUNTED = "slowfs: mounted"


def slowfs_bin_dir() -> Path:
    """The folder with the `slowfs` binary ($RTJ_SLOWFS_BIN, or built now by hack/slowfs/build.sh)."""
    if os.environ.get("RTJ_SLOWFS_BIN"):
        return Path(os.environ["RTJ_SLOWFS_BIN"])
    out = subprocess.run(["bash", str(BUILD)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def usable() -> bool:
    """Whether slowfs can mount here: root (mount(2)) and the kernel's FUSE device."""
    return os.geteuid() == 0 and os.path.exists("/dev/fuse")


def seconds_for(nbytes: int, bps: float, scale: float = 1.0) -> float:
    """How long the volume takes to move `nbytes` (each counting as `scale` bytes) at `bps`; 0 if unthrottled."""
    return nbytes * scale / bps if bps > 0 else 0.0


def is_mounted(path: Path) -> bool:
    """Whether something is mounted at `path` (from /proc/self/mounts: no stat on a possibly hung mount)."""
    target = os.path.abspath(path)
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 1 and _unescape(fields[1]) == target:
                return True
    return False


def _unescape(field: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


class SlowVolume:
    """hack/slowfs serving `backing` at `mount` while started (a context manager, or start()/stop())."""

    def __init__(
        self,
        backing: Path,
        mount: Path,
        write_bps: float = 0,
        read_bps: float = 0,
        scale: float = 1.0,
        max_backlog_seconds: float = 2.0,
        start_timeout: float = 30.0,
        stop_timeout: float = 15.0,
    ):
        self.backing, self.mount = Path(backing), Path(mount)
        self.write_bps, self.read_bps, self.scale = write_bps, read_bps, scale
        self.max_backlog_seconds = max_backlog_seconds
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None
        self.last_output = ""  # the program's output, kept by stop()

    def write_seconds(self, nbytes: int) -> float:
        return seconds_for(nbytes, self.write_bps, self.scale)

    def read_seconds(self, nbytes: int) -> float:
        return seconds_for(nbytes, self.read_bps, self.scale)

    def output(self) -> str:
        """What the program has printed (stdout and stderr) so far."""
        if self._log is None or not self._log.exists():
            return self.last_output
        return self._log.read_text(errors="replace")

    def start(self) -> SlowVolume:
        binary = slowfs_bin_dir() / "slowfs"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        fd, log = tempfile.mkstemp(prefix="slowfs-", suffix=".log")
        self._log = Path(log)
        with os.fdopen(fd, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    "--backing",
                    str(self.backing),
                    "--mount",
                    str(self.mount),
                    "--write-bps",
                    repr(float(self.write_bps)),
                    "--read-bps",
                    repr(float(self.read_bps)),
                    "--scale",
                    repr(float(self.scale)),
                    "--max-backlog-seconds",
                    repr(float(self.max_backlog_seconds)),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while MOUNTED not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                why = (
                    f"exited {self.proc.returncode}"
                    if self.proc.poll() is not None
                    else f"not mounted after {self.start_timeout}s"
                )
                self.stop()
                raise RuntimeError(f"slowfs {why} ({self.mount}):\n{self.output()}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """SIGTERM (the program unmounts and exits), bounded; then SIGKILL and `umount -l` if needed."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=self.stop_timeout)
        if is_mounted(self.mount):
            subprocess.run(["umount", "-l", str(self.mount)], check=False, capture_output=True)
        if self._log is not None:
            self.last_output = self.output()
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> SlowVolume:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
