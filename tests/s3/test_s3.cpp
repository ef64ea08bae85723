// ckpt::s3 against a real S3-compatible server (s3rver) on 127.0.0.1, started by harness.py
// with a fault-injecting proxy in front of it, and cross-checked with Debian's awscli.
//
// The harness passes: CKPT_TEST_S3_ENDPOINT (s3rver), CKPT_TEST_S3_PROXY (the proxy),
// CKPT_TEST_S3_CONTROL (faults, request log, kill/restart of s3rver), CKPT_TEST_S3_BUCKET,
// CKPT_TEST_S3_DATA (s3rver's directory), and AWS_* credentials for awscli and ckpt alike.

#include "../on_ranks.hpp"
#include "s3_test_env.hpp"

#include <doctest/doctest.h>

#include <ckpt/ckpt.hpp>
#include <ckpt/in_process.hpp>
#include <ckpt/s3.hpp>
#include <ckpt/s3/mirror.hpp>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

using namespace s3test;

namespace {

/// Runs a shell command; returns its exit status and standard output.
std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
std::string aws(const std::string& args) {
  const auto [rc, out] = shell("aws --endpoint-url " + env("CKPT_TEST_S3_ENDPOINT") + " " + args);
  const bool ok = rc == 0;
  const std::string said = out;  // doctest's macros are lambdas, which cannot name a structured binding in C++20
  REQUIRE_MESSAGE(ok, "aws ", args, " failed: ", said);
  return out;
}

std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937_64 g(seed);
  for (auto& b : v) b = static_cast<std::byte>(g());
  return v;
}

void put(ckpt::s3& store, const std::string& key, std::span<const std::byte> bytes, std::size_t piece = 1 << 20) {
  auto w = store.create(key);
  for (std::size_t at = 0; at < bytes.size(); at += piece) w.write(bytes.subspan(at, std::min(piece, bytes.size() - at)));
  w.sync();
  w.publish();
}

std::vector<std::byte> get(const ckpt::s3& store, const std::string& key) {
  const auto n = store.size(key);
  REQUIRE(n);
  std::vector<std::byte> v(*n);
  store.read(key, 0, v);
  return v;
}

/// A model-like state: two weights large enough for multipart uploads, an optimizer group, an
/// RNG and an iteration counter.
struct model {
  std::vector<float> embed = std::vector<float>(3 << 20);  // 12 MiB
  std::vector<float> proj = std::vector<float>(1 << 18);
  std::vector<float> exp_avg = std::vector<float>(1 << 18);
  std::mt19937_64 rng{7};
  std::uint64_t step = 0;

  explicit model(std::uint64_t seed = 1) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n(0.f, 0.02f);
    for (auto* v : {&embed, &proj, &exp_avg})
      for (auto& x : *v) x = n(g);
  }
  template <class V>
  void checkpoint(V& v) {
    v.tensor("embed", ckpt::view(embed.data(), {3 << 10, 1 << 10}));
    v.tensor("proj", proj);
    v.group("optimizer", [&](auto& g) { g.tensor("exp_avg", exp_avg); });
    v.value("rng", rng);
    v.value("step", step);
  }
  bool operator==(const model& o) const {
    return embed == o.embed && proj == o.proj && exp_avg == o.exp_avg && rng == o.rng && step == o.step;
  }
};

/// A 1024 x 1024 weight split by rows over `tp` ranks.
struct tp_rank {
  std::uint32_t rank, tp;
  std::vector<float> w;
  static constexpr std::uint64_t rows = 1024, cols = 1024;
  tp_rank(std::uint32_t r, std::uint32_t n) : rank(r), tp(n) {
    for (std::uint64_t i = rows * r / n; i < rows * (r + 1) / n; ++i)
      for (std::uint64_t j = 0; j < cols; ++j) w.push_back(static_cast<float>(i * cols + j));
  }
  template <class V>
  void checkpoint(V& v) {
    const auto lo = rows * rank / tp, hi = rows * (rank + 1) / tp;
    v.tensor("w", ckpt::view(w.data(), {hi - lo, cols}).sharded({.global_shape = {rows, cols}, .offset = {lo, 0}}));
  }
};

using s3_checkpointer = ckpt::checkpointer<ckpt::single_process, ckpt::s3>;

