#!/usr/bin/env python3
"""How often a slice's offset block straddles two functions (issue 36, FORMAT.md §14.2).

For each image and resolution r (16: dcpid's minutes, 256: its hours), from `nm -S` (text
symbols with a size; `--dynamic` where the image is stripped): the blocks [k*r, (k+1)*r) that
hold bytes of a function, the share of them holding bytes of two or more functions (a range's
per-symbol answer splits those by the epoch profile, the others are exact), and the share of
functions that touch such a block.

  python3 bench/straddle.py /usr/lib/x86_64-linux-gnu/libc.so.6 /bin/bash ...
"""
import subprocess
import sys


def functions(path):
    out = []
    for dyn in ([], ["--dynamic"]):
        r = subprocess.run(["nm", "-S", "--defined-only"] + dyn + [path],
                           capture_output=True, text=True)
        for line in r.stdout.splitlines():
            f = line.split()
            if len(f) >= 4 and f[2] in "tTwW" and int(f[1], 16) > 0:
                out.append((int(f[0], 16), int(f[1], 16)))
        if out:
            break
    return sorted(set(out))


def main():
    print("| image | functions | r | blocks with code | straddling | functions touching one |")
    print("|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        fns = functions(path)
        for r in (16, 256):
            owners = {}
            for i, (a, n) in enumerate(fns):
                for b in range(a // r, (a + n - 1) // r + 1):
                    owners.setdefault(b, set()).add(i)
            strad = {b for b, o in owners.items() if len(o) > 1}
            touched = set()
            for b in strad:
                touched |= owners[b]
            print(f"| {path} | {len(fns)} | {r} | {len(owners)} | "
                  f"{100 * len(strad) / max(1, len(owners)):.1f} % | "
                  f"{100 * len(touched) / max(1, len(fns)):.1f} % |")


if __name__ == "__main__":
    main()
