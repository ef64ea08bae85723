#pragma once
// What the crash campaigns check after a kill, shared by the single-process and MPI ones.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace crash {

/// Reports a broken promise and ends the campaign.
[[noreturn]] inline void broken(int trial, const std::string& what) {
  std::fprintf(stderr, "crash campaign: after kill %d: %s\n", trial, what.c_str());
  std::exit(1);
}

/// The first file or directory a finished save would not leave (a temporary, an uncommitted
/// tag with something in it), or "" when there is none. An empty directory (a kill between a
/// tag's mkdir and its first file, or in the middle of removing a tag) is not counted: it
/// holds nothing, ckpt cannot tell it from a user's and leaves it, and saving into it works.
inline std::string leftover(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) return e.path().string();
    if (e.is_directory() && e.path().parent_path() == dir && !std::filesystem::exists(e.path() / "metadata.json") &&
        !std::filesystem::is_empty(e.path()))
      return e.path().string();
  }
  return "";
}

}  // namespace crash
