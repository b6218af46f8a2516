// A private temporary directory that is removed, with everything in it, when
// its owner goes away. Tests and benchmarks write synthetic models into one;
// without it every test process left its files in /tmp (thousands of
// directories, tens of gigabytes, after a few hundred test runs).
#pragma once
#include <filesystem>
#include <string>

namespace reprise {

class ScratchDir {
 public:
  // Creates a fresh directory named `<temp>/<prefix>XXXXXX` (mkdtemp), so two
  // processes, or two owners in one process, never share one.
  explicit ScratchDir(const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // path() / name, as a string.
  std::string file(const std::string& name) const;

 private:
  std::filesystem::path path_;
};

// One directory per process and prefix, created on first use and removed when
// the process exits normally. Files in it may stay mapped until then: removing
// a mapped file on POSIX only unlinks its name.
const ScratchDir& process_scratch_dir(const std::string& prefix);

}  // namespace reprise
