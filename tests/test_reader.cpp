// ckpt::reader (a tag read without its Checkpointable type), checkpointer::prune, and the
// in_process communicator: the library side of the `ckpt` tool.

#include "failing_storage.hpp"
#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/in_process.hpp>
#include <ckpt/reader.hpp>

#include <filesystem>
#include <fstream>
#include <thread>

namespace fs = std::filesystem;

namespace {

using test::mentions;

/// A 2-d weight split by rows over `tp` ranks, a replicated bias and a per-rank value.
struct tp_rank {
  std::uint32_t rank, tp;
  std::vector<float> w, b = std::vector<float>(5);
  std::uint64_t seen;
  static constexpr std::uint64_t rows = 12, cols = 7;

  tp_rank(std::uint32_t r, std::uint32_t n) : rank(r), tp(n), seen(100 + r) {
    for (std::uint64_t i = lo(); i < hi(); ++i)
      for (std::uint64_t j = 0; j < cols; ++j) w.push_back(static_cast<float>(i * cols + j));
    for (std::size_t k = 0; k < b.size(); ++k) b[k] = 0.5f * static_cast<float>(k);
  }
  std::uint64_t lo() const { return rows * rank / tp; }
  std::uint64_t hi() const { return rows * (rank + 1) / tp; }
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(w.data(), {hi() - lo(), cols}).sharded({.global_shape = {rows, cols}, .offset = {lo(), 0}}));
    v.tensor("b", ckpt::view(b, {5}).sharded(ckpt::shard_spec::replica()));
    v.value("seen", seen);
  }
};

using test::on_ranks;

struct small_state {
  std::vector<float> w = std::vector<float>(4);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", w);
  }
};

}  // namespace

TEST_CASE("reader: what a tag holds, tensors whole and sliced, value bytes") {
  test::temp_dir dir;
  test::every_dtype_state s;
  s.randomise(7);
  ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::zstd_bytegroup> cp{{}, dir.path(), {.chunk_bytes = 256}};
  cp.save(100, s, {.config = ckpt::config{{"lr", 0.5}}});
  s.randomise(8);
  cp.save(200, s);

  ckpt::reader r{ckpt::posix(dir.path())};  // latest
  const auto& info = r.info();
  CHECK(info.tag == "global_step200");
  CHECK(info.iteration == 200);
  CHECK(info.topology == ckpt::topology{});
  CHECK(info.files.size() == 1);
  const auto* f32 = r.find("layers.0.f32");
  REQUIRE(f32);
  CHECK(f32->type == ckpt::dtype::f32);
  CHECK(f32->shape == ckpt::shape_t{12, 33});
  CHECK(f32->raw_bytes == 12 * 33 * 4);
  CHECK(f32->chunks > 1);  // 256-byte chunks
  CHECK(f32->codecs == std::vector<std::string>{"zstd_bytegroup"});
  CHECK(r.find("optimizer.m"));
  CHECK(r.find("no.such") == nullptr);
  std::uint64_t raw = 0;
  for (const auto& t : info.tensors) raw += t.raw_bytes;
  CHECK(info.raw_bytes == raw);

  std::vector<float> whole(12 * 33);
  r.read("layers.0.f32", ckpt::view(whole, {12, 33}));
  CHECK(whole == s.f32);
  // Rows 3..5, columns 10..19 only.
  std::vector<float> part(3 * 10);
  r.read("layers.0.f32", ckpt::view(part, {3, 10}).sharded({.global_shape = {12, 33}, .offset = {3, 10}}));
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 10; ++j) CHECK(part[i * 10 + j] == s.f32[(3 + i) * 33 + 10 + j]);

  const auto bytes = r.value_bytes("optimizer.step");
  CHECK(bytes == ckpt::detail::encode_value(s.adam_step));

  ckpt::reader older{ckpt::posix(dir.path()), std::string("global_step100")};
  CHECK(older.info().iteration == 100);
  CHECK(*older.info().config.find("lr") == "0.5");

  auto e = test::catch_error([&] { r.read("no.such", ckpt::view(whole, {12, 33})); });
  CHECK(e.kind() == ckpt::error_kind::not_found);
  CHECK(mentions(e.what(), "no.such"));
  e = test::catch_error([&] { r.read("layers.0.f32", ckpt::view(whole, {33, 12})); });
  CHECK(e.kind() == ckpt::error_kind::mismatch);
  CHECK(mentions(e.what(), "[12, 33]"));
  CHECK(mentions(e.what(), "[33, 12]"));
  e = test::catch_error([&] { ckpt::reader{ckpt::posix(dir.path()), std::string("global_step300")}; });
  CHECK(e.kind() == ckpt::error_kind::not_found);
  CHECK(mentions(e.what(), "global_step300"));
  test::temp_dir empty;
  e = test::catch_error([&] { ckpt::reader{ckpt::posix(empty.path())}; });
  CHECK(e.kind() == ckpt::error_kind::not_found);
}

