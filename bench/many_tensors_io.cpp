// Per-tensor overhead on the disk (issue 24, point 3): a mixture-of-experts-like state of many
// tensors against the same bytes as one tensor, each saved from a settled disk and loaded cold,
// in an order that rotates from run to run; and a save of the same names with one element each,
// which costs what planning, indexing and committing that many tensors costs without the bytes.
//
// The issue asks for 100,000 tensors of 64 KiB-4 MiB and 4 GiB in all, which cannot all hold
// (100,000 tensors of 64 KiB are already 6.1 GiB). Kept: the count and the total. The experts
// are matrices of 8-56 KiB (bf16, sizes drawn uniformly, seeded: about 3 GiB), and four
// embeddings share what is left (about 1/16 of the total each), as an MoE model's few large
// tensors do.
//
//   bench/many_tensors_io [--dir /var/tmp] [--tensors 100000] [--gib 4] [--runs 3] [--pause 3] [--fio fio]
//                         [--reads-in-flight 16] [--names-only]
//
// Each save of the workload also reports what its metadata adds to the save's critical path: the
// time before its shard file's first byte (planning: the state visited, every tensor cut into
// chunks) plus the time after the file is published (the commit), against the whole save. A
// commit merges the ranks' reports while the file is written, so a save's metadata costs less
// than the names-only save below, which has no bytes to hide it behind.
//
// Each run also writes the same bytes as the least a verified save must do without ckpt's format
// (copy into aligned buffers, hash, O_DIRECT at ckpt's depth: raw_write_verified), from the
// 100,000 tensors and from the one, each from a settled disk: the first against ckpt's save of
// the one tensor bounds the save's many / one, as the verified read below bounds the load's.
//
// Each run also reads the same bytes raw, cold from a settled disk, into the same 100,000
// tensors: the limits of issue 24's point 1 for this workload. With O_DIRECT at queue depth 1
// through an aligned buffer, copied into the tensors (raw_read_direct); with fio's 16 requests in
// flight (no copy, no tensors: the disk alone; skipped without fio); and the least a verified
// load into these tensors must do without ckpt's format: O_DIRECT at ckpt's depth, every byte
// copied into its tensor (O_DIRECT fills only memory aligned to the disk's 512 bytes, which
// 64-byte aligned tensors of 8-56 KiB, one after another in the file, mostly are not) and hashed
// (raw_read_verified). That last one, against ckpt's load of the one tensor, bounds the cold
// load's many / one on a disk that cannot read into such memory.
//
// Every cold read, ckpt's and the baselines', is the faster of two, each from a settled disk: this
// disk has spells of slowness that last seconds. ckpt's cold load of the many tensors is also
// split where its shard file is first opened for chunks: before that it opens the tag, visits the
// state and plans, which the raw reads, knowing their offsets, do not; the reads from then on are
// held against the verified read.
//
// --names-only times only the save and the (warm) load of the names, one element each, back to
// back: what ckpt spends per tensor on its own, without the disk (run it on a tmpfs such as
// /dev/shm). It also counts the allocations (operator new, replaced in this program) each makes
// per tensor, which do not depend on the machine's noise.

#include <ckpt/ckpt.hpp>
#include <ckpt/impl/checkpointer.ipp>  // a checkpointer on a Storage of this program's own (stamped_posix)

#include "workload.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

// Every allocation through operator new (every std::string, vector and node ckpt makes), counted.
// Not inlined, so that the compiler does not pair the malloc and free across them (and warn).
std::atomic<std::uint64_t> allocations{0};