/// A Storage that counts the bytes loads ask of the s3 store underneath.
struct counting_s3 {
  static constexpr bool concurrent_reads = true;
  static constexpr std::size_t read_piece_bytes = ckpt::s3::read_piece_bytes;
  ckpt::s3 inner;
  std::shared_ptr<std::atomic<std::uint64_t>> bytes = std::make_shared<std::atomic<std::uint64_t>>(0);
  auto create(std::string_view k) { return inner.create(k); }
  void read(std::string_view k, std::uint64_t o, std::span<std::byte> out) const {
    *bytes += out.size();
    inner.read(k, o, out);
  }
  auto size(std::string_view k) const { return inner.size(k); }
  auto list(std::string_view k) const { return inner.list(k); }
  void remove(std::string_view k) { inner.remove(k); }
  void remove_all(std::string_view k) { inner.remove_all(k); }
  auto describe(std::string_view k) const { return inner.describe(k); }
};

}  // namespace

TEST_CASE("s3 Storage: small and multipart objects, ranges, listing, deletes, odd keys") {
  ckpt::s3 store{options("storage")};
  const auto small = random_bytes(1000, 1);
  put(store, "a/small.bin", small);
  CHECK(store.size("a/small.bin") == 1000);
  std::vector<std::byte> mid(100);
  store.read("a/small.bin", 450, mid);
  CHECK(std::equal(mid.begin(), mid.end(), small.begin() + 450));

  // 23 MiB: four full 5 MiB parts and a short last one, three in flight at a time.
  const auto big = random_bytes((23u << 20) + 12345, 2);
  put(store, "big.bin", big, 3 << 20);
  CHECK(store.size("big.bin") == big.size());
  CHECK(get(store, "big.bin") == big);  // ranges of 2 MiB, four at a time
  std::vector<std::byte> across((5u << 20) + 77);
  store.read("big.bin", (5u << 20) - 33, across);  // crosses two part boundaries' worth of ranges
  CHECK(std::equal(across.begin(), across.end(), big.begin() + (5 << 20) - 33));

  const std::string odd = "odd dir/key with spaces+plus&amp=\xC3\xA9~.bin";
  put(store, odd, small);
  CHECK(get(store, odd) == small);

  CHECK(store.list("") == std::vector<std::string>{"a", "big.bin", "odd dir"});
  CHECK(store.list("a") == std::vector<std::string>{"small.bin"});
  CHECK(store.list("nothing").empty());

  {  // a writer dropped before publish leaves nothing behind, small or multipart
    auto w = store.create("dropped-small");
    w.write(small);
    auto m = store.create("dropped-multipart");
    m.write(big);
  }
  CHECK(!store.size("dropped-small"));
  CHECK(!store.size("dropped-multipart"));

  std::vector<std::byte> past(10);
  CHECK_THROWS_WITH_AS(store.read("a/small.bin", 995, past), doctest::Contains("truncated"), ckpt::error);
  try {
    store.read("no/such", 0, past);
    FAIL("no error");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::not_found);
    CHECK(mentions(e.what(), "s3://" + env("CKPT_TEST_S3_BUCKET") + "/tests/storage/no/such"));
  }

  store.remove("big.bin");
  CHECK(!store.size("big.bin"));
  store.remove("big.bin");  // removing what is gone is not an error
  store.remove_all("odd dir");
  store.remove_all("a");
  CHECK(store.list("").empty());
}

TEST_CASE("a checkpointer saves to a bucket and resumes from it; retention deletes old tags") {
  model m;
  {
    s3_checkpointer cp{{}, ckpt::s3{options("resume")}, {.keep_last_n = 2, .chunk_bytes = 1 << 20}};
    for (std::uint64_t step = 100; step <= 400; step += 100) {
      m.step = step;
      m.proj[0] = static_cast<float>(step);
      m.rng.discard(3);
      cp.save(step, m, {.config = {{"hidden", 1024}}});
    }
    std::vector<std::string> tags;
    for (const auto& t : cp.tags()) tags.push_back(t.tag);
    CHECK(tags == std::vector<std::string>{"global_step300", "global_step400"});
  }
  // A fresh process would do this: a new store, latest, load.
  s3_checkpointer cp{{}, ckpt::s3{options("resume")}};
  REQUIRE(cp.latest() == "global_step400");
  model back(99);
  const auto r = cp.load(back, {.config = ckpt::config{{"hidden", 1024}}});
  CHECK(r.iteration == 400);
  CHECK(back == m);

  // A flipped byte in the bucket is caught by ckpt's own checksums on the way in.
  ckpt::s3 raw{options("resume")};
  const auto file = "global_step400/" + raw.list("global_step400")[0];
  std::vector<std::string> shard_files;
  for (const auto& d : raw.list("global_step400"))
    if (d.starts_with("mp_rank")) shard_files.push_back("global_step400/" + d + "/" + raw.list("global_step400/" + d)[0]);
  REQUIRE(shard_files.size() == 1);
  auto bytes = get(raw, shard_files[0]);
  bytes[bytes.size() / 2] ^= std::byte{1};
  put(raw, shard_files[0], bytes);
  CHECK_THROWS_WITH_AS(cp.load(back), doctest::Contains("checksum"), ckpt::error);
  (void)file;
}

