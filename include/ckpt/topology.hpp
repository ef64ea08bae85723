#pragma once
/// @file topology.hpp
/// The parallel layout a checkpoint was saved with, recorded in metadata.json.

#include <cstdint>
#include <string>

#include <cereal/cereal.hpp>

namespace ckpt {

/// Sizes of the tensor-, pipeline- and data-parallel dimensions and the number of processes.
/// `world == tp * pp * dp` for the Megatron layout; a single process is all ones.
struct topology {
  std::uint32_t tp = 1;
  std::uint32_t pp = 1;
  std::uint32_t dp = 1;
  std::uint32_t world = 1;

  friend constexpr bool operator==(const topology&, const topology&) = default;

  template <class A>
  void serialize(A& ar) {
    ar(cereal::make_nvp("tp", tp), cereal::make_nvp("pp", pp), cereal::make_nvp("dp", dp),
       cereal::make_nvp("world", world));
  }
};

inline std::string to_string(const topology& t) {
  return "tp=" + std::to_string(t.tp) + " pp=" + std::to_string(t.pp) + " dp=" + std::to_string(t.dp) +
         " world=" + std::to_string(t.world);
}

}  // namespace ckpt
