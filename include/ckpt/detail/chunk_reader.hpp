#pragma once
// The load stage that moves bytes: the chunks that overlap the wanted tensors are read,
// verified against their checksums and decoded, then copied into the tensors through the
// DevicePolicy. The counterpart of shard_io.hpp's shard writer. The checkpointer's load, its
// scatter to other ranks, its validation logits and ckpt::reader all read through it, with
// metadata they opened once.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"
#include "../names.hpp"
#include "../tensor.hpp"
#include "../zstd.hpp"  // ckpt's own codecs: decode_builtin
#include "chunk_details.hpp"  // offset_in_stored
#include "hash.hpp"
#include "metadata.hpp"
#include "pipeline.hpp"
#include "region.hpp"
#include "shard_io.hpp"
#include "staging_buffer.hpp"
#include "table_memory.hpp"

namespace ckpt::detail {

/// A live tensor to fill from the stored tensor of the same name.
struct tensor_load {
  const tensor_meta* stored;
  const std::string* name;
  const tensor_ref* ref;
};

/// Checks a shard file's size, header, trailer and footer index the first time a load touches
/// it (the `Verify` that `chunk_reader::load` calls before reading a file's chunks).
template <class Store>
class file_verifier {
 public:
  file_verifier(const Store& storage, const metadata& md)
      : storage_(&storage), md_(&md), checked_(md.files.size(), false) {}

  void operator()(std::uint32_t f) {
    if (checked_[f]) return;
    const auto& fm = md_->files[f];
    verify_shard_file(*storage_, file_key(*md_, f), fm.size, fm.index_xxh3);
    checked_[f] = true;
    bytes_read_ += header_used + trailer_bytes;
  }

  /// Marks file f as checked already (its footer was read and checked elsewhere).
  void checked(std::uint32_t f) { checked_[f] = true; }

  /// Bytes read to check files so far.
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  const Store* storage_;
  const metadata* md_;
  std::vector<bool> checked_;
  std::uint64_t bytes_read_ = 0;
};

/// Reads chunks of one tag's shard files from `Store`, decoding them with ckpt's codecs and
/// `Enc`, on up to `threads` workers (1 where the Storage does not take concurrent reads).
template <class Store, class Enc>
class chunk_reader {
 public:
  chunk_reader(const Store& storage, const Enc& codec, unsigned threads) : storage_(&storage), codec_(&codec), threads_(threads) {}

