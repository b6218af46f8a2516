#!/usr/bin/env python3
"""Compare two builds of kernels_bench on a noisy 2-vCPU machine.

Runs binary A and binary B at the same time, one pinned to each CPU, then
again with the CPUs swapped, so both see the same moments of the host's
load and neither keeps the faster vCPU (the two run up to ~35 % apart);
each swapped pair of runs gives one ratio, sqrt(B/A on one side * B/A on
the other), and the script prints per benchmark the median, min and max of
those over PAIRS pairs. A/A comparisons gave medians of 0.978-0.999 (session
39); the former median over unpaired rounds ranged 0.73-1.36 on the same
binary when the vCPUs' speeds differed.

    scripts/ab_kernels.py 'BM_Attention/512/512/1/64' 4 old/kernels_bench new/kernels_bench

Single-threaded benchmarks only (the two runs must not share a CPU); memory-
bound ones compete for bandwidth, so their ratios are less reliable.
"""
import collections
import math
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
    flt, pairs, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ratios = collections.defaultdict(list)
    for _ in range(pairs):
        first_a, first_b = run_pair(flt, a, b, 0, 1)
        second_a, second_b = run_pair(flt, a, b, 1, 0)
        for name in first_a:
            if all(name in r and r[name] > 0 for r in (first_b, second_a, second_b)) and first_a[name] > 0:
                ratios[name].append(math.sqrt(first_b[name] / first_a[name] * second_b[name] / second_a[name]))
    for name, r in ratios.items():
        print(f"{name}  B/A median {statistics.median(r):.3f}  min {min(r):.3f}  max {max(r):.3f}  pairs {len(r)}")


if __name__ == "__main__":
    main()
