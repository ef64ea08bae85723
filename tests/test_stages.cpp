// The checkpointer's stages, each on its own (docs/architecture.md): the tag store, the save
// plan, the gather, the restore plan, the file verifier and the validation logits. The
// end-to-end tests elsewhere run them together; these pin what each stage decides.

#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/detail/gather.hpp>
#include <ckpt/detail/restore_plan.hpp>
#include <ckpt/detail/save_plan.hpp>
#include <ckpt/detail/table_memory.hpp>
#include <ckpt/detail/tag_store.hpp>
#include <ckpt/detail/validation_logits.hpp>
#include <ckpt/megatron.hpp>
#include <ckpt/memory_storage.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct small_state {
  std::vector<float> w = {1, 2, 3, 4};
  std::vector<std::int32_t> b = {7, 8};
  std::uint64_t seed = 42;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(w.data(), {2, 2}));
    v.tensor("b", b);
    v.value("seed", seed);
  }
};

/// A memory root holding tags saved at the given iterations.
ckpt::memory_storage saved_at(std::initializer_list<std::uint64_t> iterations) {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  small_state s;
  for (auto it : iterations) cp.save(it, s);
  return mem;
}

std::string read_key(const ckpt::memory_storage& mem, const std::string& key) {
  std::string s(*mem.size(key), '\0');
  mem.read(key, 0, std::as_writable_bytes(std::span(s.data(), s.size())));
  return s;
}

}  // namespace

TEST_CASE("tag_store: latest, tags and resolving what a load asks for") {
  auto mem = saved_at({10, 20, 30});
  ckpt::detail::tag_store<ckpt::memory_storage> tags(mem);
  CHECK(tags.latest() == "global_step30");
  const auto all = tags.tags();
  REQUIRE(all.size() == 3);
  CHECK(all[0].tag == "global_step10");
  CHECK(all[2].latest);
  CHECK(tags.resolve({}) == "global_step30");
  CHECK(tags.resolve({.iteration = 20}) == "global_step20");
  try {
    (void)tags.resolve({.tag = "global_step99"});
    FAIL("resolved a tag that does not exist");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::not_found);
    CHECK(test::mentions(e.what(), "committed tags: 'global_step10', 'global_step20', 'global_step30 (latest)'"));
  }
}

TEST_CASE("tag_store: open reads metadata.json and the chunk map once, and a resized map is damage") {
  auto mem = saved_at({5});
  ckpt::detail::tag_store<ckpt::memory_storage> tags(mem);
  const auto md = tags.open("global_step5");
  CHECK(md.iteration == 5);
  CHECK(md.tensors.size() == 2);
  const auto bytes = tags.read("global_step5");
  REQUIRE(bytes.parsed);
  const auto map_key = "global_step5/" + bytes.parsed->chunk_map.path;
  auto map = read_key(mem, map_key);
  map.push_back('x');
  {
    auto w = mem.create(map_key);
    w.write(std::as_bytes(std::span(map.data(), map.size())));
    w.publish();
  }
  try {
    (void)tags.open("global_step5");
    FAIL("opened a tag whose chunk map changed size");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(test::mentions(e.what(), "metadata.json recorded"));
  }
}

TEST_CASE("tag_store: prepare refuses the user's directory and latest's tag; retention spares latest") {
  auto mem = saved_at({1, 2, 3});
  ckpt::detail::tag_store<ckpt::memory_storage> tags(mem);
  {
    auto w = mem.create("mine/notes.txt");
    w.publish();
  }
  CHECK_THROWS_WITH_AS(tags.prepare("mine", true), doctest::Contains("was not written by ckpt"), ckpt::error);
  CHECK_THROWS_WITH_AS(tags.prepare("global_step3", true), doctest::Contains("the one 'latest' names"), ckpt::error);
  CHECK_THROWS_WITH_AS(tags.prepare("global_step2", false), doctest::Contains("already committed"), ckpt::error);
  // A crashed save's leftovers (the marker, no metadata.json) go first, then the oldest tags.
  tags.prepare("global_step4", true);
  CHECK(!tags.committed("global_step4"));
  const auto victims = tags.retention_victims("", 2);
  CHECK(victims == std::vector<std::string>{"global_step4", "global_step1"});
  tags.remove(victims);
  CHECK(tags.tags().size() == 2);
  CHECK(mem.list("global_step4").empty());
}

