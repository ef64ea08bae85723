#pragma once
// Which ranks share a machine: the memory tier keeps a node's files in that node's memory and
// replicates them to other nodes, so it must know the nodes. Ranks that report the same node
// name share a node; the name is the host's unless the caller gives one (tests emulate
// several nodes on one machine that way).

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <span>
#include <cstdint>
#include <string>
#include <vector>

#include "../error.hpp"

namespace ckpt::detail {

/// The job's nodes, numbered in the order of their lowest rank.
struct node_map {
  std::vector<std::uint32_t> node_of;   // rank -> node
  std::vector<std::string> names;       // node -> name
  std::vector<std::vector<int>> ranks;  // node -> its ranks, ascending

  std::uint32_t count() const noexcept { return static_cast<std::uint32_t>(names.size()); }
  /// The node's lowest rank: the one that speaks for the node's memory directory.
  int leader(std::uint32_t node) const { return ranks[node].front(); }
  bool leads(int rank) const { return leader(node_of[static_cast<std::size_t>(rank)]) == rank; }

  /// The nodes that keep replicas of what `node`'s ranks write: the next `r`, cyclically.
  std::vector<std::uint32_t> replica_nodes(std::uint32_t node, std::uint32_t r) const {
    std::vector<std::uint32_t> out;
    for (std::uint32_t k = 1; k <= r && k < count(); ++k) out.push_back((node + k) % count());
    return out;
  }

  /// The rank of node `to` that receives the files of rank `from`: the ranks of a node share
  /// the receiving by their position on their own nodes.
  int receiver(int from, std::uint32_t to) const {
    const auto& home = ranks[node_of[static_cast<std::size_t>(from)]];
    const auto pos = static_cast<std::size_t>(std::find(home.begin(), home.end(), from) - home.begin());
    return ranks[to][pos % ranks[to].size()];
  }
};

/// This host's name ("localhost" if the system will not say).
inline std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

/// Learns every rank's node (collective). `mine` is this rank's node name (empty: the host's).
template <class Comm>
node_map discover_nodes(Comm& comm, std::string mine) {
  if (mine.empty()) mine = host_name();
  if (mine.size() > 255) throw error(error_kind::invalid_argument, "node name longer than 255 bytes: " + mine.substr(0, 40) + "...");
  const auto all = comm.all_gather(std::as_bytes(std::span(mine.data(), mine.size())));
  node_map m;
  m.node_of.resize(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string name(reinterpret_cast<const char*>(all[r].data()), all[r].size());
    const auto it = std::find(m.names.begin(), m.names.end(), name);
    const auto node = static_cast<std::uint32_t>(it - m.names.begin());
    if (it == m.names.end()) {
      m.names.push_back(name);
      m.ranks.emplace_back();
    }
    m.node_of[r] = node;
    m.ranks[node].push_back(static_cast<int>(r));
  }
  return m;
}

}  // namespace ckpt::detail