[[gnu::noinline]] void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace {

using namespace bench;

/// ckpt::posix, noting when the shard file is created (its bytes start) and when it is published
/// (its bytes are durable): the save before and after those is its metadata's. And on a load,
/// when a shard file is first opened to read chunks: before that the load opens the tag, visits
/// the state and plans (the footer's details are read with `read`, not through a reader).
class stamped_posix : public ckpt::posix {
 public:
  using ckpt::posix::posix;
  struct stamps {
    clock_type::time_point created, published;
    std::mutex mutex;  // the load's workers open their readers at once
    std::optional<clock_type::time_point> first_reader;
  };
  class writer : public ckpt::posix::writer {
   public:
    writer(ckpt::posix::writer&& w, stamps* s) : ckpt::posix::writer(std::move(w)), stamps_(s) {}
    void publish() {
      ckpt::posix::writer::publish();
      if (stamps_) stamps_->published = clock_type::now();
    }

   private:
    stamps* stamps_;
  };
  writer create(std::string_view key) {
    const bool shard = key.ends_with(".ckpt");
    if (shard) stamps_->created = clock_type::now();
    return writer(ckpt::posix::create(key), shard ? stamps_.get() : nullptr);
  }
  reader open_reader(std::string_view key) const {
    if (key.ends_with(".ckpt")) {
      const std::lock_guard lock(stamps_->mutex);
      if (!stamps_->first_reader) stamps_->first_reader = clock_type::now();
    }
    return ckpt::posix::open_reader(key);
  }
  const stamps& last() const { return *stamps_; }
  /// Forgets the last load's first reader: the next load's is noted.
  void expect_load() const {
    const std::lock_guard lock(stamps_->mutex);
    stamps_->first_reader.reset();
  }

 private:
  std::shared_ptr<stamps> stamps_ = std::make_shared<stamps>();  // shared by the checkpointer's copy
};
static_assert(ckpt::Storage<stamped_posix>);

/// The share of the pages of the files under `dir` that are in the page cache: after a cold
/// load, what the load read through the cache rather than with O_DIRECT (and the kernel's
/// readahead around it).
double cached_share(const std::filesystem::path& dir) {
  std::uint64_t pages = 0, resident = 0;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file() || e.file_size() == 0) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const auto bytes = static_cast<std::size_t>(e.file_size());
    if (void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0); m != MAP_FAILED) {
      std::vector<unsigned char> in((bytes + page - 1) / page);
      if (::mincore(m, bytes, in.data()) == 0) {
        pages += in.size();
        for (const auto p : in) resident += p & 1;
      }
      ::munmap(m, bytes);
    }
    ::close(fd);
  }
  return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0;
}

/// Minor page faults of this process so far: memory touched for the first time (or again after
/// glibc handed it back to the kernel), which the kernel must find and zero a page for.
std::uint64_t page_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_minflt);
}

void add(state& s, std::string name, std::uint64_t bytes) {
  auto& t = s.tensors.emplace_back();
  t.name = std::move(name);
  t.type = ckpt::dtype::bf16;
  t.shape = {bytes / 2};
  t.block.resize(bytes);
}

