#pragma once
/// @file memory_tier.hpp
/// `ckpt::memory_tier`: checkpoints kept in the host memory of the job's nodes (a directory
/// on a tmpfs such as /dev/shm, which outlives the training process), each rank's files
/// replicated to peers on other nodes, for a restart in seconds after a process or a whole
/// node is lost. Saved with the same format, checksums and commit protocol as any checkpoint;
/// saved often, next to a durable checkpointer (disk, S3) saved rarely. docs/tiers.md tells
/// the whole story.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "checkpointer.hpp"
#include "concepts.hpp"
#include "detail/collective.hpp"
#include "detail/file_copy.hpp"
#include "detail/held_commit.hpp"
#include "detail/nodes.hpp"
#include "detail/tag_store.hpp"
#include "error.hpp"
#include "impl/checkpointer.ipp"
#include "names.hpp"
#include "options.hpp"
#include "posix.hpp"
#include "save_handle.hpp"

namespace ckpt {

/// How a memory tier keeps its checkpoints.
struct memory_tier_options {
  /// Committed tags kept on each node (older ones are deleted after each save). At least 1.
  std::size_t keep = 2;
  /// Copies of each rank's files on other nodes, besides the one on its own node. A job must
  /// have more nodes than this (a job on one node: 0).
  std::uint32_t replicas = 1;
  /// This rank's node: ranks that give the same name share a node and its memory directory.
  /// Empty: the host's name. Tests emulate several nodes on one machine by naming them.
  std::string node{};
  /// Files move to peers in pieces of this many bytes, through one buffer per rank.
  std::size_t piece_bytes = std::size_t{1} << 20;
  /// Chunking, threads and buffers of the saves and loads (`keep_last_n` is ignored: `keep`
  /// rules).
  checkpointer_options checkpointer{};
};

/// What the last save into the memory tier did on this rank (wall-clock seconds).
struct memory_tier_save_report {
  double write_seconds = 0;      ///< planning, writing this rank's file, merging (the checkpointer's save)
  double replicate_seconds = 0;  ///< copying files to and from peers
  double commit_seconds = 0;     ///< publishing metadata.json and `latest` on every node, retention
  std::uint64_t bytes_sent = 0;      ///< replica bytes this rank sent
  std::uint64_t bytes_received = 0;  ///< replica bytes this rank received and stored
};

/// What the last load from the memory tier did on this rank (wall-clock seconds).
struct memory_tier_load_report {
  double survey_seconds = 0;    ///< learning which tags each node holds, choosing one
  double transfer_seconds = 0;  ///< metadata and files brought from peers to nodes that lack them
  double load_seconds = 0;      ///< the load itself, every byte verified
  std::uint64_t bytes_received = 0;  ///< file bytes this rank received from peers
};

/// A fast tier of checkpoints in the memory of the job's nodes, replicated across nodes.
///
/// Each node has its own directory (its Storage, normally `ckpt::posix` on /dev/shm): the
/// files of the node's ranks go there, and so do replicas of the files of the ranks on the
/// next `replicas` nodes. A tag is committed only once every rank's file and every replica is
/// in place: then metadata.json and `latest` are written on every node (before, they are held
/// back in memory). So every committed tag survives the loss of any `replicas` nodes.
///
/// `load` finds the newest tag whose files are all somewhere in the job's memory, brings to
/// each node the files its ranks read (from a peer when its node lost them, e.g. a replaced
/// node), then loads as any checkpoint loads, every byte checksum-verified. `load_or` falls
/// back to a durable checkpointer when memory cannot give a tag at least as new as the durable
/// tier's `latest`. `load_result::tier` and `load_result::recovery` say what was chosen.
///
/// The policy's communicator must be a Transport (ckpt::mpi, ckpt::in_process); every call is
/// collective.
///
/// @code
/// ckpt::memory_tier<ckpt::megatron<ckpt::mpi>> fast{{.tp = 2}, ckpt::posix("/dev/shm/run1"), {.keep = 2, .replicas = 1}};
/// ckpt::checkpointer<ckpt::megatron<ckpt::mpi>, ckpt::posix> disk{{.tp = 2}, "/ckpt/run1"};
/// std::uint64_t step = fast.load_or(disk, model).iteration;   // memory if it can, else disk
/// for (; step < steps; ++step) {
///   train_step(model);
///   if (step % 10 == 0) fast.save(step, model);
///   if (step % 500 == 0) disk.save(step, model);
/// }
/// @endcode
template <class Policy, class Store = posix, class Enc = raw, class Device = host_copy>
class memory_tier {
  using node_store = detail::held_commit<Store>;
  using inner_type = checkpointer<Policy, node_store, Enc, Device>;
  using comm_type = std::remove_cvref_t<decltype(std::declval<Policy&>().communicator())>;
  static_assert(Transport<comm_type>,
                "ckpt: memory_tier copies files between ranks over the policy's communicator, which must be a Transport "
                "(ckpt::mpi, ckpt::in_process, ckpt::cuda::nccl)");