TEST_CASE("tp=2 ranks each upload their own shard file; a tp=4 load fetches only the ranges it needs") {
  using test::on_ranks;
  auto errors = on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::s3> cp{{.tp = 2, .comm = comm}, ckpt::s3{options("tp")},
                                                                      {.chunk_bytes = 256 << 10}};
    tp_rank state(r, 2);
    cp.save(1, state);
  });
  CHECK(errors == std::vector<std::string>(2));
  ckpt::s3 raw{options("tp")};
  CHECK(raw.list("global_step1") == std::vector<std::string>{".ckpt_tag", "chunk_map.bin", "metadata.json", "mp_rank_00", "mp_rank_01"});
  const auto file_bytes = *raw.size("global_step1/mp_rank_00/" + raw.list("global_step1/mp_rank_00")[0]);

  std::vector<std::uint64_t> fetched(4);
  errors = on_ranks(4, [&](ckpt::in_process comm, std::uint32_t r) {
    counting_s3 store{ckpt::s3{options("tp")}};
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, counting_s3> cp{{.tp = 4, .comm = comm}, store};
    tp_rank state(r, 4);
    const auto want = state.w;
    std::fill(state.w.begin(), state.w.end(), -1.f);
    cp.load(state);
    CHECK(state.w == want);
    fetched[r] = *store.bytes;
  });
  CHECK(errors == std::vector<std::string>(4));
  for (auto f : fetched) {
    // A quarter of the tensor (1 MiB) and the file's index, not the 2 MiB shard file.
    CHECK(f >= (1u << 20));
    CHECK(f < file_bytes * 3 / 4);
  }
  MESSAGE("tp=4 load from a tp=2 save: each rank fetched ", fetched[0], "..", fetched[3], " bytes of a ", file_bytes, "-byte shard file");
}

TEST_CASE("awscli lists and downloads what ckpt uploaded, byte-identical; ckpt loads a tag awscli uploaded") {
  model m;
  m.step = 5;
  {
    s3_checkpointer cp{{}, ckpt::s3{options("awscli")}, {.chunk_bytes = 1 << 20}};
    cp.save(5, m);
  }
  ckpt::s3 raw{options("awscli")};
  const auto bucket = "s3://" + env("CKPT_TEST_S3_BUCKET");
  const auto listing = aws("s3 ls --recursive " + bucket + "/tests/awscli/");
  std::set<std::string> listed;
  std::istringstream in(listing);
  for (std::string line; std::getline(in, line);)
    if (auto at = line.find("tests/awscli/"); at != std::string::npos) listed.insert(line.substr(at + 13));
  std::set<std::string> ours;
  for (const auto& e : raw.list("global_step5")) {
    if (raw.size("global_step5/" + e)) {
      ours.insert("global_step5/" + e);
    } else {
      for (const auto& f : raw.list("global_step5/" + e)) ours.insert("global_step5/" + e + "/" + f);
    }
  }
  ours.insert("latest");
  CHECK(listed == ours);

  const fs::path dl = fs::temp_directory_path() / ("ckpt-s3-awscli-" + std::to_string(::getpid()));
  fs::remove_all(dl);
  aws("s3 cp --recursive --only-show-errors " + bucket + "/tests/awscli/ " + dl.string());
  for (const auto& key : ours) {
    std::ifstream f(dl / key, std::ios::binary);
    std::vector<char> local((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const auto remote = get(raw, key);
    CAPTURE(key);
    CHECK(local.size() == remote.size());
    CHECK(std::memcmp(local.data(), remote.data(), local.size()) == 0);
  }

  // The other way: a checkpoint saved to local disk, uploaded by awscli, loaded by ckpt.
  const fs::path local = dl / "local";
  model other(3);
  other.step = 9;
  {
    ckpt::checkpointer<> cp{{}, local, {.chunk_bytes = 1 << 20}};
    cp.save(9, other);
  }
  aws("s3 cp --recursive --only-show-errors " + local.string() + " " + bucket + "/tests/from-awscli/");
  s3_checkpointer cp{{}, ckpt::s3{options("from-awscli")}};
  model back(99);
  CHECK(cp.load(back).iteration == 9);
  CHECK(back == other);
  fs::remove_all(dl);
}

TEST_CASE("through the fault proxy: 503s, SlowDown, resets, stalls and cut answers are retried") {
  control("DELETE", "/log");
  control("POST", "/faults",
          R"({"rules": [
            {"match": {"method": "PUT", "query": "partNumber"}, "action": "status", "status": 503, "times": 2},
            {"match": {"method": "POST", "query": "uploads"}, "action": "reset", "times": 1},
            {"match": {"method": "PUT"}, "action": "status", "status": 500, "times": 1, "skip": 3},
            {"match": {"method": "GET", "path": "mp_rank"}, "action": "stall", "seconds": 4, "times": 1},
            {"match": {"method": "GET"}, "action": "truncate", "times": 1, "skip": 2},
            {"match": {"method": "HEAD"}, "action": "reset", "times": 1}
          ]})");
  model m;
  m.step = 11;
  s3_checkpointer cp{{}, ckpt::s3{options("faults", true)}, {.chunk_bytes = 1 << 20}};
  cp.save(11, m);
  model back(99);
  CHECK(cp.load(back).iteration == 11);
  CHECK(back == m);
  control("DELETE", "/faults");
  const auto log = request_log();
  CHECK(count(log, " 503") >= 2);
  CHECK(count(log, " reset") >= 2);
  CHECK(count(log, " stall") == 1);
  CHECK(count(log, " truncate") == 1);
  MESSAGE("fault proxy: ", log.size(), " requests, ", count(log, " 503"), " answered 503, ", count(log, " reset"),
          " reset, 1 stalled, 1 cut short; save and load succeeded");
}

