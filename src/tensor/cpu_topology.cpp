#include "tensor/cpu_topology.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

namespace reprise {
namespace {

// The first line of a small text file, or nullopt.
std::optional<std::string> read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<double> parse_number(const std::string& s) {
  std::istringstream in(s);
  double v;
  if (!(in >> v) || !std::isfinite(v)) return std::nullopt;
  std::string rest;
  if (in >> rest) return std::nullopt;
  return v;
}

// quota / period in CPUs; none unless both are positive numbers.
std::optional<double> quota_ratio(const std::string& quota, const std::string& period) {
  const auto q = parse_number(quota), p = parse_number(period);
  if (!q || !p || *q <= 0 || *p <= 0) return std::nullopt;
  return *q / *p;
}

// "max 100000" -> none; "150000 100000" -> 1.5.
std::optional<double> quota_v2(const std::string& dir) {
  const auto line = read_line(dir + "/cpu.max");
  if (!line) return std::nullopt;
  std::istringstream in(*line);
  std::string quota, period;
  if (!(in >> quota >> period) || quota == "max") return std::nullopt;
  return quota_ratio(quota, period);
}

// cpu.cfs_quota_us of -1 means no limit.
std::optional<double> quota_v1(const std::string& dir) {
  const auto quota = read_line(dir + "/cpu.cfs_quota_us");
  const auto period = read_line(dir + "/cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  return quota_ratio(*quota, *period);
}

// best becomes q when q is a tighter limit.
void keep_tightest(std::optional<double>& best, std::optional<double> q) {
  if (q && (!best || *q < *best)) best = q;
}

// The tightest quota on the way from `path` (a cgroup path, "/a/b") up to the
// hierarchy's root, mounted at `mount`. Inside a cgroup namespace the path
// the process sees may not exist under the mount; its ancestors are still
// tried, and the root is the container's own cgroup.
template <typename Read>
std::optional<double> tightest_quota(const std::string& mount, std::string path, Read read) {
  std::optional<double> best;
  while (true) {
    if (path.size() > 1 && path.back() == '/') path.pop_back();
    keep_tightest(best, read(mount + (path == "/" ? "" : path)));
    if (path.empty() || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos || slash == 0 ? "/" : path.substr(0, slash);
  }
  return best;
}

}  // namespace

std::optional<std::vector<int>> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::istringstream in(text);
  std::string range;
  // Bounded so a hostile file cannot make a huge list.
  constexpr long kMaxCpu = 1 << 20;
  while (std::getline(in, range, ',')) {
    while (!range.empty() && std::isspace(static_cast<unsigned char>(range.back()))) range.pop_back();
    if (range.empty()) continue;
    const size_t dash = range.find('-');
    char* end = nullptr;
    const long lo = std::strtol(range.c_str(), &end, 10);
    if (end == range.c_str() || lo < 0 || lo > kMaxCpu) return std::nullopt;
    long hi = lo;
    if (dash != std::string::npos) {
      if (end != range.c_str() + dash) return std::nullopt;
      const char* hi_text = range.c_str() + dash + 1;
      hi = std::strtol(hi_text, &end, 10);
      if (end == hi_text || hi < lo || hi > kMaxCpu) return std::nullopt;
    }
    if (*end != '\0') return std::nullopt;
    for (long c = lo; c <= hi; ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

std::vector<int> performance_cpus(std::span<const int> cpus, const CpuFacts& facts) {
  std::vector<int> all(cpus.begin(), cpus.end());
  // Both PMU directories exist only on hybrid CPUs.
  const auto big = read_line(facts.sys_devices_dir + "/cpu_core/cpus");
  if (!big || !read_line(facts.sys_devices_dir + "/cpu_atom/cpus")) return all;
  const auto listed = parse_cpu_list(*big);
  if (!listed) return all;
  const std::set<int> performance(listed->begin(), listed->end());
  std::vector<int> kept;
  for (int c : all)
    if (performance.count(c)) kept.push_back(c);
  return kept.empty() ? all : kept;
}

int count_physical_cores(std::span<const int> cpus, const std::string& sys_cpu_dir) {
  std::set<std::string> cores;
  for (int cpu : cpus) {
    const std::string topology = sys_cpu_dir + "/cpu" + std::to_string(cpu) + "/topology/";
    auto siblings = read_line(topology + "core_cpus_list");
    if (!siblings || siblings->empty()) siblings = read_line(topology + "thread_siblings_list");
    cores.insert(siblings && !siblings->empty() ? "core " + *siblings : "cpu " + std::to_string(cpu));
  }
  return static_cast<int>(cores.size());
}

std::optional<double> cgroup_cpu_quota(const CpuFacts& facts) {
  std::ifstream in(facts.proc_self_cgroup);
  std::optional<double> best;
  std::string line;
  while (std::getline(in, line)) {
    // hierarchy-id:controllers:path
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (id == "0" && controllers.empty()) {
      // cgroup v2: mounted at the root, or under "unified" on hybrid systems.
      for (const char* mount : {"", "/unified"})
        keep_tightest(best, tightest_quota(facts.cgroup_root + mount, path, quota_v2));
    } else {
      std::istringstream names(controllers);
      std::string name;
      bool cpu = false;
      while (std::getline(names, name, ',')) cpu = cpu || name == "cpu";
      if (!cpu) continue;
      // cgroup v1: the cpu controller's mount is named after its controllers
      // (a set, so a name listed twice is read once).
      for (const std::string& mount : std::set<std::string>{controllers, "cpu", "cpu,cpuacct"})
        keep_tightest(best, tightest_quota(facts.cgroup_root + "/" + mount, path, quota_v1));
    }
  }
  return best;
}

int default_thread_count(std::span<const int> allowed_cpus, const CpuFacts& facts) {
  int threads = count_physical_cores(performance_cpus(allowed_cpus, facts), facts.sys_cpu_dir);
  if (const auto quota = cgroup_cpu_quota(facts)) {
    // Within int range for any real quota; a huge one leaves the cores.
    const double cap = std::ceil(*quota);
    if (cap < threads) threads = static_cast<int>(cap);
  }
  return std::max(threads, 1);
}

int default_thread_count() {
  std::vector<int> cpus;
  // The mask grows until it holds every CPU the kernel knows.
  for (int n = 1024; n <= (1 << 20) && cpus.empty(); n *= 2) {
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set) break;
    const size_t bytes = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) {
      for (int c = 0; c < n; ++c)
        if (CPU_ISSET_S(c, bytes, set)) cpus.push_back(c);
      CPU_FREE(set);
      break;
    }
    CPU_FREE(set);
    if (errno != EINVAL) break;
  }
  if (cpus.empty()) {
    const unsigned hw = std::thread::hardware_concurrency();
    for (unsigned c = 0; c < std::max(hw, 1u); ++c) cpus.push_back(static_cast<int>(c));
  }
  return default_thread_count(cpus, CpuFacts{});
}

}  // namespace reprise