 public:
  /// Learns the nodes (collective). Throws `invalid_argument` when the job has too few nodes
  /// for `replicas` or `keep` is 0.
  memory_tier(Policy policy, Store store, memory_tier_options options = {}, Enc codec = {}, Device device = {})
      : options_(std::move(options)),
        inner_(std::move(policy), node_store(std::move(store)), inner_options(options_), std::move(codec), std::move(device)) {
    auto& comm = inner_.policy().communicator();
    nodes_ = detail::discover_nodes(comm, options_.node);
    if (options_.keep == 0) throw error(error_kind::invalid_argument, "memory_tier: keep must be at least 1");
    if (options_.replicas >= nodes_.count())
      throw error(error_kind::invalid_argument, "memory_tier: replicas=" + std::to_string(options_.replicas) + " needs at least " +
                                                    std::to_string(options_.replicas + 1) + " nodes; this job has " +
                                                    std::to_string(nodes_.count()) + " (ranks name their node with memory_tier_options::node)");
  }
  ~memory_tier() { finish_pending(false); }
  memory_tier(const memory_tier&) = delete;
  memory_tier& operator=(const memory_tier&) = delete;

  /// Saves `state` into memory, replicates every rank's file to its peers, then commits the
  /// tag on every node and drops the oldest beyond `keep` (collective). On error no node has
  /// the new tag committed and the previous tags still load.
  template <class T>
  void save(std::uint64_t iteration, const T& state, const save_options& opts = {}) {
    finish_pending(true);
    const auto tag = begin_save(iteration, opts);
    const auto t0 = clock::now();
    inner_.save(iteration, state, opts);
    last_.write_seconds = seconds_since(t0);
    replicate_and_commit(tag);
  }

  /// As `save`, but returns once the state is snapshotted: writing, replication and the commit
  /// go on in the background (the communicator must allow it, as for checkpointer::save_async).
  template <class T>
  save_handle save_async(std::uint64_t iteration, const T& state, const save_options& opts = {}) {
    background_.settle(true);  // its thread is joined by the next one's
    const auto tag = begin_save(iteration, opts);
    const auto t0 = clock::now();
    auto written = inner_.save_async(iteration, state, opts);
    auto st = std::make_shared<detail::async_save_state>();
    background_.start(st, [this, tag, st, written, t0] {
      std::exception_ptr failure;
      try {
        written.wait();
        last_.write_seconds = seconds_since(t0);
        replicate_and_commit(tag);
      } catch (...) {
        failure = std::current_exception();
      }
      st->finish(failure);
    });
    return save_handle(st);
  }

  /// Waits for a save_async in flight; throws its error if no handle's `wait()` has.
  void wait() { finish_pending(true); }

