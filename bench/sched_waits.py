#!/usr/bin/env python3
"""How long gradsyncd's threads waited behind other processes once woken,
from a scheduler trace: reads `perf sched timehist` (of `perf sched
record -a`) on stdin and prints, for every thread of every gradsyncd
process in it (a thread group whose main thread is named gradsyncd: the
loop, gs-worker, gs-comm, gs-pack-N, gs-park and Gloo's), how many times
one was woken, and for each wake-up which other tasks ran on its CPU
between the wake-up and the moment it ran: other processes (a busy loop,
a trainer), kernel threads, or gradsyncd's own threads (FIFO threads of
one priority do not preempt each other).

    perf sched timehist -i perf.data | python3 bench/sched_waits.py

bench/cluster.sh --sched runs it on each gradsync run's trace."""
import collections
import re
import sys

# time [cpu] task[tid/pid] wait sch-delay run (ms), as timehist prints them
LINE = re.compile(r"\s*([\d.]+)\s+\[(\d+)\]\s+(\S+?\[\d+(?:/\d+)?\])\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)")
TASK = re.compile(r"(.*)\[(\d+)(?:/(\d+))?\]$")
KERNEL = re.compile(r"(ksoftirqd|kworker|rcu_|migration|kcompactd|kdamond|kswapd|idle)")


def parse(lines):
    """[(end s, cpu, name, tid, tgid, sch delay s, run s)] in time order."""
    rows = []
    for line in lines:
        m = LINE.match(line)
        if not m:
            continue
        end, cpu, task, _wait, sch, run = m.groups()
        name, tid, tgid = TASK.match(task).groups()
        rows.append((float(end), int(cpu), name, int(tid), int(tgid or tid),
                     float(sch) / 1e3, float(run) / 1e3))
    return rows


def main():
    rows = parse(sys.stdin)
    daemons = {tgid for _, _, name, tid, tgid, _, _ in rows if name == "gradsyncd" and tid == tgid}
    by_cpu = collections.defaultdict(list)
    for r in rows:
        by_cpu[r[1]].append(r)
    wakeups = 0
    behind = collections.Counter()  # kind -> seconds
    worst = []                      # (seconds behind other processes, delay, at, thread, who)
    for end, cpu, name, tid, tgid, sch, run in rows:
        if tgid not in daemons or sch <= 0:
            continue
        wakeups += 1
        start, ran = end - run - sch, end - run
        who = collections.Counter()
        for end2, _, name2, _, tgid2, _, run2 in by_cpu[cpu]:
            overlap = min(end2, ran) - max(end2 - run2, start)
            if overlap <= 0:
                continue
            kind = ("gradsyncd" if tgid2 in daemons else
                    "kernel" if KERNEL.match(name2) else name2)
            who[kind] += overlap
        for kind, s in who.items():
            behind[kind] += s
        others = sum(s for kind, s in who.items() if kind not in ("gradsyncd", "kernel"))
        worst.append((others, sch, end, f"{name}[{tid}]", who))
    if not wakeups:
        print("no wake-up of a gradsyncd thread in the trace")
        return
    worst.sort(key=lambda w: w[0], reverse=True)
    others = sum(s for kind, s in behind.items() if kind not in ("gradsyncd", "kernel"))
    over = sum(1 for w in worst if w[0] > 1e-4)
    print(f"{wakeups} wake-ups of gradsyncd's threads ({len(daemons)} processes); "
          f"waited behind other processes {others * 1e3:.1f} ms in all, "
          f"behind kernel threads {behind['kernel'] * 1e3:.1f} ms, "
          f"behind gradsyncd's own threads {behind['gradsyncd'] * 1e3:.1f} ms; "
          f"{over} wake-ups waited over 0.1 ms behind other processes")
    print("the longest waits behind other processes:")
    for s, sch, end, thread, who in worst[:5]:
        if s <= 0:
            break
        names = ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in who.most_common())
        print(f"  {s * 1e3:8.3f} ms at {end:.6f} s, {thread} (woken {sch * 1e3:.3f} ms "
              f"before it ran): {names}")


if __name__ == "__main__":
    main()