TEST_CASE("reader::read_validation_logits: the saved logits, chunk by chunk, verified") {
  test::temp_dir dir;
  small_state s;
  std::vector<float> logits(6 * 5);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 0.25f * static_cast<float>(i) - 3.0f;
  ckpt::checkpointer<ckpt::single_process, ckpt::posix, ckpt::zstd> cp{{}, dir.path(), {.chunk_bytes = 40}};
  cp.save(3, s, {.validation_logits = ckpt::view(logits, {6, 5})});

  ckpt::reader r{ckpt::posix(dir.path())};
  const auto* info = r.validation_logits();
  REQUIRE(info != nullptr);
  CHECK(info->shape == ckpt::shape_t{6, 5});
  const auto chunks = r.chunks(info->name);
  CHECK(chunks.size() > 1);  // several chunks, placed by their offsets
  std::vector<float> back(logits.size(), -1.0f);
  r.read_validation_logits(ckpt::view(back, {6, 5}));
  CHECK(back == logits);
  std::vector<float> wrong(logits.size());
  CHECK_THROWS_WITH_AS(r.read_validation_logits(ckpt::view(wrong, {5, 6})), doctest::Contains("validation logits are f32 [6, 5]"), ckpt::error);

  // A byte of a logits chunk flipped: refused as corrupt, naming the file and the chunk.
  const auto& c = chunks.back();
  {
    std::fstream f(dir.path() / "global_step3" / c.file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(c.file_offset));
    char b = 0;
    f.read(&b, 1);
    b = static_cast<char>(b ^ 0x10);
    f.seekp(static_cast<std::streamoff>(c.file_offset));
    f.write(&b, 1);
  }
  try {
    r.read_validation_logits(ckpt::view(back, {6, 5}));
    FAIL("a damaged chunk was read");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(mentions(e.what(), "validation logits, chunk at offset " + std::to_string(c.file_offset)));
    CHECK(mentions(e.what(), c.file));
  }

  // A tag without logits says so.
  test::temp_dir plain;
  ckpt::checkpointer<ckpt::single_process, ckpt::posix>{{}, plain.path()}.save(1, s);
  ckpt::reader none{ckpt::posix(plain.path())};
  CHECK(none.validation_logits() == nullptr);
  CHECK_THROWS_AS(none.read_validation_logits(ckpt::view(back, {6, 5})), ckpt::error);
}