  /// Restores the newest tag the job's memory holds completely (collective); `not_found`
  /// when there is none. `opts.tag` or `opts.iteration` ask for a given one.
  template <class T>
  load_result load(T& state, const load_options& opts = {}) {
    finish_pending(true);
    const auto found = survey(opts);
    if (!found.chosen) {
      std::string why;
      for (const auto& n : found.notes) why += "; " + n;
      throw error(error_kind::not_found, "memory tier: no tag can be restored from the nodes' memory" +
                                             (why.empty() ? std::string(" (none is committed)") : why));
    }
    return restore(state, opts, found);
  }

  /// Restores from memory when it holds a tag at least as new as `durable`'s `latest`, and
  /// otherwise, or when restoring from memory fails (a damaged replica, a file lost on every
  /// node), loads `durable`'s `latest` (collective). `durable` is any checkpointer.
  template <class Durable, class T>
  load_result load_or(Durable& durable, T& state, const load_options& opts = {}) {
    finish_pending(true);
    const auto found = survey(opts);
    auto notes = found.notes;
    std::optional<std::uint64_t> durable_iteration;
    detail::collective(comm(), [&] {
      for (const auto& t : durable.tags())
        if (t.latest) durable_iteration = t.iteration;
    });
    if (found.chosen && (!durable_iteration || found.iteration >= *durable_iteration)) {
      try {
        return restore(state, opts, found);
      } catch (const error& e) {
        notes.push_back("memory: " + found.tag + " could not be restored: " + e.what());
      }
    } else if (found.chosen) {
      notes.push_back("memory: its newest complete tag " + found.tag + " is older than the durable tier's latest (iteration " +
                      std::to_string(*durable_iteration) + ")");
    }
    auto r = durable.load(state, opts);
    r.tier = "durable";
    r.recovery = std::move(notes);
    r.recovery.push_back("loaded " + r.tag + " from the durable tier");
    return r;
  }

  /// See checkpointer::should_save and ckpt::preemption.
  bool should_save(std::uint64_t step, std::uint64_t every = 0) { return inner_.should_save(step, every); }
  bool preempted() const noexcept { return inner_.preempted(); }

  /// Bytes this node's directory holds (every tag, committed or not, and `latest`).
  std::uint64_t bytes_held() const { return bytes_under(""); }
  /// The committed tags in this node's directory, oldest first.
  std::vector<tag_info> tags() const { return detail::tag_store<Store>(const_cast<Store&>(base())).tags(); }

  /// The nodes as the tier sees them: each rank's node, and the nodes' names.
  const std::vector<std::string>& node_names() const noexcept { return nodes_.names; }
  std::uint32_t node_of(int rank) const { return nodes_.node_of.at(static_cast<std::size_t>(rank)); }

  /// What the last save did on this rank.
  const memory_tier_save_report& last_save() const noexcept { return last_; }
  /// What the last load from memory did on this rank.
  const memory_tier_load_report& last_load() const noexcept { return last_load_; }

  Policy& policy() noexcept { return inner_.policy(); }
  Store& storage() noexcept { return inner_.storage().base(); }

 private:
  using clock = std::chrono::steady_clock;
  static double seconds_since(clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); }

  static checkpointer_options inner_options(const memory_tier_options& o) {
    auto c = o.checkpointer;
    c.keep_last_n = 0;  // the tier applies `keep` on every node once the tag is committed everywhere
    return c;
  }

  comm_type& comm() { return inner_.policy().communicator(); }
  Store& base() { return inner_.storage().base(); }
  const Store& base() const { return const_cast<memory_tier*>(this)->inner_.storage().base(); }
  int rank() { return comm().rank(); }
  bool leads() { return nodes_.leads(rank()); }

  /// Before any file is written: every node's directory gets the tag prepared as rank 0's
  /// checkpointer prepares its own (a crashed save's leftovers removed, ckpt's marker written).
  std::string begin_save(std::uint64_t iteration, const save_options& opts) {
    const auto tag = opts.tag.value_or(default_tag(iteration));
    (void)inner_.storage().take_held();  // what a failed save held is not this save's
    last_ = {};
    detail::collective(comm(), [&] {
      validate_tag(tag);
      if (leads() && nodes_.node_of[static_cast<std::size_t>(rank())] != nodes_.node_of[0])
        detail::tag_store<Store>(base()).prepare(tag, opts.overwrite);
    });
    return tag;
  }

