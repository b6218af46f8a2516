#include "tensor/cpu_topology.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace reprise {
namespace {

namespace fs = std::filesystem;

// A scratch directory holding fake /sys and /proc files.
class FakeTree {
 public:
  FakeTree() {
    root_ = fs::temp_directory_path() /
            ("reprise-cpu-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" + std::to_string(next_id_++));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  ~FakeTree() { fs::remove_all(root_); }
  void write(const std::string& rel, const std::string& text) const {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string path(const std::string& rel = "") const { return (root_ / rel).string(); }
  CpuFacts facts() const { return {path("sys/cpu"), path("proc/self/cgroup"), path("cgroup"), path("sys/devices")}; }

 private:
  static inline int next_id_ = 0;
  fs::path root_;
};

// n cores with two hyper-threads each: CPU c and c + n share core c.
void write_smt_machine(const FakeTree& t, int n_cores, const char* file = "thread_siblings_list") {
  for (int c = 0; c < 2 * n_cores; ++c) {
    const int core = c % n_cores;
    t.write("sys/cpu/cpu" + std::to_string(c) + "/topology/" + file,
            std::to_string(core) + "," + std::to_string(core + n_cores) + "\n");
  }
}

TEST(CpuTopology, HyperThreadsOfOneCoreCountOnce) {
  FakeTree t;
  write_smt_machine(t, 4);
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(count_physical_cores(all, t.path("sys/cpu")), 4);
  const std::vector<int> siblings = {2, 6};
  EXPECT_EQ(count_physical_cores(siblings, t.path("sys/cpu")), 1);
  const std::vector<int> two_cores = {0, 1};
  EXPECT_EQ(count_physical_cores(two_cores, t.path("sys/cpu")), 2);
  const std::vector<int> mixed = {0, 4, 5};
  EXPECT_EQ(count_physical_cores(mixed, t.path("sys/cpu")), 2);
}

TEST(CpuTopology, CoreCpusListIsPreferredAndMissingTopologyCountsEachCpu) {
  FakeTree t;
  write_smt_machine(t, 2, "core_cpus_list");
  // A stale thread_siblings_list that disagrees is not read.
  t.write("sys/cpu/cpu0/topology/thread_siblings_list", "0\n");
  const std::vector<int> pair = {0, 2};
  EXPECT_EQ(count_physical_cores(pair, t.path("sys/cpu")), 1);
  // CPUs 8 and 9 have no topology directory.
  const std::vector<int> unknown = {8, 9};
  EXPECT_EQ(count_physical_cores(unknown, t.path("sys/cpu")), 2);
  EXPECT_EQ(count_physical_cores(std::vector<int>{}, t.path("sys/cpu")), 0);
}

TEST(CpuTopology, CgroupV2QuotaIsTheTightestOnThePathToTheRoot) {
  FakeTree t;
  t.write("proc/self/cgroup", "0::/a/b\n");
  EXPECT_FALSE(cgroup_cpu_quota(t.facts())) << "no cpu.max anywhere";
  t.write("cgroup/a/b/cpu.max", "max 100000\n");
  EXPECT_FALSE(cgroup_cpu_quota(t.facts())) << "max means no limit";
  t.write("cgroup/a/b/cpu.max", "250000 100000\n");
  EXPECT_DOUBLE_EQ(*cgroup_cpu_quota(t.facts()), 2.5);
  t.write("cgroup/a/cpu.max", "150000 100000\n");
  EXPECT_DOUBLE_EQ(*cgroup_cpu_quota(t.facts()), 1.5) << "the parent's limit is tighter";
  t.write("cgroup/cpu.max", "50000 100000\n");
  EXPECT_DOUBLE_EQ(*cgroup_cpu_quota(t.facts()), 0.5) << "the root's limit is tighter still";
}

TEST(CpuTopology, CgroupV2InsideANamespaceAndOnHybridMounts) {
  FakeTree t;
  // The process's path does not exist under the mount (a cgroup namespace):
  // the mount's root is the container's cgroup.
  t.write("proc/self/cgroup", "0::/not/here\n");
  t.write("cgroup/cpu.max", "300000 100000\n");
  EXPECT_DOUBLE_EQ(*cgroup_cpu_quota(t.facts()), 3.0);
  // Hybrid hierarchy: v2 under cgroup/unified.
  FakeTree h;
  h.write("proc/self/cgroup", "0::/svc\n");
  h.write("cgroup/unified/svc/cpu.max", "200000 100000\n");
  EXPECT_DOUBLE_EQ(*cgroup_cpu_quota(h.facts()), 2.0);
}

TEST(CpuTopology, CgroupV1CfsQuota) {
  FakeTree t;
  t.write("proc/self/cgroup", "4:memory:/x\n3:cpu,cpuacct:/x/y\n1:name=systemd:/\n");
  t.write("cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  t.write("cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_FALSE(cgroup_cpu_quota(t.facts())) << "-1 means no limit";
  t.write("cgroup/cpu,cpuacct/x/y/cpu.cfs_quota_us", "400000\n");
  t.write("cgroup/cpu,cpuacct/x/y/cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(*cgroup_cpu_quota(t.facts()), 4.0);
  // A memory-only hierarchy's files are never read as a CPU quota.
  t.write("cgroup/memory/x/cpu.cfs_quota_us", "100000\n");
  t.write("cgroup/memory/x/cpu.cfs_period_us", "100000\n");
  EXPECT_DOUBLE_EQ(*cgroup_cpu_quota(t.facts()), 4.0);
}

TEST(CpuTopology, MalformedFilesAreIgnored) {
  FakeTree t;
  t.write("proc/self/cgroup", "garbage\n0::relative\n::\n0::/a\n3:cpu:/a\n");
  t.write("cgroup/a/cpu.max", "lots 100000\n");
  t.write("cgroup/cpu.max", "100000 0\n");
  t.write("cgroup/cpu/a/cpu.cfs_quota_us", "1e999\n");
  t.write("cgroup/cpu/a/cpu.cfs_period_us", "100000\n");
  t.write("cgroup/cpu/cpu.cfs_quota_us", "200000 extra\n");
  t.write("cgroup/cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_FALSE(cgroup_cpu_quota(t.facts()));
  FakeTree missing;  // no files at all
  EXPECT_FALSE(cgroup_cpu_quota(missing.facts()));
}

TEST(CpuTopology, DefaultIsPhysicalCoresCappedByTheQuotaRoundedUp) {
  FakeTree t;
  write_smt_machine(t, 8);
  std::vector<int> all;
  for (int c = 0; c < 16; ++c) all.push_back(c);
  t.write("proc/self/cgroup", "0::/c\n");
  EXPECT_EQ(default_thread_count(all, t.facts()), 8) << "no quota: one thread per core";
  t.write("cgroup/c/cpu.max", "250000 100000\n");
  EXPECT_EQ(default_thread_count(all, t.facts()), 3) << "2.5 CPUs of quota";
  t.write("cgroup/c/cpu.max", "1000 100000\n");
  EXPECT_EQ(default_thread_count(all, t.facts()), 1) << "at least one thread";
  t.write("cgroup/c/cpu.max", "1600000 100000\n");
  const std::vector<int> pinned = {3, 11, 4};  // taskset: two cores' worth
  EXPECT_EQ(default_thread_count(pinned, t.facts()), 2) << "a quota above the cores leaves the cores";
  EXPECT_EQ(default_thread_count(std::vector<int>{}, t.facts()), 1);
}

TEST(CpuTopology, ParsesKernelCpuLists) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_EQ(parse_cpu_list(""), (std::vector<int>{}));
  for (const char* bad : {"a", "3-", "-3", "4-2", "1-3-5", "1,,x", "2x", "0-99999999"})
    EXPECT_FALSE(parse_cpu_list(bad)) << bad;
}

// Alder Lake-like: 8 performance cores with two threads each (CPUs 2c and
// 2c + 1), then 8 single-threaded efficiency cores (CPUs 16-23).
void write_hybrid_machine(const FakeTree& t) {
  for (int c = 0; c < 24; ++c) {
    const std::string siblings = c < 16 ? std::to_string(c / 2 * 2) + "-" + std::to_string(c / 2 * 2 + 1)
                                        : std::to_string(c);
    t.write("sys/cpu/cpu" + std::to_string(c) + "/topology/thread_siblings_list", siblings + "\n");
  }
  t.write("sys/devices/cpu_core/cpus", "0-15\n");
  t.write("sys/devices/cpu_atom/cpus", "16-23\n");
}

TEST(CpuTopology, HybridCpusCountOnlyPerformanceCores) {
  FakeTree t;
  write_hybrid_machine(t);
  std::vector<int> all;
  for (int c = 0; c < 24; ++c) all.push_back(c);
  EXPECT_EQ(performance_cpus(all, t.facts()).size(), 16u);
  EXPECT_EQ(default_thread_count(all, t.facts()), 8);
  // Pinned to efficiency cores only: those are what there is.
  const std::vector<int> small = {16, 17, 18};
  EXPECT_EQ(default_thread_count(small, t.facts()), 3);
  // One performance core and some efficiency cores: the performance core.
  const std::vector<int> mixed = {4, 5, 20, 21};
  EXPECT_EQ(default_thread_count(mixed, t.facts()), 1);
  // Not hybrid (no cpu_atom): every core counts.
  FakeTree plain;
  write_hybrid_machine(plain);
  fs::remove_all(plain.path("sys/devices/cpu_atom"));
  EXPECT_EQ(default_thread_count(all, plain.facts()), 16);
  // A malformed performance list is ignored rather than trusted.
  plain.write("sys/devices/cpu_atom/cpus", "16-23\n");
  plain.write("sys/devices/cpu_core/cpus", "zero to fifteen\n");
  EXPECT_EQ(default_thread_count(all, plain.facts()), 16);
}

TEST(CpuTopology, ThisProcessGetsAtLeastOneAndNoMoreThanItsCpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const int allowed = CPU_COUNT(&set);
  const int n = default_thread_count();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, allowed);
  // Narrowing the affinity mask to one CPU narrows the default to one thread.
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) {
      CPU_SET(c, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int narrowed = default_thread_count();
  ASSERT_EQ(sched_setaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(narrowed, 1);
}

}  // namespace
}  // namespace reprise
