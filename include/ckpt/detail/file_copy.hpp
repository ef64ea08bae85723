#pragma once
// Copies whole files from one rank's Storage to another rank's over a Transport: how the memory
// tier replicates each rank's shard file to peers on other nodes, and how a replaced node gets
// its files back from those peers.
//
// Every rank walks the same list of copies in the same order and takes part in the ones that
// name it, so a blocking send always meets its receive: the first copy not yet done has both
// its ranks at it. A file moves in pieces through one buffer of `piece_bytes` per rank, so
// memory stays bounded whatever the file's size. Before each piece the sender says whether it
// could read it; a sender that cannot (a missing or short file, an I/O error) says so, and why,
// and stops, and the receiver discards what it wrote. A receiver that cannot write still takes every piece,
// so the sender never waits forever. Errors are gathered at the end by the caller's collective.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"

namespace ckpt::detail {

/// One file to copy: from rank `from`'s Storage to rank `to`'s, under the same key.
struct file_copy {
  int from = 0;
  int to = 0;
  std::string key;
  std::uint64_t size = 0;
};

/// What one rank did in a round of copies.
struct copy_outcome {
  std::uint64_t bytes_sent = 0;
  std::uint64_t bytes_received = 0;
  std::optional<error> failure;  // the first copy this rank could not make
};

template <class Comm, class Store>
copy_outcome copy_files(Comm& comm, Store& store, const std::vector<file_copy>& plan, std::size_t piece_bytes) {
  copy_outcome out;
  const int me = comm.rank();
  piece_bytes = std::max<std::size_t>(piece_bytes, 4096);
  std::vector<std::byte> buf;
  const auto note = [&](const error& e) {
    if (!out.failure) out.failure = e;
  };
  for (const auto& c : plan) {
    if (c.from == c.to || (c.from != me && c.to != me)) continue;
    if (buf.empty()) buf.resize(piece_bytes);  // the one buffer: memory stays bounded
    std::byte status{0};
    if (c.from == me) {
      for (std::uint64_t at = 0; at < c.size;) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), c.size - at));
        std::span<std::byte> piece(buf.data(), n);
        status = std::byte{0};
        std::string why;
        try {
          store.read(c.key, at, piece);
        } catch (const error& e) {
          note(e);
          status = std::byte{1};
          why = e.what();
        }
        comm.send_host(std::span<const std::byte>(&status, 1), c.to);
        if (status != std::byte{0}) {
          // Why, for the receiver's error: the collective reports the lowest failing rank's.
          why.resize(std::min<std::size_t>(why.size(), 1024));
          const auto len = static_cast<std::uint64_t>(why.size());
          comm.send_host(std::as_bytes(std::span(&len, 1)), c.to);
          if (len) comm.send_host(std::as_bytes(std::span(why.data(), why.size())), c.to);
          break;
        }
        comm.send_host(piece, c.to);
        out.bytes_sent += n;
        at += n;
      }
    } else {
      std::optional<decltype(store.create(c.key))> w;
      bool failed = false;
      try {
        w.emplace(store.create(c.key));
      } catch (const error& e) {
        note(e);
        failed = true;
      }
      bool sender_failed = false;
      std::string why;  // the sender's reason, when it gives up
      for (std::uint64_t at = 0; at < c.size;) {
        const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), c.size - at));
        std::span<std::byte> piece(buf.data(), n);
        comm.recv_host(std::span<std::byte>(&status, 1), c.from);
        if (status != std::byte{0}) {
          std::uint64_t len = 0;
          comm.recv_host(std::as_writable_bytes(std::span(&len, 1)), c.from);
          if (len > 1024)
            throw error(error_kind::communication, "rank " + std::to_string(c.from) + " sent a reason of " + std::to_string(len) + " bytes");
          why.resize(static_cast<std::size_t>(len));
          if (len) comm.recv_host(std::as_writable_bytes(std::span(why.data(), why.size())), c.from);
          sender_failed = true;
          break;
        }
        comm.recv_host(piece, c.from);
        out.bytes_received += n;
        at += n;
        if (!failed) {
          try {
            w->write(piece);
          } catch (const error& e) {
            note(e);
            failed = true;
          }
        }
      }
      if (sender_failed)
        note(error(error_kind::io, "rank " + std::to_string(c.from) + " could not send " + c.key + ": " + why));
      if (!failed && !sender_failed) {
        try {
          w->sync();
          w->publish();
        } catch (const error& e) {
          note(e);
        }
      }
    }
  }
  return out;
}

}  // namespace ckpt::detail
