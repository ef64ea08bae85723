#pragma once
// Collective steps: every rank runs a step, then all ranks learn whether any rank failed and
// throw the same error. This is what makes "if any rank fails, no rank commits" hold.

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"

namespace ckpt::detail {

/// A string's bytes, as the Communicator sends them.
template <class Alloc>
std::span<const std::byte> as_bytes(const std::basic_string<char, std::char_traits<char>, Alloc>& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

inline std::vector<std::byte> encode_status(const error* e) {
  std::vector<std::byte> b;
  if (!e) return b;
  b.push_back(static_cast<std::byte>(e->kind()));
  const std::string_view m = e->what();
  for (char c : m) b.push_back(static_cast<std::byte>(c));
  return b;
}

/// Runs `step` on this rank; if it failed on any rank, throws on every rank the error of the
/// lowest failing rank (prefixed with "rank N: " in a job of several processes).
template <class Comm, class F>
void collective(Comm& comm, F&& step) {
  std::optional<error> mine;
  try {
    step();
  } catch (const error& e) {
    mine = e;
  } catch (const std::bad_alloc&) {
    mine = error(error_kind::io, "out of memory");
  } catch (const std::exception& e) {
    mine = error(error_kind::io, e.what());
  }
  if (comm.size() == 1) {
    if (mine) throw *mine;
    return;
  }
  const std::uint64_t failed = comm.all_reduce_max(mine ? 1 : 0);
  if (!failed) return;
  const auto status = encode_status(mine ? &*mine : nullptr);
  const auto all = comm.all_gather(status);
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const auto kind = static_cast<error_kind>(all[r][0]);
    std::string msg(reinterpret_cast<const char*>(all[r].data()) + 1, all[r].size() - 1);
    throw error(kind, "rank " + std::to_string(r) + ": " + msg);
  }
  throw error(error_kind::communication, "a rank reported a failure but sent no error");
}

}  // namespace ckpt::detail