  /// Fills every live tensor (a slice of its stored tensor) from the chunks that overlap it.
  ///
  /// Raw chunks that land in a host tensor as one contiguous run (what a load at the saved
  /// layout mostly reads) are read into it (through the reader's buffer, or straight from the
  /// disk where the reader reads in place) and verified there, in runs of chunks that follow
  /// each other in their file, by every worker at
  /// once in no particular order (so `dev.host_view`, which only returns the tensor's
  /// pointer, is called from several threads). The other chunks are items of run_pipeline:
  /// workers read, verify and decode them in parallel (when the Storage allows concurrent
  /// reads). Into host tensors the workers also copy them, each its own part of the tensor;
  /// otherwise one finishing thread copies them through `dev.from_host`, in order, so a
  /// DevicePolicy's copies never run on two threads at once. With several damaged chunks, the
  /// error reported is the first in-place one, if any.
  template <class Dev, class Verify>
  std::uint64_t load(std::span<const tensor_load> wanted, const metadata& md, Verify& verify_file, Dev& dev) const {
    struct chunk_read {
      std::size_t tensor;
      std::size_t chunk;
      bool in_place = false;     // read straight into the tensor, at byte `at`
      std::uint64_t at = 0;
      std::uint64_t filled = 0;  // bytes of the tensor it filled
      std::uint64_t read = 0;    // bytes read from storage
    };
    // Lists of one entry per chunk or tensor, in table memory and sized up front: for 100,000
    // tensors, vectors grown by doubling faulted in 10 MB of fresh memory at every load, 35-50 ms
    // before the first read (docs/performance.md, "What the investigations found").
    table_vector<chunk_read> reads;
    table_vector<std::size_t> direct, staged;  // indices into reads: in place, through the pipeline
    std::uint64_t direct_bytes = 0;             // what the reads into place move
    reads.reserve(wanted.size());
    direct.reserve(has_host_view<Dev> ? wanted.size() : 0);
    for (std::size_t k = 0; k < wanted.size(); ++k) {
      const auto& s = *wanted[k].stored;
      const auto& c = s.chunks;
      const auto& ref = *wanted[k].ref;
      const region dst{offset_in_stored(ref), ref.shape()};
      for (std::size_t i = 0; i < c.size() && ref.nbytes() != 0; ++i) {
        if (c.ndim != 0 && !overlaps({c.offset(i), c.shape(i)}, dst)) continue;
        verify_file(c.file[i]);  // header, trailer and footer index: once per file, before any chunk
        chunk_read r{k, i};
        if constexpr (has_host_view<Dev>) {
          const auto elem = size_of(s.type);
          if (c.codec[i] == 0 && c.stored_size[i] == c.elements(i) * elem) {
            std::uint64_t runs = 0, bytes = 0;
            for_each_overlap_run({c.offset(i), c.shape(i)}, dst, elem, [&](std::uint64_t d, std::uint64_t, std::uint64_t len) {
              ++runs;
              r.at = d;
              bytes = len;
            });
            r.in_place = runs == 1 && bytes == c.stored_size[i];
          }
        }
        if (r.in_place) direct_bytes += c.stored_size[i];
        (r.in_place ? direct : staged).push_back(reads.size());
        reads.push_back(r);
      }
    }
    const unsigned workers = concurrent_reads<Store> ? worker_count(threads_) : 1u;
    // ckpt's own tensors ("__ckpt.*", the validation logits) are named for what they are, with
    // the chunk's offset, as reader::verify names them.
    const auto own = [&](const chunk_read& r) { return wanted[r.tensor].stored->name.starts_with("__ckpt."); };
    const auto offset_of = [&](const chunk_read& r) { return std::to_string(wanted[r.tensor].stored->chunks.file_offset[r.chunk]); };
    const auto where = [&](const chunk_read& r) {
      const auto& s = *wanted[r.tensor].stored;
      const auto file = storage_->describe(file_key(md, s.chunks.file[r.chunk]));
      if (own(r)) return file + ", " + *wanted[r.tensor].name + ", chunk at offset " + offset_of(r);
      return file + ", tensor " + printable(*wanted[r.tensor].name);
    };
    const auto mismatch = [&](const chunk_read& r) {
      return error(error_kind::corrupt, where(r) + (own(r) ? ": checksum mismatch" : ": chunk checksum mismatch at offset " + offset_of(r)));
    };
    const auto key_of = [&](const chunk_read& r) { return file_key(md, wanted[r.tensor].stored->chunks.file[r.chunk]); };

    if constexpr (has_host_view<Dev>) {
      // Reads straight into tensors mostly wait for the storage: as many in flight as it
      // wants (has_read_depth), on more workers than cores if need be.
      unsigned readers = workers;
      if constexpr (concurrent_reads<Store> && has_read_depth<Store>) readers = std::max(readers, storage_->reads_in_flight());
      // Chunks that follow each other in a file (small tensors, saved one after the other) are
      // read by one worker as one run of up to 4 MiB, announced to the reader as a whole: read
      // one by one, each of them is too small for O_DIRECT and comes through the page cache.
      struct run {
        std::size_t first, last;  // positions in `direct`
        std::uint32_t file;
        std::uint64_t offset, end;  // the bytes of the file it covers
      };
      table_vector<run> runs;
      runs.reserve(direct.size());
      // A run holds up to 4 MiB, or more where the load reads more than that per worker: the
      // reader reads a run in windows of 4 MiB one after the other, one request each, where runs
      // of a chunk each sent a placed 4 MiB chunk to the disk as two requests (its 4 MiB and the
      // block past them). Up to 16 MiB, and no more than an even share of the bytes per worker,
      // so that every worker has runs to read.
      const std::uint64_t most = std::clamp(direct_bytes / readers, std::uint64_t{4} << 20, std::uint64_t{16} << 20);
      for (std::size_t k = 0; k < direct.size(); ++k) {
        const auto& r = reads[direct[k]];
        const auto& c = wanted[r.tensor].stored->chunks;
        const std::uint32_t file = c.file[r.chunk];
        const std::uint64_t offset = c.file_offset[r.chunk], end = offset + c.stored_size[r.chunk];
        // Next in the file: right after the run (packed, shard-file version 2), at the next
        // block boundary (after padding), or placed (format.hpp, chunk_start) as far into the
        // block where the run ends, or the one after it, as its memory lay into its page. Not
        // further, where the bytes between could be several small chunks this load does not
        // want; what lies between costs at most two blocks read ahead (each chunk is still read
        // and verified at its own offset).
        if (!runs.empty() && runs.back().file == file && offset >= runs.back().end &&
            offset < align_up(runs.back().end) + alignment && end - runs.back().offset <= most)
          runs.back().last = k + 1, runs.back().end = end;
        else
          runs.push_back({k, k + 1, file, offset, end});
      }
      std::vector<open_file> files(std::min<std::size_t>(readers, std::max<std::size_t>(runs.size(), 1)));  // one per worker
      parallel_for(runs.size(), static_cast<unsigned>(files.size()), [&](std::size_t g, unsigned w) {
        const auto& run = runs[g];
        const auto key = file_key(md, run.file);
        announce(key, run.file, files[w], run.offset, run.end - run.offset);
        for (auto k = run.first; k < run.last; ++k) {
          auto& r = reads[direct[k]];
          const auto& c = wanted[r.tensor].stored->chunks;
          const auto i = r.chunk;
          const std::span<std::byte> target(dev.host_view(*wanted[r.tensor].ref) + r.at, static_cast<std::size_t>(c.stored_size[i]));
          r.read = target.size();
          if (read_hashed(key, run.file, files[w], c.file_offset[i], target, true) != c.xxh3[i]) throw mismatch(r);
          r.filled = target.size();
        }
      });
    }

    struct slot {
      // Pinned memory when the DevicePolicy lends it; otherwise page-aligned, so that a chunk
      // read whole (resharded, or encoded) can come from the disk straight into it, where the
      // reader reads in place (reads_in_place; posix_options::read_in_place).
      staging_buffer<Dev, 4096> buffer;
      std::vector<std::byte> decoded;
      std::span<const std::byte> plain;
      open_file file;  // used by one item at a time, like the buffer
    };
    std::vector<slot> ring(std::min(2 * std::size_t{workers}, std::max<std::size_t>(staged.size(), 1)));
    if constexpr (lends_buffers<Dev>) {
      // Borrowed here, on the caller's thread; the workers only resize within them.
      std::uint64_t largest = 0;
      for (const auto n : staged) largest = std::max(largest, wanted[reads[n].tensor].stored->chunks.stored_size[reads[n].chunk]);
      if (!staged.empty())
        for (auto& sl : ring) sl.buffer.resize(static_cast<std::size_t>(largest + alignment - 1), dev);  // room for `in_page`
    }
    run_pipeline(
        staged.size(), ring.size(), workers, [](std::size_t, std::size_t) {},
        [&](std::size_t n, std::size_t si) {  // read, verify, decode: on a worker
          auto& r = reads[staged[n]];
          auto& sl = ring[si];
          const auto& s = *wanted[r.tensor].stored;
          const auto& c = s.chunks;
          const auto i = r.chunk;
          const auto raw_size = c.elements(i) * size_of(s.type);
          // The chunk lands as far into the page-aligned buffer as it lies into its block in the
          // file (a large raw chunk is placed for the memory it was saved from: format.hpp,
          // placed_from), so that the disk fills the buffer without a copy (reads_in_place).
          const auto in_page = static_cast<std::size_t>(c.file_offset[i] % alignment);
          sl.buffer.resize_without_borrowing(static_cast<std::size_t>(c.stored_size[i]) + in_page);
          const auto stored = sl.buffer.span().subspan(in_page);
          r.read = stored.size();
          if (read_hashed(key_of(r), c.file[i], sl.file, c.file_offset[i], stored) != c.xxh3[i]) throw mismatch(r);
          sl.plain = stored;
          if (c.codec[i] != 0) {
            sl.decoded.resize(raw_size);
            decode_chunk(c.codec[i], stored, s.type, sl.decoded, where(r));
            sl.plain = sl.decoded;
          } else if (c.stored_size[i] != raw_size) {
            throw error(error_kind::corrupt, where(r) + ": raw chunk of " + std::to_string(c.stored_size[i]) +
                                                 " bytes, expected " + std::to_string(raw_size));
          }
          if constexpr (has_host_view<Dev>) {  // chunks fill disjoint parts of the tensors: copied here, in parallel
            const auto& ref = *wanted[r.tensor].ref;
            const region src{c.offset(i), c.shape(i)}, dst{offset_in_stored(ref), ref.shape()};
            auto* to = dev.host_view(ref);
            const auto* from = sl.plain.data();
            r.filled = for_each_overlap_run(src, dst, size_of(s.type), [&](std::uint64_t d, std::uint64_t f, std::uint64_t len) {
              std::memcpy(to + d, from + f, static_cast<std::size_t>(len));
            });
          }
        },
        [&](std::size_t n, std::size_t si) {  // copy into the tensor through the device policy, in order
          if constexpr (!has_host_view<Dev>) {
            auto& r = reads[staged[n]];
            const auto& s = *wanted[r.tensor].stored;
            const auto& ref = *wanted[r.tensor].ref;
            const region src{s.chunks.offset(r.chunk), s.chunks.shape(r.chunk)}, dst{offset_in_stored(ref), ref.shape()};
            const auto plain = ring[si].plain;
            r.filled = for_each_overlap_run(src, dst, size_of(s.type), [&](std::uint64_t d, std::uint64_t from, std::uint64_t len) {
              dev.from_host(plain.subspan(from, len), ref, d);
            });
          } else {
            (void)n, (void)si;  // copied by the worker
          }
        });
    table_vector<std::uint64_t> filled(wanted.size(), 0);
    std::uint64_t bytes_read = 0;
    for (const auto& r : reads) {
      filled[r.tensor] += r.filled;
      bytes_read += r.read;
    }
    for (std::size_t k = 0; k < wanted.size(); ++k)
      if (filled[k] != wanted[k].ref->nbytes())
        throw error(error_kind::corrupt, "tensor " + printable(*wanted[k].name) + ": the checkpoint covers " +
                                             std::to_string(filled[k]) + " of its " + std::to_string(wanted[k].ref->nbytes()) +
                                             " bytes");
    return bytes_read;
  }


