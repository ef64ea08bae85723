#pragma once
// Runs one rank per thread of an in_process world (ckpt::in_process): how tests save and load
// at several ranks without mpirun.

#include <ckpt/in_process.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace test {

/// Calls body(comm, rank) on n threads, one per rank; returns each rank's error ("" if none).
template <class F>
std::vector<std::string> on_ranks(std::uint32_t n, F&& body) {
  auto world = std::make_shared<ckpt::in_process_world>(static_cast<int>(n));
  std::vector<std::string> errors(n);
  std::vector<std::thread> ranks;
  for (std::uint32_t r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        body(ckpt::in_process{world, static_cast<int>(r)}, r);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  return errors;
}

}  // namespace test