TEST_CASE("a 4xx is not retried and names S3's code and the key; nothing is committed") {
  model m;
  s3_checkpointer cp{{}, ckpt::s3{options("denied", true)}};
  cp.save(1, m);
  control("DELETE", "/log");
  control("POST", "/faults",
          R"({"rules": [{"match": {"method": "PUT", "path": "metadata.json"}, "action": "status", "status": 403,
                         "code": "AccessDenied", "message": "Access Denied", "times": 1}]})");
  m.step = 2;
  try {
    cp.save(2, m);
    FAIL("no error");
  } catch (const ckpt::error& e) {
    const std::string msg = e.what();
    CHECK(mentions(msg, "HTTP 403 AccessDenied: Access Denied"));
    CHECK(mentions(msg, "tests/denied/global_step2/metadata.json"));
    CHECK(!mentions(msg, "S3RVER"));  // the secret (and key id) of the test credentials
  }
  control("DELETE", "/faults");
  const auto log = request_log();
  const auto puts = std::count_if(log.begin(), log.end(), [](const auto& l) { return l.starts_with("PUT ") && mentions(l, "metadata.json"); });
  CHECK(puts == 1);  // once: not retried
  CHECK(cp.latest() == "global_step1");
  model back(99);
  CHECK(cp.load(back).iteration == 1);
}

TEST_CASE("an upload that keeps failing is aborted: no commit, and every multipart upload begun is aborted") {
  model m;
  auto o = options("abort", true);
  o.retry.max_attempts = 3;
  s3_checkpointer cp{{}, ckpt::s3{o}};
  cp.save(1, m);
  control("DELETE", "/log");
  control("POST", "/faults",
          R"({"rules": [{"match": {"method": "PUT", "query": "partNumber"}, "action": "status", "status": 503, "times": 1000, "skip": 1}]})");
  m.step = 2;
  CHECK_THROWS_WITH_AS(cp.save(2, m), doctest::Contains("after 3 attempts"), ckpt::error);
  control("DELETE", "/faults");
  const auto log = request_log();
  const auto begun = count(log, "?uploads");
  CHECK(begun >= 1);
  // s3rver 3.7.1 does not implement AbortMultipartUpload (it answers 405), so what is checked
  // is that ckpt asked for it, once for each upload it began and did not complete.
  const auto completed = static_cast<std::size_t>(std::count_if(log.begin(), log.end(), [](const auto& l) {
    return l.starts_with("POST ") && mentions(l, "uploadId=");
  }));
  const auto aborted = static_cast<std::size_t>(std::count_if(log.begin(), log.end(), [](const auto& l) {
    return l.starts_with("DELETE ") && mentions(l, "uploadId=");
  }));
  CHECK(completed + aborted == begun);
  CHECK(aborted >= 1);
  CHECK(cp.latest() == "global_step1");
  ckpt::s3 raw{options("abort")};
  CHECK(!raw.size("global_step2/metadata.json"));
  model back(99);
  CHECK(cp.load(back).iteration == 1);
}