TEST_CASE("save_plan: each tensor goes to the rank that writes it, the rest is held") {
  // A policy that writes only tensors whose name starts with "w".
  struct only_w : ckpt::single_process {
    bool writes(std::string_view name, const ckpt::tensor_ref&) const { return name.starts_with("w"); }
  };
  small_state s;
  ckpt::visitor v;
  ckpt::detail::visit_state(v, s);
  auto plan = ckpt::detail::new_save_plan(7, {});
  ckpt::detail::collect_state(plan, v, only_w{}, ckpt::host_copy{}, {}, 0);
  CHECK(plan.tag == "global_step7");
  REQUIRE(plan.mine.size() == 1);
  CHECK(plan.mine[0].name == "w");
  CHECK(plan.held == std::vector<std::string>{"b"});
  REQUIRE(plan.values.size() == 1);
  CHECK(plan.values[0].name == "seed");

  std::vector<float> too_big(4);
  auto ref = ckpt::view(too_big.data(), {2, 2});
  ref.sharded(ckpt::shard_spec{.global_shape = {3, 2}, .offset = {2, 0}});
  CHECK_THROWS_WITH_AS(ckpt::detail::check_tensor("x", ref), doctest::Contains("exceeds the global shape [3, 2]"), ckpt::error);
}

TEST_CASE("gather: the identity for a policy that does not gather; rank 0 receives everything under gather_to_root") {
  small_state s;
  {
    ckpt::visitor v;
    ckpt::detail::visit_state(v, s);
    auto plan = ckpt::detail::new_save_plan(1, {});
    ckpt::detail::collect_state(plan, v, ckpt::single_process{}, ckpt::host_copy{}, {}, 0);
    ckpt::local comm;
    ckpt::host_copy host;
    ckpt::detail::gather_plan<ckpt::single_process>(comm, plan, host, {.chunk_bytes = 4096});
    CHECK(plan.mine.size() == 2);
    CHECK(plan.source.empty());
  }
  std::vector<std::size_t> tensors(2), values(2), sources_remote(2);
  const auto errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    using policy = ckpt::gather_to_root<ckpt::in_process>;
    policy p{comm};
    std::vector<float> shard(2, static_cast<float>(r));
    ckpt::visitor v;
    auto ref = ckpt::view(shard.data(), {2});
    ref.sharded(ckpt::shard_spec{.global_shape = {4}, .offset = {2 * r}});
    v.tensor("w", ref);
    v.value("rank", r);
    auto plan = ckpt::detail::new_save_plan(1, {});
    ckpt::detail::collect_state(plan, v, p, ckpt::host_copy{}, {}, static_cast<int>(r));
    ckpt::host_copy host;
    ckpt::detail::gather_plan<policy>(p.comm, plan, host, {.chunk_bytes = 4096});
    tensors[r] = plan.mine.size();
    values[r] = plan.values.size();
    sources_remote[r] = static_cast<std::size_t>(std::count_if(plan.source.begin(), plan.source.end(), [](int x) { return x >= 0; }));
    // What is streamed is sent when the write (or snapshot) asks for it.
    std::vector<std::byte> sink;
    ckpt::detail::through_gather<policy>(p.comm, plan, host, [&](auto& via) {
      for (auto& t : plan.mine) {
        sink.resize(static_cast<std::size_t>(t.ref.nbytes()));
        for (const auto& range : ckpt::detail::transfer_ranges(t.ref, plan.transfers))
          via.to_host(t.ref, range.offset, std::span(sink).subspan(static_cast<std::size_t>(range.offset), static_cast<std::size_t>(range.bytes)));
      }
    });
  });
  CHECK(errors == std::vector<std::string>{"", ""});
  CHECK(tensors == std::vector<std::size_t>{2, 0});
  CHECK(values == std::vector<std::size_t>{2, 0});
  CHECK(sources_remote == std::vector<std::size_t>{1, 0});
}