TEST_CASE("reader::verify reports every problem: damaged chunks, values and files") {
  test::temp_dir dir;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 3, .comm = comm}, dir.path(), {.chunk_bytes = 64}};
    tp_rank s(r, 3);
    cp.save(10, s);
  });
  for (const auto& e : errors) CHECK(e == "");

  ckpt::reader r{ckpt::posix(dir.path())};
  auto rep = r.verify();
  CHECK(rep.ok());
  CHECK(rep.chunks_checked == [&] {
    std::uint64_t n = 0;
    for (const auto& t : r.info().tensors) n += t.chunks;
    return n;
  }());
  CHECK(r.info().files.size() == 3);
  CHECK(r.find("w")->files.size() == 3);
  CHECK(r.find("b")->files.size() == 1);  // replicated: stored once

  // Damage: one byte of a chunk of w in rank 1's file, one of rank 2's value, and rank 0's
  // file extended (its size no longer matches).
  const auto chunks = r.chunks("w");
  const auto c = *std::find_if(chunks.begin(), chunks.end(), [](const auto& x) { return x.file.starts_with("mp_rank_01"); });
  auto flip = [&](const std::string& file, std::uint64_t at) {
    std::fstream f(dir.path() / "global_step10" / file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char b = 0;
    f.read(&b, 1);
    f.seekp(static_cast<std::streamoff>(at));
    b = static_cast<char>(b ^ 1);
    f.write(&b, 1);
  };
  flip(c.file, c.file_offset + 3);
  const auto md = ckpt::detail::decode_metadata(
      [&] {
        std::ifstream in(dir.path() / "global_step10" / "metadata.json");
        return std::string(std::istreambuf_iterator<char>(in), {});
      }(),
      "metadata.json");
  const auto v2 = *std::find_if(md.values.begin(), md.values.end(), [](const auto& v) { return v.rank == 2; });
  flip(md.files[v2.file].path, v2.file_offset);
  std::ofstream(dir.path() / "global_step10" / "mp_rank_00" / "model_optim_rng.ckpt", std::ios::app) << "x";

  rep = r.verify();
  REQUIRE(rep.problems.size() == 3);
  std::string all;
  for (const auto& p : rep.problems) all += p + "\n";
  CHECK(mentions(all, "mp_rank_00/model_optim_rng.ckpt has"));
  CHECK(mentions(all, "tensor 'w', chunk at offset " + std::to_string(c.file_offset) + ": checksum"));
  CHECK(mentions(all, c.file));
  CHECK(mentions(all, "value 'seen' of rank 2"));
  // A read refuses the same damage.
  std::vector<float> w(12 * 7);
  CHECK_THROWS_AS(r.read("w", ckpt::view(w, {12, 7})), ckpt::error);
}

TEST_CASE("in_process ranks save at tp=3 and load at tp=2 and tp=1, bit-exact") {
  test::temp_dir dir;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 3, .comm = comm}, dir.path()};
    tp_rank s(r, 3);
    cp.save(10, s);
  });
  for (const auto& e : errors) CHECK(e == "");
  errors = on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 2, .comm = comm}, dir.path()};
    tp_rank want(r, 2), got(r, 2);
    std::fill(got.w.begin(), got.w.end(), -1.f);
    std::fill(got.b.begin(), got.b.end(), -1.f);
    cp.load(got, {.on_topology_change = ckpt::topology_change::from_rank_0});
    if (got.w != want.w || got.b != want.b) throw std::runtime_error("rank " + std::to_string(r) + " loaded other values");
    if (got.seen != 100) throw std::runtime_error("per-rank value not from rank 0");
  });
  for (const auto& e : errors) CHECK(e == "");
  std::vector<float> w(12 * 7);
  ckpt::reader r{ckpt::posix(dir.path())};
  r.read("w", ckpt::view(w, {12, 7}));
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(w[i] == static_cast<float>(i));
}

TEST_CASE("in_process: a rank that fails makes every rank fail, and nothing is committed") {
  test::temp_dir dir;
  auto errors = on_ranks(3, [&](ckpt::in_process comm, std::uint32_t r) {
    using faulty = test::failing_storage<ckpt::posix>;
    faulty store{ckpt::posix(dir.path())};
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, faulty> cp{{.tp = 3, .comm = comm}, store};
    tp_rank s(r, 3);
    store.fail_at(r == 2 ? 3 : -1, EIO);  // rank 2's storage fails inside its shard write
    cp.save(10, s);
  });
  for (const auto& e : errors) {
    CHECK(mentions(e, "rank 2"));
    CHECK(mentions(e, "injected fault"));
  }
  CHECK_FALSE(fs::exists(dir.path() / "latest"));
  CHECK_FALSE(fs::exists(dir.path() / "global_step10" / "metadata.json"));
}

