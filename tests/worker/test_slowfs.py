"""hack/slowfs, the checkpoint volume with real-size timing (a simulation of FSx for Lustre's
throughput, which cannot run here): data goes through it unchanged, and writes+fsync, reads and
concurrent writers take as long as the volume's shared pipes say. Needs root (mount(2) on /dev/fuse)
and Go (hack/slowfs/build.sh, cached after the first build)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rtj_dev import slowfs
from rtj_dev.slowfs import SlowVolume, is_mounted, seconds_for, slowfs_bin_dir

pytestmark = pytest.mark.skipif(
    not slowfs.usable(), reason="slowfs mounts FUSE: needs root and /dev/fuse"
)

BPS = 1_000_000  # the volume's bytes per second in these tests
SCALE = 10.0  # each byte counts as 10: 256 KiB stands for 2.6 MB
N = 256 * 1024
EXPECTED = seconds_for(N, BPS, SCALE)  # 2.62 s
SLACK = 1.5  # generous upper bound on top of the model (2 loaded cores)


@pytest.fixture(scope="module", autouse=True)
def built() -> None:
    """Build (or find cached) the binary once, outside the timed parts."""
    assert (slowfs_bin_dir() / "slowfs").exists()


def volume(tmp_path: Path, **kwargs: float) -> SlowVolume:
    return SlowVolume(tmp_path / "backing", tmp_path / "mnt", **kwargs)


def write_file(path: Path, data: bytes, fsync: bool) -> tuple[float, float]:
    """Write `data` to `path`: (seconds the write took, seconds until fsync/close returned)."""
    start = time.monotonic()
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        wrote = time.monotonic() - start
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return wrote, time.monotonic() - start


def test_data_round_trips(tmp_path):
    """Bytes, directories, a committed-by-rename checkpoint, listing and unlink behave as on the backing."""
    files = {f"rank{i}.distcp": os.urandom(1_000_000 + 4096 * i + 7) for i in range(4)}
    with volume(tmp_path) as vol:
        assert is_mounted(vol.mount)
        tmp = vol.mount / "ckpt" / "step_10.tmp"
        tmp.mkdir(parents=True)
        for name, data in files.items():
            write_file(tmp / name, data, fsync=name.startswith("rank0"))
        with open(tmp / "big", "wb") as f:  # one write larger than a FUSE request (1 MiB)
            f.write(os.urandom(3 * 1024 * 1024 + 5))
        (tmp / "big").unlink()
        os.rename(tmp, vol.mount / "ckpt" / "step_10")
        assert sorted(os.listdir(vol.mount / "ckpt")) == ["step_10"]
        assert sorted(os.listdir(vol.mount / "ckpt" / "step_10")) == sorted(files)
        for name, data in files.items():
            assert (vol.mount / "ckpt" / "step_10" / name).read_bytes() == data
            assert (vol.backing / "ckpt" / "step_10" / name).read_bytes() == data
            assert os.stat(vol.mount / "ckpt" / "step_10" / name).st_size == len(data)
        (vol.mount / "ckpt" / "step_10" / "rank3.distcp").unlink()
        assert not (vol.backing / "ckpt" / "step_10" / "rank3.distcp").exists()
        assert len(os.listdir(vol.mount / "ckpt" / "step_10")) == 3
    assert not is_mounted(vol.mount)
    assert vol.proc is None and "slowfs: mounted" in vol.last_output


def test_write_then_fsync_takes_the_volume_time(tmp_path):
    """write returns after the backlog allowance (2 s of the 2.6 s booked); fsync once it is all on storage."""
    with volume(tmp_path, write_bps=BPS, scale=SCALE, max_backlog_seconds=2.0) as vol:
        wrote, synced = write_file(vol.mount / "model.pt", os.urandom(N), fsync=True)
    assert EXPECTED - 2.0 - 0.3 <= wrote <= EXPECTED - 2.0 + SLACK, (wrote, EXPECTED)
    assert 0.8 * EXPECTED <= synced <= EXPECTED + SLACK, (synced, EXPECTED)


def test_close_does_not_wait_but_fsync_on_another_handle_does(tmp_path):
    """As on Lustre: close returns at once; an fsync through a later handle waits for the data."""
    with volume(tmp_path, write_bps=BPS, scale=SCALE, max_backlog_seconds=10.0) as vol:
        path = vol.mount / "optim.pt"
        start = time.monotonic()
        _, closed = write_file(path, os.urandom(N), fsync=False)
        assert closed < 0.25 * EXPECTED, (closed, EXPECTED)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        synced = time.monotonic() - start
    assert 0.8 * EXPECTED <= synced <= EXPECTED + SLACK, (synced, EXPECTED)


def test_read_takes_the_volume_time(tmp_path):
    data = os.urandom(N)
    with volume(tmp_path, read_bps=BPS, scale=SCALE) as vol:
        write_file(vol.mount / "model.pt", data, fsync=True)  # writes unthrottled
        start = time.monotonic()
        assert (vol.mount / "model.pt").read_bytes() == data
        took = time.monotonic() - start
    assert 0.8 * EXPECTED <= took <= EXPECTED + SLACK, (took, EXPECTED)


def test_concurrent_writers_share_the_write_pipe(tmp_path):
    """Two files written and fsync'd at once: the last fsync returns after the sum, not the max."""
    half = N // 2
    done: dict[str, float] = {}
    with volume(tmp_path, write_bps=BPS, scale=SCALE, max_backlog_seconds=10.0) as vol:
        start = time.monotonic()

        def writer(name: str) -> None:
            write_file(vol.mount / name, os.urandom(half), fsync=True)
            done[name] = time.monotonic() - start

        threads = [threading.Thread(target=writer, args=(f"rank{i}.distcp",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    one = seconds_for(half, BPS, SCALE)
    assert sorted(done) == ["rank0.distcp", "rank1.distcp"]
    assert 0.8 * one <= min(done.values()) <= one + SLACK, (done, one)
    assert 0.8 * 2 * one <= max(done.values()) <= 2 * one + SLACK, (done, 2 * one)
