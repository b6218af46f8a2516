#include "util/scratch_dir.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "util/error.h"

namespace reprise {
namespace {

namespace fs = std::filesystem;

TEST(ScratchDir, IsPrivateAndTakesItsFilesWithItWhenItGoes) {
  fs::path kept;
  {
    ScratchDir a("reprise-scratch-test-");
    ScratchDir b("reprise-scratch-test-");
    EXPECT_NE(a.path(), b.path());
    ASSERT_TRUE(fs::is_directory(a.path()));
    EXPECT_EQ(a.path().parent_path(), fs::temp_directory_path());
    EXPECT_EQ(a.path().filename().string().rfind("reprise-scratch-test-", 0), 0u);
    fs::create_directories(a.path() / "nested");
    std::ofstream(a.file("model.gguf")) << "weights";
    std::ofstream((a.path() / "nested" / "more")) << "x";
    EXPECT_EQ(a.file("model.gguf"), (a.path() / "model.gguf").string());
    kept = a.path();
  }
  EXPECT_FALSE(fs::exists(kept));
}

TEST(ScratchDir, OnePerProcessAndPrefix) {
  const ScratchDir& first = process_scratch_dir("reprise-scratch-test-shared-");
  const ScratchDir& again = process_scratch_dir("reprise-scratch-test-shared-");
  const ScratchDir& other = process_scratch_dir("reprise-scratch-test-other-");
  EXPECT_EQ(&first, &again);
  EXPECT_NE(first.path(), other.path());
  EXPECT_TRUE(fs::is_directory(first.path()));
}

// The directory a process shares goes when the process exits: run in a forked
// child, which writes a file there and exits normally.
TEST(ScratchDir, AProcessDirectoryGoesWhenTheProcessExits) {
  const std::string prefix = "reprise-scratch-exit-" + std::to_string(::getpid()) + "-";
  auto leftovers = [&] {
    int n = 0;
    for (const auto& entry : fs::directory_iterator(fs::temp_directory_path()))
      if (entry.path().filename().string().rfind(prefix, 0) == 0) ++n;
    return n;
  };
  ASSERT_EQ(leftovers(), 0);
  EXPECT_EXIT(
      {
        const ScratchDir& dir = process_scratch_dir(prefix);
        std::ofstream(dir.file("model.gguf")) << "weights";
        std::exit(fs::exists(dir.file("model.gguf")) ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EQ(leftovers(), 0);
}

TEST(ScratchDir, ABadPrefixIsAClearError) {
  EXPECT_THROW(ScratchDir("no-such-parent-dir/x-"), Error);
}

}  // namespace
}  // namespace reprise
