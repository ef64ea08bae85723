// Save then load, against every Storage: all dtypes, empty and scalar tensors, chunked
// tensors, values and RNG streams, tag resolution.

#include "helpers.hpp"

#include <filesystem>

using test::every_dtype_state;

TEST_CASE_TEMPLATE("every dtype, empty and scalar tensors round-trip exactly", B, test::posix_backend,
                   test::memory_backend) {
  B backend;
  for (std::uint64_t chunk : {std::uint64_t{64}, std::uint64_t{4} << 20}) {
    CAPTURE(chunk);
    ckpt::checkpointer<ckpt::single_process, typename B::storage> cp{{}, backend.make(), {.chunk_bytes = chunk}};
    every_dtype_state saved;
    saved.randomise(chunk);
    cp.save(7 + chunk, saved);
    every_dtype_state loaded;
    loaded.randomise(1000);
    REQUIRE_FALSE(loaded == saved);
    const auto r = cp.load(loaded);
    CHECK(r.iteration == 7 + chunk);
    CHECK(r.tag == "global_step" + std::to_string(7 + chunk));
    CHECK(r.missing.empty());
    CHECK(r.unexpected.empty());
    CHECK(loaded == saved);
  }
}

TEST_CASE_TEMPLATE("values and RNG streams continue identically after a load", B, test::posix_backend,
                   test::memory_backend) {
  B backend;
  ckpt::checkpointer<ckpt::single_process, typename B::storage> cp{{}, backend.make()};
  every_dtype_state a;
  a.randomise(5);
  cp.save(1, a);
  every_dtype_state b;
  cp.load(b);
  for (int i = 0; i < 1000; ++i) {
    REQUIRE(a.rng() == b.rng());
    REQUIRE(a.rng64() == b.rng64());
    REQUIRE(a.noise(a.rng) == b.noise(b.rng));
  }
  CHECK(b.note == "seed 5");
  CHECK(b.table.at("a") == 5);
}

TEST_CASE_TEMPLATE("load resolves latest, a tag or an iteration", B, test::posix_backend, test::memory_backend) {
  B backend;
  ckpt::checkpointer<ckpt::single_process, typename B::storage> cp{{}, backend.make()};
  every_dtype_state s;
  for (std::uint64_t it : {10u, 20u, 30u}) {
    s.randomise(it);
    cp.save(it, s);
  }
  s.randomise(77);
  cp.save(40, s, {.tag = "best"});
  CHECK(cp.latest() == "best");

  every_dtype_state x;
  CHECK(cp.load(x).tag == "best");
  CHECK(x.counter == 77 * 7);
  CHECK(cp.load(x, {.iteration = 20}).tag == "global_step20");
  CHECK(x.counter == 20 * 7);
  CHECK(cp.load(x, {.iteration = 40}).tag == "best");  // found through the metadata of custom tags
  CHECK(cp.load(x, {.tag = "global_step10"}).iteration == 10);
  CHECK(x.counter == 10 * 7);

  const auto tags = cp.tags();
  REQUIRE(tags.size() == 4);
  CHECK(tags[0].tag == "global_step10");
  CHECK(tags[3].tag == "best");
  CHECK(tags[3].latest);

  auto e = test::catch_error([&] { cp.load(x, {.iteration = 15}); });
  CHECK(e.kind() == ckpt::error_kind::not_found);
  CHECK(std::string(e.what()).find("iteration 15") != std::string::npos);
  CHECK(std::string(e.what()).find("global_step10") != std::string::npos);
  CHECK(std::string(e.what()).find("best (latest)") != std::string::npos);
  e = test::catch_error([&] { cp.load(x, {.tag = "global_step11"}); });
  CHECK(e.kind() == ckpt::error_kind::not_found);
  CHECK(std::string(e.what()).find("global_step30") != std::string::npos);
  e = test::catch_error([&] { cp.load(x, {.tag = "../etc"}); });
  CHECK(e.kind() == ckpt::error_kind::invalid_argument);
}

TEST_CASE("an empty root has nothing to load") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path()};
  every_dtype_state s;
  const auto e = test::catch_error([&] { cp.load(s); });
  CHECK(e.kind() == ckpt::error_kind::not_found);
  CHECK(std::string(e.what()).find("latest") != std::string::npos);
  CHECK_FALSE(cp.latest());
  CHECK(cp.tags().empty());
}

TEST_CASE("the posix layout is the NeoX/Megatron one") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path()};
  every_dtype_state s;
  s.randomise(3);
  cp.save(200, s);
  namespace fs = std::filesystem;
  CHECK(fs::is_regular_file(dir.path() / "latest"));
  CHECK(fs::is_regular_file(dir.path() / "global_step200" / "metadata.json"));
  CHECK(fs::is_regular_file(dir.path() / "global_step200" / "mp_rank_00" / "model_optim_rng.ckpt"));
  for (const auto& e : fs::recursive_directory_iterator(dir.path()))
    CHECK_MESSAGE(e.path().string().find(".tmp.") == std::string::npos, "temporary file left behind: " << e.path());
  // The header block alone takes 4 KiB (docs/format.md, section 6).
  const auto size = fs::file_size(dir.path() / "global_step200" / "mp_rank_00" / "model_optim_rng.ckpt");
  CHECK(size > 4096);
}