/// Fills every tensor with bytes from a cheap generator: the raw codec stores them as they are,
/// so their values do not matter, and 4 GiB of normal draws would take longer than the runs.
void fill(state& s) {
  std::uint64_t x = 0x9e3779b97f4a7c15u;
  for (auto& t : s.tensors) {
    auto* p = t.data();
    for (std::size_t i = 0; i + 8 <= t.size(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(p + i, &x, 8);
    }
  }
}

/// The workload; with `names_only`, the same names with one bf16 element each.
state experts(std::size_t count, std::uint64_t total, bool names_only = false) {
  state s;
  std::mt19937_64 g(24);
  std::uniform_int_distribution<std::uint64_t> kib(8, 56);
  std::uint64_t used = 0;
  for (std::size_t i = 0; i + 4 < count; ++i) {
    const auto bytes = kib(g) * 1024;
    add(s, "layers." + std::to_string(i / 768) + ".experts." + std::to_string(i / 3 % 256) + ".w" + std::to_string(i % 3),
        names_only ? 2 : bytes);
    used += bytes;
  }
  // The embeddings take what the experts left (at least 4 KiB each).
  const auto embedding = std::max<std::uint64_t>((total > used ? total - used : 0) / 4 / 4096 * 4096, 4096);
  for (int e = 0; e < 4; ++e) add(s, "embedding." + std::to_string(e), names_only ? 2 : embedding);
  return s;
}

/// Saves and loads `names` (one element each) back to back: runs 1-`runs` after a warm-up, each
/// timed from the call to its return.
int names_alone(const std::filesystem::path& dir, state names, int runs) {
  fill(names);
  const auto where = dir / ("ckpt-names-" + std::to_string(::getpid()));
  std::vector<double> save, load, before, after;
  double save_allocs = 0, load_allocs = 0;  // the same in every run
  std::vector<double> save_faults, load_faults;
  for (int r = 0; r <= runs; ++r) {
    std::filesystem::remove_all(where);
    stamped_posix disk(where);
    ckpt::checkpointer<ckpt::single_process, stamped_posix> cp{{}, disk};
    const auto a0 = allocations.load();
    const auto f0 = page_faults();
    auto t0 = clock_type::now();
    cp.save(1, names);
    const double s = since(t0);
    const auto a1 = allocations.load();
    const auto f1 = page_faults();
    const double b = std::chrono::duration<double>(disk.last().created - t0).count();
    const double a = s - std::chrono::duration<double>(disk.last().published - t0).count();
    t0 = clock_type::now();
    cp.load(names);
    const double l = since(t0);
    const auto a2 = allocations.load();
    const auto f2 = page_faults();
    const double n = static_cast<double>(names.tensors.size());
    std::printf("run %d: names-only save %.3f s (%.2f us per tensor; before its file %.3f s, after it %.3f s), load %.3f s (%.2f us "
                "per tensor)\n",
                r, s, s / n * 1e6, b, a, l, l / n * 1e6);
    if (r == 0) continue;
    save.push_back(s / n * 1e6), load.push_back(l / n * 1e6), before.push_back(b / n * 1e6), after.push_back(a / n * 1e6);
    std::printf("many_tensors_names_us %.6g\nmany_tensors_names_load_us %.6g\n", save.back(), load.back());
    std::printf("many_tensors_names_before_file_us %.6g\nmany_tensors_names_after_file_us %.6g\n", before.back(), after.back());
    save_allocs = static_cast<double>(a1 - a0) / n, load_allocs = static_cast<double>(a2 - a1) / n;
    save_faults.push_back(static_cast<double>(f1 - f0) / n), load_faults.push_back(static_cast<double>(f2 - f1) / n);
    std::printf("many_tensors_names_save_faults %.4g\nmany_tensors_names_load_faults %.4g\n", save_faults.back(),
                load_faults.back());
    std::printf("many_tensors_names_save_allocs %.4g\nmany_tensors_names_load_allocs %.4g\n", save_allocs, load_allocs);
  }
  std::filesystem::remove_all(where);
  std::printf("median of runs 1-%d, per tensor: names-only save %.2f us (before its file %.2f, after it %.2f), load %.2f us; "
              "allocations per tensor: save %.2f, load %.2f; minor page faults per tensor: save %.3f, load %.3f\n",
              runs, median(save), median(before), median(after), median(load), save_allocs, load_allocs, median(save_faults),
              median(load_faults));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path dir = "/var/tmp";
  std::size_t count = 100000;
  double gib = 4;
  int runs = 3;
  unsigned pause = 3;
  bool names_only = false;
  std::string fio = "fio";
  unsigned reads_in_flight = ckpt::posix_options{}.reads_in_flight;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--names-only") {
      names_only = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[i + 1];
    if (a == "--dir") dir = v;
    else if (a == "--tensors") count = std::stoull(v);
    else if (a == "--gib") gib = std::stod(v);
    else if (a == "--runs") runs = std::stoi(v);
    else if (a == "--pause") pause = static_cast<unsigned>(std::stoul(v));
    else if (a == "--fio") fio = v;
    else if (a == "--reads-in-flight") reads_in_flight = static_cast<unsigned>(std::stoul(v));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (runs < 1) {
    std::fprintf(stderr, "--runs must be at least 1 (run 0 only warms up)\n");
    return 2;
  }
  const auto total = static_cast<std::uint64_t>(gib * (1u << 30)) / 4096 * 4096;
  if (names_only) return names_alone(dir, experts(count, total, true), runs);
  auto many = experts(count, total);
  state one, names = experts(count, total, true);
  add(one, "all", many.bytes());
  fill(many), fill(one), fill(names);
  std::printf("tensors %zu bytes %llu (one tensor: %llu)\n", many.tensors.size(), static_cast<unsigned long long>(many.bytes()),
              static_cast<unsigned long long>(one.bytes()));
  const auto root = dir / ("ckpt-many-tensors-" + std::to_string(::getpid()));
  std::filesystem::create_directories(root);
  fio = usable_fio(fio);
  // The raw files, written once: the raw reads below only read them.
  const auto raw_file = root / "raw.bin", fio_file = root / "fio.bin", verified_file = root / "verified.bin";
  const unsigned writes_in_flight = ckpt::posix_options{}.writes_in_flight;
  raw_write_direct(many, raw_file);
  const auto fio_bytes = (many.bytes() + (std::uint64_t{4} << 20) - 1) >> 22 << 22;  // whole 4 MiB blocks
  if (!fio.empty()) (void)fio_seconds(fio, fio_file, fio_bytes, "write", "4M");
  std::vector<double> direct_s, verified_s, fio_s, vs_best, vs_verified, bound, write_bound, pre_read, reads_vs_verified;
  constexpr int cold_tries = 2;
  struct job {
    const char* name;
    state* s;
    std::vector<double> save, load, metadata;
  } jobs[] = {{"many", &many, {}, {}, {}}, {"one", &one, {}, {}, {}}, {"names", &names, {}, {}, {}}};
  std::vector<double> save_ratio, load_ratio, metadata_share;
  std::printf("%4s %12s %12s %8s %12s %12s %8s %12s %13s %12s %12s %12s %10s\n", "run", "many_save_s", "one_save_s", "ratio",
              "many_load_s", "one_load_s", "ratio", "names_save_s", "many_meta_s", "one_meta_s", "raw_direct_s", "raw_verified_s",
              "fio_read_s");
  for (int r = 0; r <= runs; ++r) {  // run 0 warms up
    double saved[3] = {}, loaded[3] = {}, metadata[3] = {}, before[3] = {}, cached[3] = {}, warm[3] = {}, before_read[3] = {};
    for (int k = 0; k < 3; ++k) {
      const int j = (r + k) % 3;
      const auto where = root / jobs[j].name;
      std::filesystem::remove_all(where);
      stamped_posix disk(where);
      ckpt::checkpointer<ckpt::single_process, stamped_posix> cp{{}, disk};
      ::sync();
      ::sleep(pause);
      const auto t0 = clock_type::now();
      cp.save(1, *jobs[j].s);
      saved[j] = since(t0);
      const auto& at = disk.last();
      before[j] = std::chrono::duration<double>(at.created - t0).count();
      metadata[j] = before[j] + saved[j] - std::chrono::duration<double>(at.published - t0).count();
      // Into the same buffers: every chunk is still read and verified. The faster of two cold
      // loads, each from a settled disk, as fio's read is the faster of two (this disk has spells
      // of slowness that last seconds); with the time before its shard file was first opened
      // for chunks.
      loaded[j] = std::numeric_limits<double>::infinity();
      for (int attempt = 0; attempt < cold_tries; ++attempt) {
        double pre = 0;
        const double took = timed_cold(where, pause, [&] {
          disk.expect_load();
          const auto l0 = clock_type::now();
          cp.load(*jobs[j].s);
          if (const auto& first = disk.last().first_reader) pre = std::chrono::duration<double>(*first - l0).count();
        });
        if (took < loaded[j]) loaded[j] = took, before_read[j] = pre;
      }
      cached[j] = cached_share(where);
      // Warm, all in the page cache (the cold load read with O_DIRECT, which caches nothing):
      // what a load just after a save, or from a memory tier's tmpfs, costs per tensor.
      read_through_cache(where);
      const auto t1 = clock_type::now();
      cp.load(*jobs[j].s);
      warm[j] = since(t1);
      std::filesystem::remove_all(where);
    }
    // The least a verified save of the same bytes must do without ckpt's format (copy, hash,
    // O_DIRECT at ckpt's depth: raw_write_verified), from the many tensors and from the one, each
    // from a settled disk as the saves are, in an order that rotates: the first against ckpt's
    // save of the one tensor bounds the save's many / one where copying small tensors costs more.
    double verified_write[2] = {};
    for (int k = 0; k < 2; ++k) {
      const int j = (r + k) % 2;
      std::filesystem::remove(verified_file);
      ::sync();
      ::sleep(pause);
      const auto t0 = clock_type::now();
      raw_write_verified(*jobs[j].s, verified_file, writes_in_flight);
      verified_write[j] = since(t0);
    }
    std::filesystem::remove(verified_file);
    // The raw reads of the same bytes into the same tensors, in an order that rotates, each the
    // faster of two from a settled disk, as ckpt's loads above and fio's reads are.
    double direct = 0, verified = 0, deep = std::numeric_limits<double>::infinity();
    for (int k = 0; k < 3; ++k) {
      switch ((r + k) % 3) {
        case 0: direct = fastest_cold(raw_file, pause, cold_tries, [&] { raw_read_direct(many, raw_file); }); break;
        case 1:
          verified = fastest_cold(raw_file, pause, cold_tries, [&] { raw_read_verified(many, raw_file, reads_in_flight); });
          break;
        default:
          if (!fio.empty()) deep = fastest_fio_read(fio, fio_file, fio_bytes, pause);
      }
    }
    std::printf("%4d %12.3f %12.3f %8.3f %12.3f %12.3f %8.3f %12.3f %13.3f %12.3f %12.3f %12.3f %10.3f\n", r, saved[0], saved[1],
                saved[0] / saved[1], loaded[0], loaded[1], loaded[0] / loaded[1], saved[2], metadata[0], metadata[1], direct,
                verified, fio.empty() ? 0.0 : deep);
    std::fflush(stdout);
    if (r == 0) continue;
    for (int j = 0; j < 3; ++j)
      jobs[j].save.push_back(saved[j]), jobs[j].load.push_back(loaded[j]), jobs[j].metadata.push_back(metadata[j]);
    save_ratio.push_back(saved[0] / saved[1]), load_ratio.push_back(loaded[0] / loaded[1]);
    metadata_share.push_back(metadata[0] / saved[0]);
    const double best = std::min(direct, deep);  // the round's fastest raw read, queue depth 1 or fio's 16
    direct_s.push_back(direct), verified_s.push_back(verified), vs_best.push_back(best / loaded[0]);
    vs_verified.push_back(verified / loaded[0]), bound.push_back(verified / loaded[1]);
    std::printf("many_tensors_raw_direct_read_s %.6g\nmany_tensors_raw_verified_read_s %.6g\n", direct, verified);
    if (!fio.empty()) fio_s.push_back(deep), std::printf("many_tensors_fio_read_s %.6g\n", deep);
    std::printf("many_tensors_load_vs_best_raw %.6g\nmany_tensors_load_vs_verified %.6g\nmany_tensors_verified_vs_one_load %.6g\n",
                best / loaded[0], verified / loaded[0], verified / loaded[1]);
    std::printf("many_tensors_save_ratio %.6g\nmany_tensors_load_ratio %.6g\n", saved[0] / saved[1], loaded[0] / loaded[1]);
    std::printf("many_tensors_verified_write_s %.6g\none_tensor_verified_write_s %.6g\n", verified_write[0], verified_write[1]);
    std::printf("many_tensors_verified_write_vs_one_save %.6g\nmany_tensors_verified_write_ratio %.6g\n",
                verified_write[0] / saved[1], verified_write[0] / verified_write[1]);
    write_bound.push_back(verified_write[0] / saved[1]);
    std::printf("many_tensors_warm_load_s %.6g\none_tensor_warm_load_s %.6g\nmany_tensors_warm_load_ratio %.6g\n", warm[0], warm[1],
                warm[0] / warm[1]);
    std::printf("many_tensors_names_share %.6g\nmany_tensors_metadata_share %.6g\n", saved[2] / saved[0], metadata[0] / saved[0]);
    std::printf("many_tensors_metadata_s %.6g\nmany_tensors_one_metadata_s %.6g\n", metadata[0], metadata[1]);
    const double n = static_cast<double>(many.tensors.size());  // what each tensor adds, in microseconds
    std::printf("many_tensors_save_us %.6g\nmany_tensors_load_us %.6g\nmany_tensors_names_us %.6g\n",
                (saved[0] - saved[1]) / n * 1e6, (loaded[0] - loaded[1]) / n * 1e6, saved[2] / n * 1e6);
    std::printf("many_tensors_cached_after_load %.6g\none_tensor_cached_after_load %.6g\n", cached[0], cached[1]);
    // Where the many tensors' cold load goes: before its shard file is first opened for chunks
    // (opening the tag, visiting the state, planning), and the reads from then on, against the
    // verified read of the same bytes into the same tensors.
    std::printf("many_tensors_load_before_read_s %.6g\none_tensor_load_before_read_s %.6g\n", before_read[0], before_read[1]);
    pre_read.push_back(before_read[0]), reads_vs_verified.push_back(verified / (loaded[0] - before_read[0]));
    std::printf("many_tensors_load_before_read_share %.6g\nmany_tensors_reads_vs_verified %.6g\n", before_read[0] / loaded[0],
                reads_vs_verified.back());
    std::printf("many_tensors_metadata_us %.6g\nmany_tensors_metadata_before_file_s %.6g\nmany_tensors_metadata_after_file_s %.6g\n",
                metadata[0] / n * 1e6, before[0], metadata[0] - before[0]);
  }
  const double n = static_cast<double>(many.tensors.size());
  const auto per_tensor_us = [&](const std::vector<double>& a, const std::vector<double>& b) {
    return (median(a) - median(b)) / n * 1e6;
  };
  std::printf("median of runs 1-%d: save many/one %.3f, cold load many/one %.3f; metadata on the save's critical path %.1f %% of "
              "the save (%.3f s; one tensor's %.3f s); a save of the names alone is %.1f %% of the save; per tensor: save %.1f us, "
              "load %.1f us, metadata on the critical path %.1f us, names-only save %.1f us\n",
              runs, median(save_ratio), median(load_ratio), 100 * median(metadata_share), median(jobs[0].metadata),
              median(jobs[1].metadata), 100 * median(jobs[2].save) / median(jobs[0].save),
              per_tensor_us(jobs[0].save, jobs[1].save), per_tensor_us(jobs[0].load, jobs[1].load),
              per_tensor_us(jobs[0].metadata, jobs[1].metadata), median(jobs[2].save) / n * 1e6);
  std::printf("a verified write of the many tensors without the format (copy, hash, O_DIRECT at depth %u) / ckpt's save of the "
              "one tensor %.3f\n", writes_in_flight, median(write_bound));
  std::printf("the cold load of the many tensors spent %.3f s before its shard file was first opened for chunks (opening the tag, "
              "visiting the state, planning); the verified read / its reads from then on %.3f\n",
              median(pre_read), median(reads_vs_verified));
  char deep_read[32] = "skipped";
  if (!fio_s.empty()) std::snprintf(deep_read, sizeof deep_read, "%.3f s", median(fio_s));
  std::printf("the same bytes read raw into the many tensors, cold: O_DIRECT at depth 1 with a copy %.3f s, verified (O_DIRECT at "
              "depth %u, copy, hash) %.3f s, fio's deep read %s; ckpt's cold load of the many / the fastest raw read %.3f, / the "
              "verified read %.3f; the verified read / ckpt's load of the one tensor %.3f\n",
              median(direct_s), reads_in_flight, median(verified_s),
              deep_read, median(vs_best), median(vs_verified), median(bound));
  std::filesystem::remove_all(root);
}
