"""CPU time by thread of a process and all its descendants (a server and its workers, which run in
sessions of their own), sampled from /proc: which threads compete with the MP4 encoder's while a
request runs. Linux only.

    python3 bench/thread_cpu.py PID --duration 8 --interval 0.25

Prints, per window, the threads that used more than `--min-percent` of a core in it (process id,
process name, thread name, % of one core), then each thread's total over the whole run.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_fields(path: str) -> list[str] | None:
    try:
        with open(path) as stat:
            text = stat.read()
    except OSError:
        return None
    # The name (field 2) is in parentheses and may hold spaces: split after its closing one.
    name_end = text.rindex(")")
    return [
        text[: text.index("(")].strip(),
        text[text.index("(") + 1 : name_end],
        *text[name_end + 2 :].split(),
    ]


def process_tree(root_pid: int) -> list[int]:
    """root_pid and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(f"/proc/{entry}/stat")
            if fields is not None:
                children.setdefault(int(fields[3]), []).append(int(entry))  # field 4: the parent
    tree, pending = [], [root_pid]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        pending.extend(children.get(pid, []))
    return tree


def thread_ticks(pids: list[int]) -> dict[tuple[int, str, int, str], int]:
    """(pid, process name, tid, thread name) -> user + system clock ticks so far."""
    ticks = {}
    for pid in pids:
        process = _stat_fields(f"/proc/{pid}/stat")
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            fields = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
            if process is not None and fields is not None:
                ticks[(pid, process[1], int(tid), fields[1])] = int(fields[13]) + int(fields[14])
    return ticks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pid", type=int, help="the root process (the server's)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds a window")
    parser.add_argument("--min-percent", type=float, default=10.0)
    args = parser.parse_args()
    started = time.monotonic()
    previous = thread_ticks(process_tree(args.pid))
    totals: dict[tuple, int] = defaultdict(int)
    while time.monotonic() - started < args.duration:
        time.sleep(args.interval)
        current = thread_ticks(process_tree(args.pid))
        busy = []
        for key, ticks in current.items():
            used = ticks - previous.get(key, ticks)
            totals[key] += used
            percent = 100 * used / CLOCK_TICKS_PER_S / args.interval
            if percent >= args.min_percent:
                busy.append((percent, key))
        line = ", ".join(
            f"{pid}:{proc}/{name} {percent:.0f}%"
            for percent, (pid, proc, _, name) in sorted(busy, reverse=True)
        )
        print(f"{time.monotonic() - started:6.2f} s  {sum(p for p, _ in busy):5.0f}%  {line}", flush=True)
        previous = current
    print("totals, % of one core over the run:")
    elapsed_s = time.monotonic() - started
    for key, ticks in sorted(totals.items(), key=lambda item: -item[1])[:25]:
        pid, proc, tid, name = key
        print(f"  {pid}:{proc}/{name} (tid {tid}): {100 * ticks / CLOCK_TICKS_PER_S / elapsed_s:.0f}%")


if __name__ == "__main__":
    main()
