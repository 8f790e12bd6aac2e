#!/usr/bin/env python3
"""Where one blazebench phase spends its CPU: attributes each sample of a `perf record` profile taken inside the
phase's MARK lines to the first category (most specific first) that a frame of its stack matches.

    BLAZEBENCH_MARKS=1 perf record -F 499 --call-graph dwarf --clockid monotonic -o w6.data \\
        .build/release/blazebench --only W6 --repeats 1 2> marks.txt
    Benchmarks/profile_phase.py w6.data marks.txt W6.merge

Stacks need DWARF unwinding (`--call-graph dwarf`): Swift's runtime and libc keep no frame pointers, so `-g` loses
the callers of retain/release, malloc and memmove. Benchmarks/README.md, "Profiling a phase", says more.
"""
import collections
import re
import subprocess
import sys

# (category, pattern on a demangled frame); the first match from this list wins, whichever frame it is in.
CATEGORIES = [
    ("fsync", r"fdatasync|\bfsync"),
    ("SQLite page reads (pread)", r"__libc_pread|\bpread64"),
    ("SQLite page writes (pwrite)", r"__libc_pwrite|\bpwrite64"),
    ("read and parse stored document states", r"SQLStorage\.document|SQLStorage\.createIfNew"),
    ("serialize document states", r"compactText|writeCompact"),
    ("record applied changes (changes table)", r"recordApplied"),
    ("feed", r"finishFeed|noteChanges|ChangeFeed"),
    ("version vectors", r"versionVector|VersionVector"),
    ("CRDT merge", r"Replica\.apply|applyReady|Replica\.receive|DocumentState\.merge"),
    ("write document rows (flush)", r"SQLStorage\.flush|SQLStorage\.write"),
    ("store entries (sync_entries)", r"recordEntries"),
    ("open and verify received batches", r"verify\(batch|BatchReceiver\.verify|SealedEntry\.open"),
    ("parse received changes", r"Change\.parse|parseChange|Change\.init\(json|Change\.decode"),
    ("seal and sign local changes (sender)", r"sealLocal|sealPending|SealedEntry\.seal"),
    ("read and send the log (sender)", r"entriesAfter|readEntries|SyncSession\.send|sendEntries"),
    ("session cipher and framing", r"SealedFrame|PeerMessage|SessionCipher|chacha20|ChaChaPoly"),
    ("event loops (NIO)", r"SelectableEventLoop|epoll_wait|NIOPosix"),
    ("other SQLite", r"sqlite3"),
    ("GRDB", r"GRDB|DatabaseQueue|SerializedDatabase"),
]


def phase_window(marks_path, phase):
    times = {}
    for line in open(marks_path, encoding="utf-8", errors="replace"):
        m = re.match(r"MARK (\S+) (start|end) ([0-9.]+)", line)
        if m and m.group(1) == phase:
            times[m.group(2)] = m.group(3)
    if "start" not in times or "end" not in times:
        sys.exit(f"no MARK {phase} start/end in {marks_path}")
    return times["start"], times["end"]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    data, marks, phase = sys.argv[1:]
    start, end = phase_window(marks, phase)
    script = subprocess.run(["perf", "script", "-i", data, "--time", f"{start},{end}", "-F", "comm,tid,time,ip,sym"],
                            capture_output=True, text=True, check=True).stdout
    demangled = subprocess.run(["swift", "demangle", "--simplified"], input=script, capture_output=True, text=True,
                               check=True).stdout
    counts, threads, total = collections.Counter(), collections.Counter(), 0
    stack, thread = [], None
    unmatched = collections.Counter()

    def finish():
        nonlocal total
        if not stack:
            return
        total += 1
        threads[thread] += 1
        for name, pattern in CATEGORIES:
            if any(re.search(pattern, f) for f in stack):
                counts[name] += 1
                return
        counts["other"] += 1
        for f in set(stack):
            unmatched[f[:100]] += 1

    for line in demangled.splitlines():
        if not line.strip():
            finish()
            stack = []
        elif line[0] in " \t":
            parts = line.strip().split(" ", 1)
            stack.append(parts[1] if len(parts) > 1 else parts[0])
        else:
            thread = re.sub(r"[-#]?\d+$", "", line.split()[0])
    finish()
    seconds = float(end) - float(start)
    print(f"{phase}: {seconds:.2f} s, {total} samples")
    for name, n in counts.most_common():
        print(f"  {100 * n / total:5.1f}%  {name}")
    print("by thread:", ", ".join(f"{t} {100 * n / total:.0f}%" for t, n in threads.most_common()))
    if counts["other"]:
        print("frames most often in 'other':", "; ".join(f for f, _ in unmatched.most_common(8)))


if __name__ == "__main__":
    main()