TEST_CASE("restore_plan: one index answers saved(), matching and planning") {
  auto mem = saved_at({3});
  ckpt::detail::tag_store<ckpt::memory_storage> tags(mem);
  const auto md = tags.open("global_step3");
  const ckpt::detail::stored_index index(md);
  REQUIRE(index.tensor("w"));
  CHECK(index.tensor("w")->shape == ckpt::shape_t{2, 2});
  CHECK(index.value("seed"));
  CHECK(!index.tensor("nope"));
  CHECK(index.tensor_count() == md.tensors.size());  // a load's visitor makes room for as many

  // Live state: "w" as saved, "b" with another shape, "extra" unknown to the checkpoint.
  std::vector<float> w(4), extra(1);
  std::vector<std::int32_t> b(3);
  ckpt::visitor v({}, index);
  v.tensor("w", ckpt::view(w.data(), {2, 2}));
  v.tensor("extra", extra);
  ckpt::load_result result;
  const auto matches = ckpt::detail::match_names(md, index, v, result);
  CHECK(result.missing == std::vector<std::string>{"extra"});
  CHECK(result.unexpected == std::vector<std::string>{"b", "seed"});
  REQUIRE(matches.size() == 2);  // one per live tensor, in the visitor's order
  CHECK(matches[0] == index.find_tensor("w"));
  CHECK(matches[1] == nullptr);
  const ckpt::detail::restore_context ctx{0, md.topology, "metadata.json"};
  const auto accepts = [](ckpt::device d) { return d.type == ckpt::device::kind::host; };
  CHECK_THROWS_WITH_AS(ckpt::detail::plan_restore(md, index, v, matches, {.strict = true}, ctx, accepts, result),
                       doctest::Contains("missing from the checkpoint: 'extra'"), ckpt::error);
  const auto plan = ckpt::detail::plan_restore(md, index, v, matches, {.strict = false}, ctx, accepts, result);
  REQUIRE(plan.tensors.size() == 1);
  CHECK(*plan.tensors[0].name == "w");
  CHECK(plan.tensors[0].stored == matches[0]);
  CHECK(plan.tensors[0].ref == &v.tensors()[0].ref);

  ckpt::visitor v2({}, index);
  v2.tensor("b", b);
  ckpt::load_result result2;
  const auto matches2 = ckpt::detail::match_names(md, index, v2, result2);
  CHECK_THROWS_WITH_AS(ckpt::detail::plan_restore(md, index, v2, matches2, {.strict = false}, ctx, accepts, result),
                       doctest::Contains("tensor 'b': saved i32 [2], live i32 [3]"), ckpt::error);
  // Matches made for another visitor are refused, not read past.
  CHECK_THROWS_WITH_AS(ckpt::detail::plan_restore(md, index, v2, matches, {.strict = false}, ctx, accepts, result),
                       doctest::Contains("2 matches for 1 live tensors"), ckpt::error);

  // Per-rank values under another topology: refused unless the caller chose what to do.
  std::uint64_t seed = 0;
  ckpt::visitor v3({}, index);
  v3.value("seed", seed);
  const ckpt::detail::restore_context wider{0, ckpt::topology{2, 1, 1, 1}, "metadata.json"};
  ckpt::load_result fresh;
  ckpt::load_result matched3;
  const auto matches3 = ckpt::detail::match_names(md, index, v3, matched3);
  CHECK_THROWS_WITH_AS(ckpt::detail::plan_restore(md, index, v3, matches3, {}, wider, accepts, fresh),
                       doctest::Contains("per-rank values (RNG states) cannot be restored"), ckpt::error);
  ckpt::load_result kept;
  const auto keep =
      ckpt::detail::plan_restore(md, index, v3, matches3, {.on_topology_change = ckpt::topology_change::keep_live}, wider, accepts, kept);
  CHECK(keep.values.empty());
  CHECK(kept.kept_live == std::vector<std::string>{"seed"});
}