 private:
  /// A load worker's open file: the last file its reads came from, kept open for the next
  /// chunk, which mostly comes from the same shard file. A load then opens each file about
  /// once per pipeline slot, not once per chunk: a model of many small tensors (biases, norms)
  /// otherwise pays an open and a close for each of them.
  struct open_file {
    std::uint32_t index = UINT32_MAX;
    std::optional<typename reader_of<Store>::type> reader;
  };

  /// Opens `file` on file `index` (`key`) for the next reads, unless it is open already.
  void open(const std::string& key, std::uint32_t index, open_file& file) const {
    if constexpr (opens_readers<Store>) {
      if (file.index != index || !file.reader) {
        file.reader.reset();
        file.reader.emplace(storage_->open_reader(key));
        file.index = index;
      }
    }
  }

  /// Says that the next reads of `file` cover `bytes` at `offset`: a reader that reads ahead
  /// (posix with O_DIRECT) learns how far it may.
  void announce(const std::string& key, std::uint32_t index, open_file& file, std::uint64_t offset, std::uint64_t bytes) const {
    open(key, index, file);
    if constexpr (opens_readers<Store>)
      if constexpr (announces_reads<typename reader_of<Store>::type>) file.reader->will_read(offset, bytes);
  }

  /// Reads `out.size()` bytes at `offset` of file `index` (`key`) and returns their XXH3,
  /// hashing each piece as soon as it arrives: the bytes are hashed while still in the CPU's
  /// cache instead of being fetched from memory a second time, which makes verifying nearly free.
  /// Where the reader reads `out` in place (page-aligned memory, O_DIRECT), the pieces are 4 MiB:
  /// the disk's transfer puts nothing in the cache, and the copy it saves costs more than the hash.
  /// `announced`: a range holding these bytes was announced already (a run of chunks).
  std::uint64_t read_hashed(const std::string& key, std::uint32_t index, open_file& file, std::uint64_t offset,
                            std::span<std::byte> out, bool announced = false) const {
    if (announced)
      open(key, index, file);
    else
      announce(key, index, file, offset, out.size());
    const auto read = [&](std::uint64_t at, std::span<std::byte> part) {
      if constexpr (opens_readers<Store>)
        file.reader->read(at, part);
      else
        storage_->read(key, at, part);
    };
    std::size_t piece = read_piece_bytes<Store>();
    if constexpr (opens_readers<Store>)
      if constexpr (reads_in_place<typename reader_of<Store>::type>)
        if (file.reader->reads_in_place(offset, out)) piece = in_place_piece_bytes;  // no copy to keep in cache
    if (out.size() <= piece) {
      read(offset, out);
      return xxh3(out);
    }
    xxh3_stream h;
    for (std::size_t at = 0; at < out.size();) {
      // A last piece under a quarter of `piece` joins the one before it. A reader may take a
      // small read for one of a run of small chunks and read ahead for it: posix batches reads
      // under 64 KiB, so a chunk's 40 KiB tail had it copy the next 4 MiB of the run through its
      // own buffer, a second copy of every byte after it (warm loads into a std::vector's
      // memory: 5-10 % of the load).
      auto n = std::min(piece, out.size() - at);
      if (out.size() - at - n < piece / 4) n = out.size() - at;
      const auto part = out.subspan(at, n);
      read(offset + at, part);
      h.update(part);
      at += n;
    }
    return h.digest();
  }

  void decode_chunk(std::uint8_t id, std::span<const std::byte> in, dtype t, std::span<std::byte> out,
                    const std::string& where) const {
    try {
      if (decode_builtin(id, in, t, out)) return;
      if (id != Enc::id) throw error(error_kind::corrupt, "unknown codec id " + std::to_string(id));
      codec_->decode(in, t, out);
    } catch (const error& e) {
      throw error(e.kind(), where + ": " + e.what());
    }
  }

  const Store* storage_;
  const Enc* codec_;
  unsigned threads_;
};

}  // namespace ckpt::detail