TEST_CASE("s3rver killed mid-upload: a clear error, no commit; after a restart the last good tag loads") {
  model m;
  auto o = options("killed", true);
  o.retry = {.max_attempts = 4, .base_delay = std::chrono::milliseconds(50), .max_delay = std::chrono::milliseconds(300)};
  {
    s3_checkpointer cp{{}, ckpt::s3{o}};
    cp.save(1, m);
  }
  control("DELETE", "/log");
  // The second part waits two seconds at the proxy, so the kill lands mid-upload.
  control("POST", "/faults",
          R"({"rules": [{"match": {"method": "PUT", "query": "partNumber"}, "action": "stall", "seconds": 2, "times": 1, "skip": 1}]})");
  std::string failure;
  std::thread saver([&] {
    try {
      s3_checkpointer cp{{}, ckpt::s3{o}};
      m.step = 2;
      cp.save(2, m);
    } catch (const ckpt::error& e) {
      failure = e.what();
    }
  });
  for (int i = 0; i < 200 && count(request_log(), "partNumber") < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  control("POST", "/kill");
  saver.join();
  CHECK(!failure.empty());
  CHECK(mentions(failure, "s3://" + env("CKPT_TEST_S3_BUCKET") + "/tests/killed/global_step2/"));
  MESSAGE("the save's error: ", failure);
  control("DELETE", "/faults");
  control("POST", "/restart");
  s3_checkpointer cp{{}, ckpt::s3{options("killed")}};
  CHECK(cp.latest() == "global_step1");
  ckpt::s3 raw{options("killed")};
  CHECK(!raw.size("global_step2/metadata.json"));
  model back(99);
  CHECK(cp.load(back).iteration == 1);
  // The next save's retention removes what the failed one left.
  m.step = 3;
  cp.save(3, m);
  CHECK(raw.list("") == std::vector<std::string>{"global_step1", "global_step3", "latest"});
}

TEST_CASE("mirror mode: saves go to local disk, committed tags follow to the bucket in the background") {
  const fs::path local = fs::temp_directory_path() / ("ckpt-s3-mirror-" + std::to_string(::getpid()));
  fs::remove_all(local);
  model m;
  ckpt::checkpointer<> cp{{}, local, {.chunk_bytes = 1 << 20}};
  {
    ckpt::s3_mirror mirror{local, ckpt::s3{options("mirror")}, {.keep_last_n = 2}};
    for (std::uint64_t step = 1; step <= 3; ++step) {
      m.step = step;
      cp.save(step, m);
      mirror.upload(*cp.latest());
    }
    mirror.wait();
    const auto st = mirror.status();
    REQUIRE(st.size() == 3);
    for (const auto& s : st) {
      CHECK(s.now == ckpt::s3_mirror_status::state::done);
      CHECK(s.bytes_done == s.bytes_total);
      CHECK(s.bytes_total > 12u << 20);
    }
    CHECK_THROWS_WITH_AS(mirror.upload("global_step99"), doctest::Contains("not a committed tag"), ckpt::error);
  }
  s3_checkpointer remote{{}, ckpt::s3{options("mirror")}};
  CHECK(remote.latest() == "global_step3");
  std::vector<std::string> tags;
  for (const auto& t : remote.tags()) tags.push_back(t.tag);
  CHECK(tags == std::vector<std::string>{"global_step2", "global_step3"});
  model back(99);
  CHECK(remote.load(back).iteration == 3);
  CHECK(back == m);

  SUBCASE("a failed upload is reported by status() and wait(), and latest is not uploaded") {
    control("POST", "/faults", R"({"rules": [{"match": {"path": "metadata.json"}, "action": "status", "status": 403, "code": "AccessDenied", "times": 1}]})");
    auto o = options("mirror-fail", true);
    ckpt::s3_mirror mirror{local, ckpt::s3{o}};
    mirror.upload(*cp.latest());
    CHECK_THROWS_WITH_AS(mirror.wait(), doctest::Contains("AccessDenied"), ckpt::error);
    CHECK(mirror.status()[0].now == ckpt::s3_mirror_status::state::failed);
    control("DELETE", "/faults");
    ckpt::s3 raw{options("mirror-fail")};
    CHECK(!raw.size("latest"));
  }
  SUBCASE("a bandwidth limit is kept") {
    ckpt::s3_mirror mirror{local, ckpt::s3{options("mirror-slow")}, {.bytes_per_second = 40u << 20}};
    const auto t0 = std::chrono::steady_clock::now();
    mirror.upload(*cp.latest());
    CHECK(mirror.status()[0].now != ckpt::s3_mirror_status::state::done);  // upload returned at once
    mirror.wait();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto bytes = mirror.status()[0].bytes_total;
    CHECK(secs >= static_cast<double>(bytes) / (40u << 20) * 0.9);
  }
  fs::remove_all(local);
}