TEST_CASE("file_verifier: each shard file is checked once, and a damaged footer is caught") {
  auto mem = saved_at({2});
  ckpt::detail::tag_store<ckpt::memory_storage> tags(mem);
  const auto md = tags.open("global_step2");
  REQUIRE(md.files.size() == 1);
  ckpt::detail::file_verifier<ckpt::memory_storage> verify(mem, md);
  verify(0);
  const auto once = verify.bytes_read();
  CHECK(once > 0);
  verify(0);
  CHECK(verify.bytes_read() == once);

  const auto key = "global_step2/" + md.files[0].path;
  auto bytes = read_key(mem, key);
  bytes[bytes.size() - 1] = static_cast<char>(bytes[bytes.size() - 1] ^ 0x5a);
  {
    auto w = mem.create(key);
    w.write(std::as_bytes(std::span(bytes.data(), bytes.size())));
    w.publish();
  }
  ckpt::detail::file_verifier<ckpt::memory_storage> fresh(mem, md);
  CHECK_THROWS_AS(fresh(0), ckpt::error);
}

TEST_CASE("validation logits: the worst element is named by its index") {
  CHECK(ckpt::detail::index_string(5, {2, 3}) == "[1, 2]");
  CHECK(ckpt::detail::index_string(0, {}) == "[]");
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  small_state s;
  std::vector<float> logits = {0.5f, 1.0f, 2.0f, 4.0f};
  cp.save(1, s, {.validation_logits = ckpt::view(logits.data(), {2, 2})});
  ckpt::detail::tag_store<ckpt::memory_storage> tags(mem);
  auto md = tags.open("global_step1");
  (void)ckpt::detail::read_all_chunk_details(mem, md);  // the chunks' details, from the footers
  ckpt::detail::file_verifier<ckpt::memory_storage> verify(mem, md);
  const ckpt::raw codec;
  const ckpt::detail::chunk_reader<ckpt::memory_storage, ckpt::raw> chunks(mem, codec, 1);
  ckpt::load_result result;
  auto now = logits;
  ckpt::detail::compare_validation_logits(md, ckpt::view(now.data(), {2, 2}), {}, chunks, verify, result);
  now[3] = 4.5f;
  now[1] = 1.01f;
  CHECK_THROWS_WITH_AS(ckpt::detail::compare_validation_logits(md, ckpt::view(now.data(), {2, 2}), {}, chunks, verify, result),
                       doctest::Contains("2 of 4 elements outside rtol=1e-05 atol=1e-08; max abs difference 0.5 at [1, 1]"),
                       ckpt::error);
}

TEST_CASE("values: a number is stored as cereal's PortableBinary archive stores it, without the archive") {
  const auto through_cereal = [](const auto& x) {
    std::ostringstream os(std::ios::binary);
    {
      cereal::PortableBinaryOutputArchive ar(os);
      ar(x);
    }
    const auto s = std::move(os).str();
    const auto* b = reinterpret_cast<const std::byte*>(s.data());
    return std::vector<std::byte>(b, b + s.size());
  };
  const auto same_bytes = [&](const auto& x) { return ckpt::detail::encode_value(x) == through_cereal(x); };
  CHECK(same_bytes(std::int8_t{-5}));
  CHECK(same_bytes(std::uint16_t{0xbeef}));
  CHECK(same_bytes(std::int32_t{-123456}));
  CHECK(same_bytes(std::uint64_t{0x0123456789abcdef}));
  CHECK(same_bytes(1.5f));
  CHECK(same_bytes(-2.25e300));
  CHECK(same_bytes(true));

  // Read back, and a changed type refused by name.
  std::uint64_t back = 0;
  ckpt::detail::decode_value(through_cereal(std::uint64_t{42}), back, "value 'step'");
  CHECK(back == 42);
  std::uint32_t narrower = 0;
  CHECK_THROWS_WITH_AS(ckpt::detail::decode_value(through_cereal(std::uint64_t{42}), narrower, "value 'step'"),
                       doctest::Contains("value 'step': stored 9 bytes, the live type (a 4-byte number) reads 5"), ckpt::error);
  bool flag = false;
  auto bad_bool = through_cereal(true);
  bad_bool[1] = std::byte{7};
  CHECK_THROWS_WITH_AS(ckpt::detail::decode_value(bad_bool, flag, "value 'flag'"), doctest::Contains("is not a bool"), ckpt::error);
}