  /// After the checkpointer's save: replicas to peers, then the held commit on every node,
  /// then retention on every node.
  void replicate_and_commit(const std::string& tag) {
    auto& c = comm();
    const auto t0 = clock::now();
    std::string mine;
    detail::collective(c, [&] {
      if (const auto f = inner_.policy().shard_file()) {
        const auto key = detail::join_key(tag, *f);
        const auto size = base().size(key);
        if (!size) throw error(error_kind::io, base().describe(key) + " is missing after the save that wrote it");
        mine = key + '\t' + std::to_string(*size);
      }
    });
    const auto written = c.all_gather(std::as_bytes(std::span(mine.data(), mine.size())));
    std::vector<detail::file_copy> plan;
    for (std::size_t r = 0; r < written.size(); ++r) {
      const std::string line(reinterpret_cast<const char*>(written[r].data()), written[r].size());
      if (line.empty()) continue;
      const auto tab = line.find('\t');
      const auto key = line.substr(0, tab);
      const auto size = std::stoull(line.substr(tab + 1));
      for (const auto m : nodes_.replica_nodes(nodes_.node_of[r], options_.replicas))
        plan.push_back({static_cast<int>(r), nodes_.receiver(static_cast<int>(r), m), key, size});
    }
    detail::collective(c, [&] {
      const auto got = detail::copy_files(c, base(), plan, options_.piece_bytes);
      last_.bytes_sent = got.bytes_sent;
      last_.bytes_received = got.bytes_received;
      if (got.failure) throw error(got.failure->kind(), "replicating " + tag + ": " + got.failure->what());
    });
    last_.replicate_seconds = seconds_since(t0);
    const auto t1 = clock::now();
    // The commit rank 0's checkpointer held back: chunk_map.bin, metadata.json, `latest`.
    std::vector<std::byte> held;
    if (c.rank() == 0) held = frame(inner_.storage().take_held());
    if (c.size() > 1) c.broadcast(held, 0);
    detail::collective(c, [&] {
      if (leads())
        for (const auto& f : unframe(held)) write_file(f.key, f.bytes);
    });
    detail::collective(c, [&] {
      if (leads()) {
        detail::tag_store<Store> tags(base());
        tags.remove(tags.retention_victims(tag, options_.keep));
      }
    });
    last_.commit_seconds = seconds_since(t1);
  }

  // --- recovery ------------------------------------------------------------------------------

  struct stored_file {
    std::string path;  // in the tag
    std::uint64_t size = 0;
    std::uint32_t rank = 0;
  };
  struct candidate {
    std::string tag;
    std::uint64_t iteration = 0;
    std::vector<stored_file> files;            // as metadata.json lists them
    std::vector<std::uint32_t> with_metadata;  // nodes where the tag is committed
    std::vector<std::vector<bool>> on_node;    // file -> node -> holds it (right size)
  };
  struct survey_result {
    bool chosen = false;
    std::string tag;
    std::uint64_t iteration = 0;
    candidate picked;
    std::vector<std::string> notes;
  };