TEST_CASE("a large tensor is split into checksummed chunks and loads back") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem, {.chunk_bytes = 1000}};
  struct big {
    std::vector<float> w = std::vector<float>(3 * 1000);
    std::vector<std::int16_t> line = std::vector<std::int16_t>(2001);
    void checkpoint(ckpt::visitor& v) {
      v.tensor("w", ckpt::view(w, {3, 10, 100}));
      v.tensor("line", line);
    }
  } a, b;
  test::fill_random(a.w, 1);
  test::fill_random(a.line, 2);
  cp.save(1, a);
  const auto r = cp.load(b);
  CHECK(a.w == b.w);
  CHECK(a.line == b.line);
  CHECK(r.bytes_read >= a.w.size() * 4 + a.line.size() * 2);
}

TEST_CASE("save rejects bad names and tags before writing anything") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  struct named {
    std::string name;
    float x = 0;
    void checkpoint(ckpt::visitor& v) {
      v.tensor(name, x);
    }
  };
  for (const std::string& bad : std::vector<std::string>{"", "a..b", ".a", "a.", "a/b", "a\\b", std::string("a\0b", 3), "a\nb", "__ckpt.x"}) {
    CAPTURE(bad);
    named s{bad};
    const auto e = test::catch_error([&] { cp.save(1, s); });
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
  }
  named ok{"fine"};
  for (const std::string& bad : std::vector<std::string>{"", "../x", "a/b", "latest", ".hidden", "x y"}) {
    CAPTURE(bad);
    const auto e = test::catch_error([&] { cp.save(1, ok, {.tag = bad}); });
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
  }
  CHECK(mem.keys().empty());

  struct twice {
    float x = 0, y = 0;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("x", x);
      v.group("g", [&](auto& g) { g.tensor("y", y); });
      v.tensor("g.y", y);
    }
  } t;
  const auto e = test::catch_error([&] { cp.save(1, t); });
  CHECK(std::string(e.what()).find("'g.y' twice") != std::string::npos);
}

TEST_CASE("saving over the tag latest names is refused; an older tag is replaced") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  every_dtype_state s;
  s.randomise(1);
  cp.save(1, s);
  s.randomise(2);
  cp.save(2, s);
  const auto e = test::catch_error([&] { cp.save(2, s); });
  CHECK(e.kind() == ckpt::error_kind::invalid_argument);
  CHECK(std::string(e.what()).find("latest") != std::string::npos);
  s.randomise(11);
  const auto e2 = test::catch_error([&] { cp.save(1, s, {.overwrite = false}); });
  CHECK(std::string(e2.what()).find("already committed") != std::string::npos);
  cp.save(1, s);  // replaces the older global_step1 and makes it latest
  every_dtype_state x;
  CHECK(cp.load(x).iteration == 1);
  CHECK(x == s);
}

namespace thirdparty {
struct adam {
  std::vector<float> m = std::vector<float>(4), v = std::vector<float>(4);
  long step = 0;
};
class secret {
  friend class ckpt::access;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("hidden", hidden_);
  }
  std::vector<double> hidden_ = {1, 2, 3};

 public:
  std::vector<double>& hidden() { return hidden_; }
};
}  // namespace thirdparty

template <>
struct ckpt::checkpoint_traits<thirdparty::adam> {
  static void checkpoint(ckpt::visitor& v, thirdparty::adam& a) {
    v.tensor("m", a.m);
    v.tensor("v", a.v);
    v.value("step", a.step);
  }
};

TEST_CASE("traits specialisations, private members and nested states") {
  struct model {
    thirdparty::adam opt;
    thirdparty::secret s;
    void checkpoint(ckpt::visitor& v) {
      v.group("optimizer", opt);
      v.group("inner", s);
    }
  } a, b;
  a.opt.m = {1, 2, 3, 4};
  a.opt.step = 9;
  a.s.hidden() = {4, 5, 6};
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  cp.save(1, a);
  cp.load(b);
  CHECK(b.opt.m == a.opt.m);
  CHECK(b.opt.step == 9);
  CHECK(b.s.hidden() == a.s.hidden());
}

TEST_CASE("a tensor on a device the DevicePolicy does not handle is refused at save") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem};
  std::vector<float> host(4);
  struct on_gpu {
    float* p;
    void checkpoint(ckpt::visitor& v) { v.tensor("w", ckpt::view(p, {4}, ckpt::device::cuda(0))); }
  } s{host.data()};
  const auto e = test::catch_error([&] { cp.save(1, s); });
  CHECK(e.kind() == ckpt::error_kind::invalid_argument);
  CHECK(std::string(e.what()).find("DevicePolicy") != std::string::npos);
  CHECK(mem.keys().empty());
}
