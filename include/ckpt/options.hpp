#pragma once
/// @file options.hpp
/// Options of `checkpointer`, `save` and `load`, and what `load` returns.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config.hpp"
#include "tensor.hpp"
#include "topology.hpp"

namespace ckpt {

/// Options fixed for the life of a checkpointer.
struct checkpointer_options {
  /// After each successful commit keep only the newest N committed tags (0: keep all). The tag
  /// `latest` names is never deleted, nor any directory ckpt did not write. When the save
  /// returns, the older tags are no longer committed (their metadata.json is gone); on a Storage
  /// that allows it (posix) their files are deleted on a background thread, which the next
  /// save, load, prune or `wait()` and the destructor wait for. Such a deletion's error is
  /// thrown by the next save once it has committed, or by `wait()`.
  std::size_t keep_last_n = 0;
  /// Tensors larger than this are split into chunks of about this size, each with its own
  /// checksum, so a load reads and verifies only the chunks it needs.
  std::uint64_t chunk_bytes = std::uint64_t{4} << 20;
  /// A tensor that is a slice of a larger one (a `shard_spec`) is also cut into about this many
  /// blocks along each dimension it is split on, blocks of at least 64 KiB, each its own chunk
  /// (a block of columns is stored contiguously). A load at another layout (tp 4 saved, tp 3
  /// loaded) then reads about a block beyond each end of the slice it needs instead of whole
  /// chunks: at 16, a few percent more than it needs. 1 cuts only by `chunk_bytes`. Blocks of
  /// columns are made where the DevicePolicy has a host view (host memory); elsewhere only
  /// blocks that are byte ranges of the slice (along its outermost dimension).
  std::uint32_t reshard_blocks = 16;
  /// Threads that encode and hash chunks while a save writes, read, verify and decode them
  /// during a load, and copy a save_async's snapshot of host tensors, the caller's thread among
  /// them (0: one per core, at most 8). They inherit the caller's CPU affinity: a rank pinned to
  /// one core runs them all on it.
  unsigned threads = 0;
  /// Host memory a save may hold in chunk buffers at once (staged and encoded chunks in flight);
  /// at least one chunk's worth is always used. Raw chunks of host tensors need none. An async
  /// save additionally snapshots the state it writes (see checkpointer::save_async).
  std::uint64_t buffer_bytes = std::uint64_t{256} << 20;
  /// Place each raw chunk of 1 MiB or more in its shard file as far into a 4 KiB block as the
  /// tensor's bytes lie into their memory page (docs/format.md, section 6.3), so that a load
  /// into memory that lies the same way (PyTorch's 64-byte aligned tensors, 64 bytes into their
  /// first page, at save and at load) reads them with O_DIRECT straight into the tensors,
  /// without the copy through an aligned buffer. It costs at most 4095 bytes of padding per
  /// such chunk. Turn it off for files whose chunks must start on block boundaries, as they did
  /// before 2026-12-05; every reader reads either (docs/performance.md, "Large chunks placed
  /// for their memory").
  bool place_for_memory = true;
  /// Nice value of a save_async's background threads (Linux, where nice is per thread): above 0
  /// they yield the CPU to the training loop and write with what is left. 0 keeps the caller's.
  int async_nice = 10;
  /// A root takes one writer at a time: the first save takes the root's writer lock (on
  /// Storages that have one, such as posix) and holds it until the checkpointer is destroyed.
  /// While another process or checkpointer holds it, a save fails with a `busy` error; with
  /// this set, it waits for the other writer to finish instead.
  bool wait_for_other_writer = false;
  /// The group `load_options::load_optimizer = false` skips.
  std::string optimizer_group = "optimizer";
};

/// Options of one save.
///
/// @code
/// cp.save(step, state, {.config = args, .validation_logits = ckpt::view(logits.data(), {8, 128})});
/// @endcode
struct save_options {
  /// The run's configuration; stored in metadata.json and compared on load.
  ckpt::config config{};
  /// The tag to save under; default "global_step{iteration}".
  std::optional<std::string> tag{};
  /// Logits of a fixed forward pass, stored so a load can check the restored model reproduces
  /// them (GPT-NeoX's checkpoint_validation_with_forward_pass). Any floating dtype.
  std::optional<tensor_ref> validation_logits{};
  /// Saving onto an existing committed tag other than the one `latest` names replaces it when
  /// true, and is an error when false.
  bool overwrite = true;
};

/// What a load does with per-rank values (RNG states, data cursors) when the checkpoint was
/// saved with another layout (tp, pp, dp or world size), so rank r of the save is not rank r now.
enum class topology_change {
  error,        ///< refuse the load (the default: silently mixing RNG streams breaks exact resume)
  keep_live,    ///< leave every value as it is in the live state; listed in load_result::kept_live
  from_rank_0,  ///< every rank takes rank 0's saved value (for values that are equal on all ranks)
};

/// Options of one load.
///
/// @code
/// auto r = cp.load(state, {.iteration = 200, .load_optimizer = false, .strict = false});
/// @endcode
struct load_options {
  /// Load this tag; when neither `tag` nor `iteration` is set, the tag `latest` names.
  std::optional<std::string> tag{};
  /// Load the tag of this iteration ("global_step{N}", or any committed tag saved at N).
  std::optional<std::uint64_t> iteration{};
  /// False skips the optimizer group (`checkpointer_options::optimizer_group`).
  bool load_optimizer = true;
  /// Further groups (full names) to skip.
  std::vector<std::string> skip_groups{};
  /// Strict: a tensor or value missing from the checkpoint, or stored but not in the live
  /// state, is an error naming all of them. Non-strict: they are listed in `load_result`.
  bool strict = true;
  /// The live configuration, compared with the saved one; every differing key is reported.
  std::optional<ckpt::config> config{};
  /// Keys left out of the comparison (e.g. the learning rate when fine-tuning).
  std::vector<std::string> ignore_config_keys{};
  /// False skips the config comparison even when `config` is set.
  bool check_config = true;
  /// Freshly computed logits to compare with those stored at save (see save_options).
  std::optional<tensor_ref> validation_logits{};
  double rtol = 1e-5;
  double atol = 1e-8;
  /// Per-rank values when the layout changed since the save (see topology_change).
  topology_change on_topology_change = topology_change::error;
};

/// A committed tag, as `checkpointer::tags()` lists them.
struct tag_info {
  std::string tag;
  std::uint64_t iteration = 0;
  bool latest = false;  ///< the tag `latest` names
};

/// What a load restored.
struct load_result {
  std::string tag{};
  std::uint64_t iteration = 0;
  ckpt::config config{};           ///< the configuration stored at save
  ckpt::topology topology;       ///< the topology it was saved with
  std::vector<std::string> missing{};     ///< live names absent from the checkpoint (non-strict)
  std::vector<std::string> unexpected{};  ///< stored names absent from the live state (non-strict)
  std::vector<std::string> skipped{};     ///< stored names left alone because their group was skipped
  std::vector<std::string> kept_live{}; ///< values left as they were (topology_change::keep_live)
  std::uint64_t bytes_read = 0;         ///< bytes read from storage
  /// memory_tier: where the tag came from ("memory" or "durable"; empty for a plain load)
  std::string tier{};
  /// memory_tier: how it was put together, one line each: files a rank took from a peer's
  /// replica, copies found lost, a memory tag that could not be restored and why
  std::vector<std::string> recovery{};
};

}  // namespace ckpt