  /// What the job's memory holds (collective): every node's committed tags and which of their
  /// files each node has; the newest tag whose files are all somewhere.
  survey_result survey(const load_options& opts) {
    last_load_ = {};
    const auto t0 = clock::now();
    auto& c = comm();
    // Round 1: each node's committed tags and their files, as its metadata.json lists them.
    std::string listing;
    detail::collective(c, [&] {
      if (!leads()) return;
      detail::tag_store<Store> tags(base());
      for (const auto& t : tags.tags()) {
        std::optional<detail::metadata> md;
        try {
          md = std::move(*tags.read(t.tag).parsed);
        } catch (const error& e) {
          if (e.kind() != error_kind::corrupt) throw;
          continue;  // this node cannot vouch for the tag; another may
        }
        listing += "T\t" + t.tag + '\t' + std::to_string(md->iteration) + '\n';
        for (const auto& f : md->files)
          listing += "F\t" + f.path + '\t' + std::to_string(f.size) + '\t' + std::to_string(f.rank) + '\n';
      }
    });
    const auto listings = c.all_gather(std::as_bytes(std::span(listing.data(), listing.size())));
    std::map<std::string, candidate> by_tag;
    for (std::size_t r = 0; r < listings.size(); ++r) {
      if (!nodes_.leads(static_cast<int>(r))) continue;
      const auto node = nodes_.node_of[r];
      candidate* cur = nullptr;
      bool fresh = false;
      for (const auto& line : split_lines(listings[r])) {
        const auto f = split_tabs(line);
        if (f.size() == 3 && f[0] == "T") {
          auto [it, inserted] = by_tag.try_emplace(f[1]);
          cur = &it->second;
          fresh = inserted;
          cur->tag = f[1];
          cur->iteration = std::stoull(f[2]);
          cur->with_metadata.push_back(node);
        } else if (f.size() == 4 && f[0] == "F" && cur && fresh) {
          cur->files.push_back({f[1], std::stoull(f[2]), static_cast<std::uint32_t>(std::stoul(f[3]))});
        }
      }
    }
    std::vector<candidate> cands;
    for (auto& [tag, cand] : by_tag) {
      if (opts.tag && tag != *opts.tag) continue;
      if (opts.iteration && cand.iteration != *opts.iteration) continue;
      cands.push_back(std::move(cand));
    }
    std::sort(cands.begin(), cands.end(), [](const candidate& a, const candidate& b) {
      return a.iteration != b.iteration ? a.iteration > b.iteration : a.tag > b.tag;
    });
    // Round 2: which of those files each node holds, at the size metadata.json records.
    std::string have;
    detail::collective(c, [&] {
      if (!leads()) return;
      for (const auto& cand : cands)
        for (const auto& f : cand.files) {
          const auto size = base().size(detail::join_key(cand.tag, f.path));
          have += (size && *size == f.size) ? '1' : '0';
        }
    });
    const auto haves = c.all_gather(std::as_bytes(std::span(have.data(), have.size())));
    survey_result out;
    std::size_t at = 0;
    for (auto& cand : cands) {
      cand.on_node.assign(cand.files.size(), std::vector<bool>(nodes_.count(), false));
      for (std::size_t i = 0; i < cand.files.size(); ++i, ++at)
        for (std::uint32_t n = 0; n < nodes_.count(); ++n) {
          const auto& h = haves[static_cast<std::size_t>(nodes_.leader(n))];
          cand.on_node[i][n] = at < h.size() && h[at] == std::byte{'1'};
        }
    }
    for (auto& cand : cands) {
      std::vector<std::string> lost;
      for (std::size_t i = 0; i < cand.files.size(); ++i)
        if (std::none_of(cand.on_node[i].begin(), cand.on_node[i].end(), [](bool b) { return b; }))
          lost.push_back(cand.files[i].path);
      if (!lost.empty()) {
        out.notes.push_back("memory: " + cand.tag + " cannot be restored: no node holds " + detail::join(lost, 4));
        continue;
      }
      out.chosen = true;
      out.tag = cand.tag;
      out.iteration = cand.iteration;
      // Copies that should exist and do not: reported, never skipped silently.
      for (std::size_t i = 0; i < cand.files.size(); ++i) {
        const auto& f = cand.files[i];
        if (f.rank >= nodes_.node_of.size()) continue;
        auto expected = nodes_.replica_nodes(nodes_.node_of[f.rank], options_.replicas);
        expected.insert(expected.begin(), nodes_.node_of[f.rank]);
        std::size_t left = 0;
        for (std::uint32_t n = 0; n < nodes_.count(); ++n) left += cand.on_node[i][n] ? 1 : 0;
        for (const auto n : expected)
          if (!cand.on_node[i][n])
            out.notes.push_back("memory: " + cand.tag + "/" + f.path + " was lost on node '" + nodes_.names[n] + "' (" +
                                std::to_string(left) + " cop" + (left == 1 ? "y" : "ies") + " left)");
      }
      out.picked = std::move(cand);
      break;
    }
    last_load_.survey_seconds = seconds_since(t0);
    return out;
  }

