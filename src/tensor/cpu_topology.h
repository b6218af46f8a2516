// How many threads to use when the user does not say.
//
// std::thread::hardware_concurrency() counts every online logical CPU of the
// machine. That is wrong for an inference server twice over: the pool's
// workers spin between the products of a forward pass, so a thread on the
// second hyper-thread of a busy core, or on a CPU the process may not run on
// (taskset, a container's cpuset) or has no quota for (a container's
// `--cpus`), only steals time from the threads that do the work; and decode
// is bound by memory bandwidth, which a core's sibling thread does not add.
// So the default is one thread per physical core in the process's affinity
// mask, capped by its cgroup CPU quota (rounded up), and at least one. On
// hybrid CPUs (Intel's performance + efficiency cores) only the performance
// cores count when the mask has any: every product waits for its slowest
// task, and an efficiency core's task is the slowest.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace reprise {

// Where the facts are read from; tests point these at fake trees.
struct CpuFacts {
  std::string sys_cpu_dir = "/sys/devices/system/cpu";
  std::string proc_self_cgroup = "/proc/self/cgroup";
  std::string cgroup_root = "/sys/fs/cgroup";
  // Hybrid CPUs list their performance cores in cpu_core/cpus.
  std::string sys_devices_dir = "/sys/devices";
};

// A kernel CPU list ("0-3,8,10-11") as CPU numbers; nullopt if malformed.
std::optional<std::vector<int>> parse_cpu_list(const std::string& text);

// The CPUs of `cpus` on performance cores when the CPU is hybrid and some
// are; otherwise `cpus` unchanged.
std::vector<int> performance_cpus(std::span<const int> cpus, const CpuFacts& facts);

// Physical cores among `cpus` (logical CPU numbers): CPUs that share a core
// (the same topology/core_cpus_list or thread_siblings_list) count once; a
// CPU whose topology cannot be read counts as a core of its own.
int count_physical_cores(std::span<const int> cpus, const std::string& sys_cpu_dir);

// The CPU quota of the process's cgroup in CPUs (cgroup v2 cpu.max, or v1
// cpu.cfs_quota_us / cpu.cfs_period_us), the tightest over the cgroup and
// its ancestors; nullopt when there is none or nothing can be read.
// Unreadable or malformed files are ignored.
std::optional<double> cgroup_cpu_quota(const CpuFacts& facts);

// min(physical cores of performance_cpus(allowed_cpus), ceil(quota)), at
// least 1.
int default_thread_count(std::span<const int> allowed_cpus, const CpuFacts& facts);

// The same for this process: its affinity mask and the real /sys and /proc.
int default_thread_count();

}  // namespace reprise
