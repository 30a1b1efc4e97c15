"""Where the branch and bound's time goes: a sampling profile of one search, by compiled function and, in
the hottest function, by address span (Linux ``perf`` and GNU ``objdump`` needed).

    .venv/bin/python benchmarks/profile_bnb.py --real DUMP --row 49 [--s 8] [--time-limit 60]
        [--incumbent best.npy] [--frequency 2000] [--spans 8]

The row (a ``row_id`` of a ``forcedweight dump``) is searched on one thread from ``--incumbent`` (a saved
best set, e.g. its optimum, so the run is the proof alone) or from top-mass, kicks and restarts off
(``solve_bnb(p, V, s, incumbent, time_limit, kick_work=0)``), while ``perf record`` samples the process.
Numba's on-disk cache is bypassed (a fresh ``NUMBA_CACHE_DIR``), so the search is compiled here and its
machine code can be read back: every function of ``bnb._search``'s library is copied out of memory, the
samples are mapped onto it, and the hottest function's samples are grouped into spans of nearby
addresses, each printed with its share and its most-sampled instructions (``objdump`` of the copied
code). Reading a span's instructions against ``node_tests.py`` tells which loop it is (the step scans
multiply by ``inv = 1 / ||v||``; the step sums are ``vmulpd``/``vaddpd`` on ``ymm`` registers). Shares, not seconds:
the profile does not time anything against a baseline.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="fw-profile-numba-")  # before numba is imported
atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], True)
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

SPAN_GAP = 0x30  # samples closer than this many bytes are one span
CODE_MAX = 1 << 18  # bytes copied per function at most


def _functions():
    """[(address, name)] of the compiled functions linked into ``bnb._search``, ascending."""
    from forcedweight.certify.solvers import bnb

    libs = [cres.library for cres in bnb._search.overloads.values()]
    if not libs:
        sys.exit("profile_bnb: bnb._search was not compiled")
    engine = libs[0]._codegen._engine
    names = set(re.findall(r'^define[^@]*@"?([^"(\s]+)"?\(', libs[0].get_llvm_str(), re.M))
    found = [(engine.get_function_address(n), n) for n in names]
    return sorted((a, n) for a, n in found if a)


def _copy_code(funcs, folder):
    """Each function's machine code (up to the next function, at most CODE_MAX bytes) into ``folder``."""
    paths = {}
    with open("/proc/self/mem", "rb") as mem:
        for i, (a, n) in enumerate(funcs):
            size = min(funcs[i + 1][0] - a if i + 1 < len(funcs) else CODE_MAX, CODE_MAX)
            got = b""
            for off in range(0, size, 4096):  # stop at the first page that cannot be read
                try:
                    mem.seek(a + off)
                    got += mem.read(min(4096, size - off))
                except OSError:
                    break
            path = os.path.join(folder, f"{a:x}.bin")
            with open(path, "wb") as f:
                f.write(got)
            paths[a] = (path, len(got))
    return paths


def _short(name):
    """``module.function`` from a Numba symbol (``..._ZN12forcedweight7certify7solvers3bnb7_searchB2v5...``)."""
    parts, i = [], name.find("_ZN") + 3
    while i > 2 and i < len(name) and name[i].isdigit():
        j = i
        while name[j].isdigit():
            j += 1
        parts.append(name[j:j + int(name[i:j])])
        i = j + int(name[i:j])
    return ".".join(parts[-2:]) if parts else name[:60]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", required=True, help="a forcedweight dump (folder or Parquet file)")
    ap.add_argument("--row", type=int, required=True, help="row_id of the row to search")
    ap.add_argument("--s", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--incumbent", default=None, help=".npy file of a best set (key indices) to start from")
    ap.add_argument("--frequency", type=int, default=2000, help="perf samples per second")
    ap.add_argument("--spans", type=int, default=8, help="hottest spans of the hottest function to print")
    args = ap.parse_args(argv)
    for tool in ("perf", "objdump"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            sys.exit(f"profile_bnb: `{tool}` not found (Linux perf and GNU binutils are needed)")

    from forcedweight.certify.solvers.bnb import solve_bnb
    from forcedweight.rows import rows_by_id

    r = rows_by_id(args.real, [args.row]).get(args.row)
    if r is None:
        sys.exit(f"profile_bnb: no row with row_id {args.row} in {args.real}")
    start = None if args.incumbent is None else np.load(args.incumbent)
    solve_bnb(r.p[:400] / r.p[:400].sum(), r.V[:400], args.s, time_limit=0.3, kick_work=0)  # compile here
    funcs = _functions()
    work = tempfile.mkdtemp(prefix="fw-profile-")  # the copied code and perf.data, removed at exit
    atexit.register(shutil.rmtree, work, True)
    code = _copy_code(funcs, work)
    data = os.path.join(work, "perf.data")
    perf = subprocess.Popen(["perf", "record", "-F", str(args.frequency), "-p", str(os.getpid()), "-o", data],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # perf attaches
    t0 = time.perf_counter()
    res = solve_bnb(r.p, r.V, args.s, incumbent=start, time_limit=args.time_limit, kick_work=0)
    seconds = time.perf_counter() - t0
    perf.send_signal(signal.SIGINT)
    perf.wait()
    ips = subprocess.run(["perf", "script", "-i", data, "-F", "ip"], capture_output=True, text=True).stdout.split()
    ips = collections.Counter(int(x, 16) for x in ips)
    print(f"row {args.row}: N = {r.p.shape[0]}, s = {args.s}, {seconds:.2f} s, {res.info['nodes']} nodes, "
          f"proved {res.proved}; {sum(ips.values())} samples")

    by_func = collections.Counter()
    inside = collections.defaultdict(collections.Counter)
    for ip, v in ips.items():
        owner = None
        for a, _ in funcs:
            if a <= ip < a + code[a][1]:
                owner = a
        by_func[owner] += v
        if owner is not None:
            inside[owner][ip] += v
    total = sum(by_func.values())
    names = dict(funcs)
    print("\n| function | share of samples |\n|---|---|")
    for a, v in by_func.most_common():
        print(f"| {_short(names[a]) if a is not None else '(outside the search library)'} | {v / total:.3f} |")

    hot = max((a for a in inside), key=lambda a: by_func[a])
    dis = subprocess.run(["objdump", "-D", "-b", "binary", "-mi386:x86-64", f"--adjust-vma={hot:#x}",
                          code[hot][0]], capture_output=True, text=True).stdout
    text = {int(m.group(1), 16): m.group(2).strip() for m in re.finditer(r"^\s*([0-9a-f]+):\s*(.*)$", dis, re.M)}
    spans = []
    for ip, v in sorted(inside[hot].items()):
        if spans and ip - spans[-1][1] < SPAN_GAP:
            spans[-1][1] = ip
            spans[-1][2][ip] = v
        else:
            spans.append([ip, ip, {ip: v}])
    own = by_func[hot]
    print(f"\n{_short(names[hot])}: its hottest spans (offsets from the function's start; share of its samples)")
    for lo, hi, hits in sorted(spans, key=lambda s: -sum(s[2].values()))[:args.spans]:
        print(f"\n[{lo - hot:#x}, {hi - hot:#x}]  {sum(hits.values()) / own:.3f}")
        for ip, v in sorted(hits.items(), key=lambda x: -x[1])[:6]:
            ins = re.sub(r"^([0-9a-f]{2} )+\s*", "", text.get(ip, "?"))
            print(f"    {ip - hot:#7x} {v / own:.3f}  {ins}")


if __name__ == "__main__":
    main()