  /// Brings a surveyed tag's metadata and files to every node that lacks them, then loads.
  template <class T>
  load_result restore(T& state, const load_options& opts, const survey_result& found) {
    auto& c = comm();
    const auto t0 = clock::now();
    const auto& cand = found.picked;
    auto notes = found.notes;
    // The metadata, from the first node that has the tag committed, to every node that lacks it.
    const int root = nodes_.leader(cand.with_metadata.front());
    std::vector<std::byte> md_files;
    detail::collective(c, [&] {
      if (c.rank() != root) return;
      auto bytes = detail::tag_store<Store>(base()).read(cand.tag);
      std::vector<detail::held_file> files;
      files.push_back({detail::join_key(cand.tag, bytes.parsed->chunk_map.path), to_bytes(bytes.chunk_map)});
      files.push_back({detail::metadata_key(cand.tag), to_bytes(bytes.metadata_json)});
      md_files = frame(files);
    });
    if (c.size() > 1) c.broadcast(md_files, root);
    detail::collective(c, [&] {
      const auto node = nodes_.node_of[static_cast<std::size_t>(c.rank())];
      if (!leads() || std::count(cand.with_metadata.begin(), cand.with_metadata.end(), node)) return;
      detail::tag_store<Store>(base()).mark(cand.tag);
      for (const auto& f : unframe(md_files)) write_file(f.key, f.bytes);
    });
    // The files each rank reads, and those it wrote: from a peer when its node lacks them.
    auto o = opts;
    o.tag = cand.tag;
    o.iteration.reset();
    auto need = inner_.files_to_read(state, o);
    for (const auto& f : cand.files)
      if (f.rank == static_cast<std::uint32_t>(c.rank())) need.push_back(detail::join_key(cand.tag, f.path));
    const auto my_node = nodes_.node_of[static_cast<std::size_t>(c.rank())];
    std::string missing;
    std::set<std::string> asked;
    for (const auto& key : need) {
      const auto i = file_index(cand, key);
      if (i && !cand.on_node[*i][my_node] && asked.insert(key).second) missing += key + '\n';
    }
    const auto all_missing = c.all_gather(std::as_bytes(std::span(missing.data(), missing.size())));
    std::vector<detail::file_copy> plan;
    std::set<std::pair<std::uint32_t, std::string>> coming;  // (node, key): one copy per node
    for (std::size_t r = 0; r < all_missing.size(); ++r) {
      const auto node = nodes_.node_of[r];
      for (const auto& key : split_lines(all_missing[r])) {
        if (!coming.insert({node, key}).second) continue;
        const auto i = *file_index(cand, key);
        std::uint32_t from = 0;
        while (!cand.on_node[i][from]) ++from;  // the survey found at least one holder
        // The holder node's ranks share the sending (a rank at the receiver's position on its
        // own node), so copies to different ranks run side by side.
        const int sender = nodes_.receiver(static_cast<int>(r), from);
        plan.push_back({sender, static_cast<int>(r), key, cand.files[i].size});
        notes.push_back("memory: rank " + std::to_string(r) + " (node '" + nodes_.names[node] + "') took " + key + " from rank " +
                        std::to_string(sender) + " on node '" + nodes_.names[from] + "'");
      }
    }
    detail::collective(c, [&] {
      const auto got = detail::copy_files(c, base(), plan, options_.piece_bytes);
      last_load_.bytes_received = got.bytes_received;
      if (got.failure) throw error(got.failure->kind(), "restoring " + cand.tag + " from peers: " + got.failure->what());
    });
    last_load_.transfer_seconds = seconds_since(t0);
    const auto t1 = clock::now();
    auto r = inner_.load(state, o);
    last_load_.load_seconds = seconds_since(t1);
    r.tier = "memory";
    r.recovery = std::move(notes);
    r.recovery.insert(r.recovery.begin(), "loaded " + cand.tag + " from memory");
    return r;
  }

