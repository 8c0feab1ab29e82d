#!/usr/bin/env python3
"""Where dcpid's peak RSS comes from (issue #13): start-up, steady state and shutdown apart.

Runs `dcpid --config none --duration D` (as root) N times and samples /proc/PID/status every
5 ms for the first 3 s, then every 50 ms. The kernel's own high-water mark (VmHWM) is read at
the end of start-up (3 s), then reset (`echo 5 > /proc/PID/clear_refs`), so that the steady
state's peak (3 s to D - 1 s) is measured apart from the start-up's; the shutdown's (the last
flush and publish) is the last VmHWM seen. RssAnon/RssFile are given where the sampled RSS
peaked, and the file-backed RSS per file (smaps) at the end of the steady state: the binary's
text is counted in the RSS too.

  bench/rss.py [--dcpid target/release/dcpid] [--runs 5] [--duration 30]
               [--busy N] [--load 'shell command'] [--out results/rss-DATE.json]

--busy N: N Python busy loops, as bench/collector.py; --load CMD: a shell command run in a
loop for the whole run (e.g. a compiler, for a steady state with many distinct pcs). Without
either, the machine's own load.
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STARTUP_S = 3.0
KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile")


def status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in KEYS:
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out if len(out) == len(KEYS) else None


def file_rss(pid):
    """{file: RSS KiB} of file-backed mappings (smaps), largest first."""
    out, name = {}, None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                    name = head[5] if len(head) > 5 and head[5].startswith("/") else None
                elif head[0] == "Rss:" and name:
                    out[name] = out.get(name, 0) + int(head[1])
    except OSError:
        pass
    return dict(sorted(((k, v) for k, v in out.items() if v), key=lambda kv: -kv[1]))


def ask_status(path):
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(path)
        s.sendall(b'{"cmd":"status"}\n')
        while not s.recv(1 << 20).endswith(b"\n"):
            pass
        s.close()
    except OSError:
        pass


def one_run(args):
    d = tempfile.mkdtemp(prefix="dcpi-rss-")
    os.mkdir(os.path.join(d, "spool"))
    sock = os.path.join(d, "s")
    cmd = [args.dcpid, "--config", "none", "--db", os.path.join(d, "db"),
           "--spool", os.path.join(d, "spool"), "--socket", sock,
           "--duration", f"{args.duration}s"]
    log = open(os.path.join(d, "log"), "w")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    peak = {"startup": None, "steady": None}
    phase, last, hwm_startup, hwm_steady, files = "startup", None, None, None, {}
    next_status = t0 + 1.6
    while p.poll() is None:
        now = time.monotonic() - t0
        st = status(p.pid)
        if st is None:
            time.sleep(0.005)
            continue
        last = st
        if phase in peak and (peak[phase] is None or st["VmRSS"] > peak[phase]["VmRSS"]):
            peak[phase] = dict(st, t=round(now, 3))
        if phase == "startup" and now >= STARTUP_S:
            hwm_startup = st["VmHWM"]
            with open(f"/proc/{p.pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
            phase = "steady"
        elif phase == "steady" and now >= args.duration - 1:
            hwm_steady = st["VmHWM"]
            files = file_rss(p.pid)
            phase = "shutdown"
        if time.monotonic() >= next_status:
            ask_status(sock)
            next_status += 1.6
        time.sleep(0.005 if now < STARTUP_S else 0.05)
    rc = p.wait()
    log.close()
    tail = open(os.path.join(d, "log")).read()[-1500:]
    subprocess.run(["rm", "-rf", d])
    if rc != 0:
        sys.exit(f"dcpid exited {rc}:\n{tail}")
    return {"startup_hwm_kib": hwm_startup, "steady_hwm_kib": hwm_steady,
            "shutdown_hwm_kib": last["VmHWM"] if last else None,
            "peak_vmhwm_kib": max(x for x in (hwm_startup, hwm_steady, last and last["VmHWM"])
                                  if x is not None),
            "startup_peak_sample": peak["startup"], "steady_peak_sample": peak["steady"],
            "file_rss_kib": files}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dcpid", default=os.path.join(ROOT, "target/release/dcpid"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--duration", type=int, default=30)
    ap.add_argument("--busy", type=int, default=0)
    ap.add_argument("--load", default=None)
    ap.add_argument("--out", default=os.path.join(
        HERE, "results", time.strftime("rss-%Y%m%dT%H%M%SZ.json", time.gmtime())))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (dcpid samples system-wide)")
    bg = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
          for _ in range(args.busy)]
    if args.load:
        bg.append(subprocess.Popen(["sh", "-c", f"while :; do {args.load}; done"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True))
    runs = []
    try:
        for i in range(args.runs):
            r = one_run(args)
            runs.append(r)
            ss, st = r["startup_peak_sample"], r["steady_peak_sample"]
            print(f"run {i + 1}: VmHWM start-up {r['startup_hwm_kib']} KiB "
                  f"(anon {ss['RssAnon']} + file {ss['RssFile']} at {ss['t']} s), "
                  f"steady {r['steady_hwm_kib']} KiB "
                  f"(anon {st['RssAnon']} + file {st['RssFile']} at {st['t']} s), "
                  f"with shutdown {r['shutdown_hwm_kib']} KiB", flush=True)
    finally:
        for b in bg:
            try:
                os.killpg(b.pid, signal.SIGKILL) if args.load and b is bg[-1] else b.kill()
            except OSError:
                pass
            b.wait()
    summary = {k: {"min": min(r[k] for r in runs), "median": statistics.median(r[k] for r in runs),
                   "max": max(r[k] for r in runs)}
               for k in ("startup_hwm_kib", "steady_hwm_kib", "shutdown_hwm_kib",
                         "peak_vmhwm_kib")}
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git": git,
           "dcpid": args.dcpid, "duration_s": args.duration, "busy": args.busy,
           "load": args.load, "loadavg": open("/proc/loadavg").read().split()[:3],
           "summary": summary, "runs": runs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for k, v in summary.items():
        print(f"{k}: min {v['min']} median {v['median']} max {v['max']}")
    print("file-backed RSS at the end of the steady state (last run):")
    for k, v in list(runs[-1]["file_rss_kib"].items())[:8]:
        print(f"  {v:6d} KiB {k}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
