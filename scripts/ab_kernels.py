#!/usr/bin/env python3
"""Compare two builds of kernels_bench on a noisy 2-vCPU machine.

Runs binary A and binary B at the same time, one pinned to each CPU, and
swaps the CPUs every round, so both see the same moment of the host's load;
prints B/A per benchmark (median, min, max over the rounds). Sequential runs
on a shared VM move 10-30 % from minute to minute, which hides 10 % effects.

    scripts/ab_kernels.py 'BM_Attention/512/512/1/64' 8 old/kernels_bench new/kernels_bench

Single-threaded benchmarks only (the two runs must not share a CPU); memory-
bound ones compete for bandwidth, so their ratios are less reliable.
"""
import collections
import re
import statistics
import subprocess
import sys

UNITS = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}


def rates(output):
    """Benchmark name -> the first rate counter (name=value/s) of its line."""
    out = {}
    for line in output.splitlines():
        if not line.startswith("BM_"):
            continue
        m = re.search(r"=([0-9.]+)([kMG]?)/s", line)
        if m:
            out[line.split()[0]] = float(m.group(1)) * UNITS[m.group(2)]
    return out


def run_pair(flt, a, b, cpu_a, cpu_b):
    def start(binary, cpu):
        return subprocess.Popen(["taskset", "-c", str(cpu), binary, f"--benchmark_filter={flt}",
                                 "--benchmark_min_time=0.3"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pa, pb = start(a, cpu_a), start(b, cpu_b)
    return rates(pa.communicate()[0]), rates(pb.communicate()[0])


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    flt, rounds, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ratios = collections.defaultdict(list)
    for i in range(rounds):
        ra, rb = run_pair(flt, a, b, i % 2, 1 - i % 2)
        for name, value in ra.items():
            if name in rb and value > 0:
                ratios[name].append(rb[name] / value)
    for name, r in ratios.items():
        print(f"{name}  B/A median {statistics.median(r):.3f}  min {min(r):.3f}  max {max(r):.3f}")


if __name__ == "__main__":
    main()