  static std::optional<std::size_t> file_index(const candidate& cand, const std::string& key) {
    for (std::size_t i = 0; i < cand.files.size(); ++i)
      if (detail::join_key(cand.tag, cand.files[i].path) == key) return i;
    return std::nullopt;
  }

  // --- small helpers -------------------------------------------------------------------------

  void write_file(const std::string& key, const std::vector<std::byte>& bytes) {
    auto w = base().create(key);
    w.write(bytes);
    w.sync();
    w.publish();
  }

  std::uint64_t bytes_under(const std::string& prefix, int depth = 0) const {
    std::uint64_t total = 0;
    for (const auto& name : base().list(prefix)) {
      const auto key = detail::join_key(prefix, name);
      if (const auto size = base().size(key))
        total += *size;
      else if (depth < 4)
        total += bytes_under(key, depth + 1);
    }
    return total;
  }

  static std::vector<std::byte> to_bytes(std::string_view s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    return {p, p + s.size()};
  }

  /// Files as one message: for each, the key's length, the key, the size, the bytes.
  static std::vector<std::byte> frame(const std::vector<detail::held_file>& files) {
    std::vector<std::byte> out;
    const auto put = [&](std::uint64_t v) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(v >> (8 * i)));
    };
    for (const auto& f : files) {
      put(f.key.size());
      const auto k = to_bytes(f.key);
      out.insert(out.end(), k.begin(), k.end());
      put(f.bytes.size());
      out.insert(out.end(), f.bytes.begin(), f.bytes.end());
    }
    return out;
  }
  static std::vector<detail::held_file> unframe(const std::vector<std::byte>& in) {
    std::vector<detail::held_file> out;
    std::size_t at = 0;
    const auto get = [&]() {
      if (in.size() - at < 8) throw error(error_kind::communication, "memory_tier: a truncated message of held files");
      std::uint64_t v = 0;
      for (int i = 0; i < 8; ++i) v |= std::to_integer<std::uint64_t>(in[at + static_cast<std::size_t>(i)]) << (8 * i);
      at += 8;
      if (v > in.size() - at) throw error(error_kind::communication, "memory_tier: a truncated message of held files");
      return static_cast<std::size_t>(v);
    };
    while (at < in.size()) {
      detail::held_file f;
      const auto kn = get();
      f.key.assign(reinterpret_cast<const char*>(in.data() + at), kn);
      at += kn;
      const auto bn = get();
      f.bytes.assign(in.begin() + static_cast<std::ptrdiff_t>(at), in.begin() + static_cast<std::ptrdiff_t>(at + bn));
      at += bn;
      detail::check_key(f.key);
      out.push_back(std::move(f));
    }
    return out;
  }

  static std::vector<std::string> split_lines(const std::vector<std::byte>& b) {
    std::vector<std::string> out;
    std::string_view s(reinterpret_cast<const char*>(b.data()), b.size());
    while (!s.empty()) {
      const auto nl = s.find('\n');
      out.emplace_back(s.substr(0, nl));
      if (nl == std::string_view::npos) break;
      s.remove_prefix(nl + 1);
    }
    return out;
  }
  static std::vector<std::string> split_tabs(const std::string& line) {
    std::vector<std::string> out;
    std::size_t at = 0;
    for (;;) {
      const auto tab = line.find('\t', at);
      out.push_back(line.substr(at, tab - at));
      if (tab == std::string::npos) break;
      at = tab + 1;
    }
    return out;
  }

  void finish_pending(bool rethrow) { background_.finish(rethrow); }

  memory_tier_options options_;
  inner_type inner_;
  detail::node_map nodes_;
  memory_tier_save_report last_;
  memory_tier_load_report last_load_;
  detail::background_save background_;
};

}  // namespace ckpt
