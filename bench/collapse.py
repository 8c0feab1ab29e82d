#!/usr/bin/env python3
"""Experiment (issue 37): put a running process's anonymous memory in 2 MiB pages from the
outside, with process_madvise(MADV_COLLAPSE), to learn whether page walks are what its threads
pay, before changing the daemon. MADV_COLLAPSE works whatever the sysfs THP mode (`madvise`
here). Every `--every` seconds, for every process whose comm is `--comm`, every anonymous
read-write mapping of 2 MiB or more is collapsed (new ones too: arenas grow).

    python3 bench/collapse.py --comm dcpid-thp --every 5 --for 1500
"""
import argparse, ctypes, os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collector import proc_kib  # noqa: E402

SYS_pidfd_open, SYS_process_madvise, MADV_COLLAPSE = 434, 440, 25
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def pids(comm):
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().strip() == comm:
                        yield int(p)
            except OSError:
                pass


def anon_ranges(pid):
    huge = 2 << 20
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            path = parts[5] if len(parts) > 5 else ""
            if "rw" not in parts[1] or (path and path != "[heap]"):
                continue
            lo2, hi2 = (lo + huge - 1) // huge * huge, hi // huge * huge
            if hi2 > lo2:
                yield lo2, hi2 - lo2


def collapse(pid):
    fd = libc.syscall(SYS_pidfd_open, pid, 0)
    if fd < 0:
        return 0, 0
    done = failed = 0
    try:
        for lo, n in anon_ranges(pid):
            iov = IoVec(lo, n)
            r = libc.syscall(SYS_process_madvise, fd, ctypes.byref(iov), 1, MADV_COLLAPSE, 0)
            if r < 0:
                failed += n
            else:
                done += n
    finally:
        os.close(fd)
    return done, failed


def anon_huge_kib(pid):
    return proc_kib(pid, "smaps_rollup", "AnonHugePages") or 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--comm", required=True)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--for", dest="duration", type=float, default=600.0)
    a = ap.parse_args()
    end = time.monotonic() + a.duration
    while time.monotonic() < end:
        for pid in pids(a.comm):
            done, failed = collapse(pid)
            print(f"{time.strftime('%H:%M:%S')} pid {pid}: collapse asked on {done >> 20} MiB "
                  f"({failed >> 20} MiB refused), AnonHugePages {anon_huge_kib(pid)} KiB",
                  flush=True)
        time.sleep(a.every)


if __name__ == "__main__":
    sys.exit(main())
