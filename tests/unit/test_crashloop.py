"""rtj_worker.crashloop: a worker group failing the same way twice in a row with no progress between is a
crash loop, read from the ranks' lines as ft_launcher forwards them (any script's, no trainer's help)."""

from __future__ import annotations

import pytest

from rtj_worker.crashloop import NO_TRACEBACK, CrashLoop

GROUP_FAILED = "[2026-12-05 10:00:01,000] [INFO] [launcher.py:614] [default] Worker group FAILED. 19/20 attempts left"


def traceback(rank: int, exception: str, frame: str = "train.py") -> list[str]:
    return [f"[default{rank}]:Traceback (most recent call last):",
            f'[default{rank}]:  File "/work/{frame}", line 3, in <module>',
            f"[default{rank}]:    import flash_attn",
            f"[default{rank}]:{exception}"]


def fail(loop: CrashLoop, lines: list[str], progress: tuple[int, ...] = (0, 0, 0)) -> None:
    for line in [*lines, GROUP_FAILED]:
        if loop.line(line):
            loop.group_failed(progress)


MISSING = "ModuleNotFoundError: No module named 'flash_attn'"


def test_the_same_exception_twice_without_progress_is_a_loop_with_its_traceback():
    loop = CrashLoop()
    fail(loop, ["[default0]:loading data", *traceback(0, MISSING)])
    assert loop.loop is None  # once may be bad luck
    fail(loop, traceback(1, MISSING))
    assert loop.loop is not None and loop.loop.signature == MISSING
    assert loop.loop.lines[0] == "Traceback (most recent call last):" and loop.loop.lines[-1] == MISSING
    assert loop.reason().endswith(f"no step or checkpoint progress: {MISSING}")


@pytest.mark.parametrize("second, progress", [
    (traceback(0, "ValueError: bad batch size"), (0, 0, 0)),  # another failure
    (traceback(0, MISSING), (40, 30, 30)),  # the same, but it trained and saved in between
])
def test_another_failure_or_progress_in_between_is_no_loop(second, progress):
    loop = CrashLoop()
    fail(loop, traceback(0, MISSING))
    fail(loop, second, progress)
    assert loop.loop is None


def test_a_peers_fault_seen_by_a_rank_never_counts():
    """A rank whose connection a lost peer reset fails the same way at every restart until the
    peer is replaced: the platform's, recovered by restarting."""
    loop = CrashLoop()
    reset = "torch.distributed.DistNetworkError: Connection reset by peer"
    for _ in range(3):
        fail(loop, traceback(0, reset))
    assert loop.loop is None


def test_the_rank_that_raised_names_the_failure_not_the_ones_stopped_after_it():
    loop = CrashLoop()
    for _ in range(2):
        fail(loop, [*traceback(1, "RuntimeError: Connection closed by peer"), *traceback(0, MISSING)])
    assert loop.loop is not None and loop.loop.signature == MISSING


def test_ranks_that_exit_without_a_traceback_loop_too_and_say_their_last_lines():
    loop = CrashLoop()
    for _ in range(2):
        fail(loop, ["[default0]:usage: train.py [--lr LR]",
                    "[default0]:train.py: error: unrecognized arguments: --lr0"])
    assert loop.loop is not None and loop.loop.signature == NO_TRACEBACK
    assert loop.loop.lines[-1] == "train.py: error: unrecognized arguments: --lr0"


def test_unprefixed_rank_output_as_nvrx_06_forwards_it_counts_and_log_records_do_not():
    loop = CrashLoop()
    lines = ["2026-12-05 11:05:20,885 [INFO] [vm] launcher.py:580 [default] starting workers for entrypoint: python",
             *(line.split("]:", 1)[1] for line in traceback(0, MISSING))]
    for pid in (13680, 13689):  # NVRx 0.4.1's record of the failure, in the middle of the traceback
        lines.insert(2, f"[2026-12-05 11:06:25,424] [ERROR] [ft_launcher13671@vm] failed (exitcode: 1) local_rank: 0 "
                        f"(pid: {pid}) of binary: /usr/bin/python")
        fail(loop, lines)
    assert loop.loop is not None and loop.loop.signature == MISSING and "starting workers" not in loop.loop.lines[0]


def test_a_chained_exception_ends_at_its_last_exception_line():
    loop = CrashLoop()
    chained = [*traceback(0, "KeyError: 'lr'"), "[default0]:", "[default0]:During handling of the above exception, "
               "another exception occurred:", "[default0]:", *traceback(0, "SystemExit: config has no 'lr'")]
    for _ in range(2):
        fail(loop, chained)
    assert loop.loop is not None and loop.loop.signature == "SystemExit: config has no 'lr'"


JOINED = ("[2026-12-05 10:00:02,000] [INFO] [ft_launcher42@vm] The node 'n_42_0' has joined round 2 of the "
          "rendezvous 'job' as rank 0 in a world of size 1.")


def test_a_traceback_forwarded_after_the_failure_record_is_that_failures():
    """NVRx 0.4.1 (torch's log tailing) may forward a rank's traceback after the launcher's record of its
    group's failure, before the next rendezvous: it is read with that failure, and a typo still loops at
    the second failure (CI: read as failures without a traceback, it looped at the fourth)."""
    loop = CrashLoop()
    for _ in range(2):
        assert loop.line(GROUP_FAILED)
        first = loop.group_failed((0, 0, 0))
        assert first.signature == NO_TRACEBACK  # nothing of its ranks yet
        for line in traceback(0, MISSING):  # late
            loop.line(line)
        loop.line(JOINED)  # the next group
    assert [f.signature for f in loop.failures] == [MISSING, MISSING]
    assert loop.loop is not None and loop.loop.signature == MISSING


def test_the_next_groups_rendezvous_alone_changes_nothing():
    loop = CrashLoop()
    fail(loop, traceback(0, MISSING))
    loop.line(JOINED)
    assert [f.signature for f in loop.failures] == [MISSING] and loop.loop is None
    fail(loop, ["[default0]:usage: train.py [--lr LR]"])
    loop.line(JOINED)
    assert [f.signature for f in loop.failures] == [MISSING, NO_TRACEBACK] and loop.loop is None
