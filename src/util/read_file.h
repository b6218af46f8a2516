// Reading a whole file that a user names (a template, a schema, a prompts
// file) into memory.
#pragma once
#include <optional>
#include <string>

namespace reprise {

// The file's bytes, or nullopt when it cannot be opened or read; callers
// say which option or input named it.
std::optional<std::string> read_whole_file(const std::string& path);

}  // namespace reprise