namespace {

/// The VmFlags line of the mapping in /proc/self/smaps that holds address `p` ("" when none).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(' ') > line.find('-')) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.starts_with("VmFlags:")) return line;
  }
  return "";
}

struct table_row {
  std::uint64_t words[5] = {};
};

}  // namespace

TEST_CASE("table memory: a freed table's block is kept for the next table, up to a bound, and split to fit") {
  namespace d = ckpt::detail;
  auto& cache = d::huge_page_cache::process();
  const std::size_t mib = std::size_t{1} << 20;
  cache.release();  // what earlier tests' loads and saves left, up to the bound
  CHECK(cache.kept() == 0);
  const auto kept_before = cache.kept();
  const std::byte* first = nullptr;
  {
    d::table_vector<std::byte> big(46 * mib);  // a size no other test leaves behind
    first = big.data();
  }
  if (CKPT_UNDER_ASAN) {  // nothing is kept, so that AddressSanitizer still sees a use after free
    CHECK(cache.kept() == kept_before);
    return;
  }
  CHECK(cache.kept() == kept_before + 46 * mib);
  {
    d::table_vector<std::byte> next(44 * mib);  // the 46 MiB block is the smallest that fits: its head
    CHECK(next.data() == first);
    CHECK(cache.kept() == kept_before + 2 * mib);  // its tail is kept
    next[44 * mib - 1] = std::byte{7};  // all of it is mapped
  }
  CHECK(cache.kept() == kept_before + 46 * mib);
  {
    d::table_vector<std::byte> huge(d::huge_page_cache::largest_block + 2 * mib);  // a buffer, not a table
  }
  CHECK(cache.kept() == kept_before + 46 * mib);  // unmapped, not kept
  {
    std::vector<d::table_vector<std::byte>> many;
    for (int i = 0; i < 6; ++i) many.emplace_back(60 * mib);  // 360 MiB
  }
  CHECK(cache.kept() <= d::huge_page_cache::most_bytes);  // the oldest went first
  CHECK(cache.kept() >= 4 * 60 * mib);
}

TEST_CASE("table memory: tables of 2 MiB or more are in whole 2 MiB blocks advised as huge pages, smaller ones as usual") {
  namespace d = ckpt::detail;
  d::table_vector<table_row> small(1000);  // 40 KB
  CHECK(reinterpret_cast<std::uintptr_t>(small.data()) % alignof(table_row) == 0);
  d::table_vector<table_row> big;
  for (std::uint64_t i = 0; i < 200'000; ++i) big.push_back({{i, i + 1, i + 2, i + 3, i + 4}});  // 8 MB, through several growths
  CHECK(reinterpret_cast<std::uintptr_t>(big.data()) % (std::uintptr_t{2} << 20) == 0);
  bool same = true;
  for (std::uint64_t i = 0; i < big.size(); ++i) same = same && big[i].words[0] == i && big[i].words[4] == i + 4;
  CHECK(same);
  d::table_vector<table_row> copy = big;  // copies and moves keep the allocator (stateless)
  CHECK(copy.size() == big.size());
  CHECK(copy[199'999].words[2] == 200'001);
  // Where the kernel has transparent huge pages, the big table's mapping carries the advice
  // ("hg" in its VmFlags); the small one's does not.
  if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    const auto flags = vm_flags_of(big.data());
    INFO("VmFlags of the big table: " << flags);
    CHECK(flags.find(" hg") != std::string::npos);
  }
}
