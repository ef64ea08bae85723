// The input of a fuzz target whose parser reads files (safetensors, .pt): written to an
// anonymous in-memory file and opened by its /proc/self/fd path. Nothing is left on disk
// however the process ends: libFuzzer may leave with _Exit (a signal, a timeout), which
// skips atexit handlers, and a named file in /tmp outlived many runs.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace ckpt_fuzz {

/// Writes `size` bytes into the process's one input file and returns the path to open it by.
/// The file is replaced whole at each call; a parser that opens it sees exactly these bytes.
inline const std::string& write_input(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create("ckpt-fuzz-input", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();  // the harness itself failed, not the parser
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) std::abort();
    done += static_cast<std::size_t>(n);
  }
  return path;
}

}  // namespace ckpt_fuzz