TEST_CASE("prune applies the retention rule by hand, with a dry run, and never races a writer") {
  test::temp_dir dir;
  small_state s;
  {
    ckpt::checkpointer<> cp{{}, dir.path()};
    for (std::uint64_t it : {10, 20, 30, 40}) cp.save(it, s);
    cp.save(5, s);  // an old iteration saved last: latest names it, and prune keeps it
  }
  fs::create_directories(dir.path() / "global_step50");  // a crashed save: marker, no metadata
  std::ofstream(dir.path() / "global_step50" / ".ckpt_tag") << "x\n";
  fs::create_directories(dir.path() / "user_notes");  // not ckpt's: never touched

  ckpt::checkpointer<> cp{{}, dir.path()};
  auto gone = cp.prune(2, true);
  std::sort(gone.begin(), gone.end());
  CHECK(gone == std::vector<std::string>{"global_step10", "global_step20", "global_step50"});
  CHECK(fs::exists(dir.path() / "global_step10"));  // a dry run deletes nothing
  CHECK(fs::exists(dir.path() / "global_step50"));

  {
    ckpt::checkpointer<> writer{{}, dir.path()};
    writer.save(60, s);  // holds the root's writer lock from now on
    const auto e = test::catch_error([&] { cp.prune(2); });
    CHECK(e.kind() == ckpt::error_kind::busy);
    CHECK(fs::exists(dir.path() / "global_step10"));
  }
  gone = cp.prune(2);
  std::sort(gone.begin(), gone.end());
  // Kept: the newest two (40, and 60 which latest names now). The crashed save's directory
  // went with writer's save, which cleans up leftovers; the user's directory stays.
  CHECK(gone == std::vector<std::string>{"global_step10", "global_step20", "global_step30", "global_step5"});
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.is_directory()) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"global_step40", "global_step60", "user_notes"});
  CHECK(test::catch_error([&] { cp.prune(0); }).kind() == ckpt::error_kind::invalid_argument);
}

// ---- the reader opens its tag once ------------------------------------------------------------

namespace {
/// memory_storage that counts the reads of each key (copies share the counts).
struct counting_storage : test::wrapped_memory_storage {
  std::shared_ptr<std::map<std::string, int>> reads = std::make_shared<std::map<std::string, int>>();
  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
    ++(*reads)[std::string(key)];
    inner.read(key, offset, out);
  }
  int count_ending(std::string_view suffix) const {
    int n = 0;
    for (const auto& [k, c] : *reads)
      if (k.ends_with(suffix)) n += c;
    return n;
  }
};
static_assert(ckpt::Storage<counting_storage>);

struct many_tensors {
  std::vector<std::vector<float>> ts;
  void checkpoint(ckpt::visitor& v) {
    for (std::size_t i = 0; i < ts.size(); ++i) v.tensor("t" + std::to_string(i), ts[i]);
  }
};
}  // namespace

TEST_CASE("reader: metadata.json and chunk_map.bin are read once, however many tensors are read after") {
  counting_storage st;
  many_tensors s;
  for (int i = 0; i < 10'000; ++i) s.ts.push_back({static_cast<float>(i), -1.f, 0.5f, static_cast<float>(i) * 2});
  ckpt::checkpointer<ckpt::single_process, counting_storage>{{}, st}.save(1, s);
  st.reads->clear();
  ckpt::reader<counting_storage> r{st};
  std::vector<float> out(4);
  for (int i = 0; i < 10'000; ++i) {
    r.read("t" + std::to_string(i), ckpt::view(out.data(), {4}));
    REQUIRE(out[0] == static_cast<float>(i));
    REQUIRE(out[3] == static_cast<float>(i) * 2);
  }
  CHECK(st.count_ending("metadata.json") == 1);
  CHECK(st.count_ending("chunk_map.bin") == 1);
  // One shard file: its header, trailer and index are checked once, then one read per chunk.
  const int shard_reads = st.count_ending(".ckpt");
  CHECK(shard_reads >= 10'000);
  CHECK(shard_reads <= 10'000 + 8);
}
