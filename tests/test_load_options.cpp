// What load can be asked to do: skip the optimizer, strict and non-strict matching, shape and
// dtype checks, the config check, and forward-pass validation logits.

#include "helpers.hpp"
#include "on_ranks.hpp"

#include <ckpt/in_process.hpp>

#include <thread>

using test::catch_error;
using test::every_dtype_state;

namespace {
struct small {
  std::vector<float> w = std::vector<float>(6);
  std::vector<float> m = std::vector<float>(6);
  std::int64_t step = 0;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", ckpt::view(w, {2, 3}));
    v.group("optimizer", [&](auto& g) {
      g.tensor("m", m);
      g.value("step", step);
    });
  }
};

ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> make(ckpt::memory_storage& mem) {
  return {{}, mem};
}

bool contains(const ckpt::error& e, const std::string& s) { return std::string(e.what()).find(s) != std::string::npos; }
}  // namespace

TEST_CASE("load_optimizer = false leaves the optimizer group alone") {
  ckpt::memory_storage mem;
  auto cp = make(mem);
  small a;
  a.w = {1, 2, 3, 4, 5, 6};
  a.m = {9, 9, 9, 9, 9, 9};
  a.step = 12;
  cp.save(3, a);
  small b;
  const auto r = cp.load(b, {.load_optimizer = false});
  CHECK(b.w == a.w);
  CHECK(b.m == std::vector<float>(6, 0.f));
  CHECK(b.step == 0);
  CHECK(r.skipped == std::vector<std::string>{"optimizer.m", "optimizer.step"});
  // The same through skip_groups, and a strict load still passes: skipped entries are expected.
  small c;
  cp.load(c, {.skip_groups = {"optimizer"}, .strict = true});
  CHECK(c.step == 0);
}

TEST_CASE("strict load names every missing and unexpected entry; non-strict lists them") {
  ckpt::memory_storage mem;
  auto cp = make(mem);
  small a;
  cp.save(1, a);
  struct other {
    std::vector<float> w = std::vector<float>(6);
    std::vector<float> extra = std::vector<float>(2), extra2 = std::vector<float>(2);
    int epoch = 0;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("w", ckpt::view(w, {2, 3}));
      v.tensor("extra", extra);
      v.tensor("extra2", extra2);
      v.value("epoch", epoch);
    }
  } o;
  const auto e = catch_error([&] { cp.load(o); });
  CHECK(e.kind() == ckpt::error_kind::mismatch);
  CHECK(contains(e, "missing from the checkpoint: 'extra', 'extra2', 'epoch'"));
  CHECK(contains(e, "not in the live state: 'optimizer.m', 'optimizer.step'"));

  a.w = {6, 5, 4, 3, 2, 1};
  cp.save(2, a);
  const auto r = cp.load(o, {.strict = false});
  CHECK(o.w == a.w);
  CHECK(r.missing == std::vector<std::string>{"extra", "extra2", "epoch"});
  CHECK(r.unexpected == std::vector<std::string>{"optimizer.m", "optimizer.step"});
}

TEST_CASE("names matched when every stored tensor is live: a stored value named like a live tensor is not unexpected") {
  ckpt::memory_storage mem;
  auto cp = make(mem);
  struct saved_state {
    std::vector<float> a = std::vector<float>(2, 1.f);
    int step = 4;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("a", a);
      v.value("step", step);
    }
  } s;
  cp.save(1, s);
  // Every stored tensor ('a') is live; 'step' is a tensor now, which the checkpoint lacks.
  struct live_state {
    std::vector<float> a = std::vector<float>(2), step = std::vector<float>(1);
    void checkpoint(ckpt::visitor& v) {
      v.tensor("a", a);
      v.tensor("step", step);
    }
  } l;
  const auto r = cp.load(l, {.strict = false});
  CHECK(l.a == s.a);
  CHECK(r.missing == std::vector<std::string>{"step"});
  CHECK(r.unexpected.empty());
  CHECK(r.skipped.empty());
  // Every stored tensor live, one live tensor more: only it is missing.
  struct more {
    std::vector<float> a = std::vector<float>(2), b = std::vector<float>(3);
    int step = 0;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("a", a);
      v.tensor("b", b);
      v.value("step", step);
    }
  } m;
  const auto r2 = cp.load(m, {.strict = false});
  CHECK(m.step == 4);
  CHECK(r2.missing == std::vector<std::string>{"b"});
  CHECK(r2.unexpected.empty());
}

TEST_CASE("shape and dtype mismatches name the tensor and both sides") {
  ckpt::memory_storage mem;
  auto cp = make(mem);
  small a;
  a.step = 12;
  cp.save(1, a);
  struct reshaped {
    std::vector<float> w = std::vector<float>(6);
    std::vector<float> m = std::vector<float>(6);
    std::int64_t step = 0;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("w", ckpt::view(w, {3, 2}));
      v.group("optimizer", [&](auto& g) {
        g.tensor("m", m);
        g.value("step", step);
      });
    }
  } r;
  auto e = catch_error([&] { cp.load(r); });
  CHECK(e.kind() == ckpt::error_kind::mismatch);
  CHECK(contains(e, "tensor 'w': saved f32 [2, 3], live f32 [3, 2]"));

  struct retyped {
    std::vector<double> w = std::vector<double>(6);
    std::vector<float> m = std::vector<float>(6);
    std::int64_t step = 0;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("w", ckpt::view(w, {2, 3}));
      v.group("optimizer", [&](auto& g) {
        g.tensor("m", m);
        g.value("step", step);
      });
    }
  } t;
  e = catch_error([&] { cp.load(t); });
  CHECK(contains(e, "tensor 'w': saved f32 [2, 3], live f64 [2, 3]"));

  struct revalued {
    std::vector<float> w = std::vector<float>(6);
    std::vector<float> m = std::vector<float>(6);
    std::string step;  // was an int64
    void checkpoint(ckpt::visitor& v) {
      v.tensor("w", ckpt::view(w, {2, 3}));
      v.group("optimizer", [&](auto& g) {
        g.tensor("m", m);
        g.value("step", step);
      });
    }
  } rv;
  e = catch_error([&] { cp.load(rv); });
  CHECK(e.kind() == ckpt::error_kind::mismatch);
  CHECK(contains(e, "value 'optimizer.step'"));
}

TEST_CASE("loading into a read-only view is an error") {
  ckpt::memory_storage mem;
  auto cp = make(mem);
  const std::vector<float> data(4, 1.f);
  struct ro {
    const std::vector<float>* d;
    void checkpoint(ckpt::visitor& v) {
      v.tensor("d", ckpt::view(d->data(), {4}));
    }
  } s{&data};
  cp.save(1, s);
  const auto e = catch_error([&] { cp.load(s); });
  CHECK(e.kind() == ckpt::error_kind::invalid_argument);
  CHECK(contains(e, "read-only"));
}

TEST_CASE("config check reports every differing key with both values") {
  ckpt::memory_storage mem;
  auto cp = make(mem);
  small a;
  const ckpt::config saved{{"hidden_size", 1024}, {"num_layers", 24}, {"lr", 3e-4}, {"precision", "bf16"}, {"tied", true}};
  cp.save(200, a, {.config = saved});
  small b;
  const ckpt::config live{{"hidden_size", 2048}, {"num_layers", 24}, {"lr", 1e-4}, {"precision", "bf16"}, {"seq", 2048}};
  auto e = catch_error([&] { cp.load(b, {.config = live}); });
  CHECK(e.kind() == ckpt::error_kind::mismatch);
  CHECK(contains(e, "config mismatch in "));
  CHECK(contains(e, "global_step200/metadata.json"));
  CHECK(contains(e, "hidden_size saved 1024, current 2048"));
  CHECK(contains(e, "lr saved 3e-04, current 1e-04"));
  CHECK(contains(e, "seq saved (absent), current 2048"));
  CHECK(contains(e, "tied saved true, current (absent)"));
  CHECK_FALSE(contains(e, "num_layers"));
  CHECK_FALSE(contains(e, "precision"));

  e = catch_error([&] { cp.load(b, {.config = live, .ignore_config_keys = {"lr", "seq", "tied"}}); });
  CHECK(contains(e, "hidden_size"));
  CHECK_FALSE(contains(e, "lr saved"));

  const auto r = cp.load(b, {.config = live, .ignore_config_keys = {"hidden_size", "lr", "seq", "tied"}});
  CHECK(r.config == saved);
  cp.load(b, {.config = live, .check_config = false});
  cp.load(b, {.config = saved});
  cp.load(b);  // no live config: nothing to compare
}

TEST_CASE("validation logits: a reproduced forward pass passes, a different one fails with the worst element") {
  ckpt::memory_storage mem;
  auto cp = make(mem);
  small a;
  std::vector<float> logits(4 * 10);
  test::fill_random(logits, 4);
  cp.save(1, a, {.validation_logits = ckpt::view(logits, {4, 10})});

  small b;
  auto fresh = logits;
  cp.load(b, {.validation_logits = ckpt::view(fresh, {4, 10})});
  fresh[13] += 1e-9f * std::abs(fresh[13]);  // within rtol
  cp.load(b, {.validation_logits = ckpt::view(fresh, {4, 10})});

  fresh = logits;
  fresh[23] += 0.5f;
  fresh[7] += 0.01f;
  auto e = catch_error([&] { cp.load(b, {.validation_logits = ckpt::view(fresh, {4, 10})}); });
  CHECK(e.kind() == ckpt::error_kind::mismatch);
  CHECK(contains(e, "2 of 40 elements outside rtol=1e-05 atol=1e-08"));
  CHECK(contains(e, "max abs difference 0.4999999"));
  CHECK(contains(e, "at [2, 3]"));
  // Looser tolerances accept it.
  cp.load(b, {.validation_logits = ckpt::view(fresh, {4, 10}), .rtol = 0, .atol = 0.6});

  // bf16 logits compared against the f32 ones saved.
  std::vector<ckpt::bfloat16> half(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) half[i] = ckpt::bfloat16(logits[i]);
  cp.load(b, {.validation_logits = ckpt::view(half, {4, 10}), .rtol = 1e-2, .atol = 1e-3});
  e = catch_error([&] { cp.load(b, {.validation_logits = ckpt::view(half, {4, 10})}); });
  CHECK(contains(e, "validation logits differ"));

  std::vector<float> wrong(12);
  e = catch_error([&] { cp.load(b, {.validation_logits = ckpt::view(wrong, {3, 4})}); });
  CHECK(contains(e, "saved shape [4, 10], current [3, 4]"));

  cp.save(2, a);
  e = catch_error([&] { cp.load(b, {.validation_logits = ckpt::view(fresh, {4, 10})}); });
  CHECK(e.kind() == ckpt::error_kind::not_found);
  // A strict load ignores the stored logits when no check is asked for.
  cp.load(b, {.iteration = 1});
}

// ---- state created on load (visitor::saved) -----------------------------------------------------

namespace {
/// An engine whose optimizer moments exist only after its first step: checkpoint() creates
/// them on load, with the saved size, when the checkpoint has them. At tp > 1 this rank holds
/// one slice of the 8 elements.
struct lazy_moments {
  std::uint64_t tp = 1, rank = 0;
  std::vector<float> w;
  std::vector<float> exp_avg;  // empty until the first step
  std::int64_t step = 0;
  bool saw_saved_on_save = false;
  explicit lazy_moments(std::uint64_t tp_ = 1, std::uint64_t rank_ = 0) : tp(tp_), rank(rank_), w(8 / tp_) {}
  ckpt::shard_spec spec() const { return {.global_shape = {8}, .offset = {rank * w.size()}}; }
  void first_step() {
    exp_avg.resize(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) exp_avg[i] = static_cast<float>(rank * w.size() + i) + 0.5f;
    step = 1;
  }
  void checkpoint(ckpt::visitor& v) {
    v.tensor("w", ckpt::view(w, {w.size()}).sharded(spec()));
    v.group("optimizer", [&](ckpt::visitor& g) {
      if (!g.loading() && g.saved("exp_avg")) saw_saved_on_save = true;
      if (const auto s = g.saved("exp_avg"); s && exp_avg.empty()) {
        // The global shape: this rank takes its slice. (Thrown, not CHECKed: ranks are threads.)
        if (s->type != ckpt::dtype::f32 || s->shape != ckpt::shape_t{8}) throw std::runtime_error("saved() told another dtype or shape");
        exp_avg.resize(s->numel() / tp);
      }
      if (!exp_avg.empty()) {
        g.tensor("exp_avg", ckpt::view(exp_avg, {exp_avg.size()}).sharded(spec()));
        g.value("step", step);
      }
    });
  }
};
}  // namespace

TEST_CASE("state that exists only after the first step is created on load with the saved shape") {
  ckpt::memory_storage mem;
  lazy_moments stepped;
  stepped.first_step();
  make(mem).save(1, stepped);
  CHECK_FALSE(stepped.saw_saved_on_save);  // saved() answers nothing on save

  lazy_moments fresh;  // never stepped
  const auto r = make(mem).load(fresh, {.strict = true});  // strict: the created tensor counts as present
  CHECK(r.missing.empty());
  CHECK(r.unexpected.empty());
  CHECK(fresh.exp_avg == stepped.exp_avg);
  CHECK(fresh.step == 1);

  SUBCASE("a checkpoint from before the first step creates nothing") {
    ckpt::memory_storage early;
    lazy_moments never;
    make(early).save(0, never);
    lazy_moments into;
    make(early).load(into, {.strict = true});
    CHECK(into.exp_avg.empty());
  }
  SUBCASE("a skipped optimizer group is not created") {
    lazy_moments into;
    const auto skipped = make(mem).load(into, {.load_optimizer = false});
    CHECK(into.exp_avg.empty());
    CHECK(skipped.skipped.size() == 2);
  }
  SUBCASE("saved_value and names inside groups") {
    struct probe {
      bool step = false, nothing = true, outside = true;
      void checkpoint(ckpt::visitor& v) {
        v.group("optimizer", [&](ckpt::visitor& g) {
          step = g.saved_value("step");
          nothing = g.saved_value("exp_avg") || g.saved("nothing").has_value();
        });
        outside = v.saved("exp_avg").has_value();  // it is optimizer.exp_avg, not exp_avg
      }
    } p;
    make(mem).load(p, {.strict = false});
    CHECK(p.step);
    CHECK_FALSE(p.nothing);
    CHECK_FALSE(p.outside);
  }
}

TEST_CASE("a load's errors keep their order, and the state's code runs on the caller's thread and never acts on an answer the checkpoint could not give") {
  ckpt::memory_storage mem;
  small saved;
  saved.w = {1, 2, 3, 4, 5, 6};
  make(mem).save(3, saved, {.config = {{"layers", 2}}});
  const std::string md_key = "global_step3/metadata.json";

  // A state that asks what the checkpoint holds, and records where its code ran and how far.
  struct asking {
    small s;
    std::thread::id visited_on;
    bool answered = false;
    bool twice = false;  // names "w" twice: the visit itself fails
    void checkpoint(ckpt::visitor& v) {
      visited_on = std::this_thread::get_id();
      const auto w = v.saved("w");
      answered = true;
      if (w) v.tensor("w", ckpt::view(s.w, {2, 3}));
      if (twice) v.tensor("w", s.w);
    }
  };

  SUBCASE("a sound tag: answers, the visit on this thread, the data loaded") {
    asking a;
    make(mem).load(a, {.strict = false});
    CHECK(a.visited_on == std::this_thread::get_id());
    CHECK(a.answered);
    CHECK(a.s.w == saved.w);
    const auto files = make(mem).files_to_read(a, {.strict = false});
    CHECK(files == std::vector<std::string>{"global_step3/mp_rank_00/model_optim_rng.ckpt"});
  }
  SUBCASE("a damaged metadata.json: its error, and the state never acts on an answer") {
    mem.bytes(md_key)[40] ^= std::byte{1};
    asking a;
    const auto e = catch_error([&] { make(mem).load(a); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(contains(e, "metadata.json"));
    CHECK_FALSE(a.answered);
    CHECK(a.s.w == std::vector<float>(6));
  }
  SUBCASE("a damaged metadata.json and a visit that fails: the metadata's error first") {
    mem.bytes(md_key)[40] ^= std::byte{1};
    small twice;
    struct dup {
      small& s;
      void checkpoint(ckpt::visitor& v) {
        v.tensor("w", s.w);
        v.tensor("w", s.w);
      }
    } d{twice};
    const auto e = catch_error([&] { make(mem).load(d); });
    CHECK(e.kind() == ckpt::error_kind::corrupt);
    CHECK(contains(e, "metadata.json"));
  }
  SUBCASE("a sound tag and a visit that fails: the visit's error") {
    asking a;
    a.twice = true;
    const auto e = catch_error([&] { make(mem).load(a); });
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
    INFO(e.what());
    CHECK(contains(e, "the state names 'w' twice"));
  }
  SUBCASE("a config that differs: its error, before the state acts on an answer") {
    asking a;
    const auto e = catch_error([&] { make(mem).load(a, {.config = ckpt::config{{"layers", 3}}}); });
    CHECK(e.kind() == ckpt::error_kind::mismatch);
    CHECK(contains(e, "layers saved 2, current 3"));
    CHECK_FALSE(a.answered);
  }
  SUBCASE("no such tag: not_found, whatever the visit does") {
    asking a;
    const auto e = catch_error([&] { make(mem).load(a, {.tag = "global_step9"}); });
    CHECK(e.kind() == ckpt::error_kind::not_found);
    CHECK_FALSE(a.answered);
  }
  SUBCASE("on several ranks: every rank gets the metadata's error, and the visit's where only that fails") {
    mem.bytes(md_key)[40] ^= std::byte{1};
    bool answered[2] = {false, false};
    const auto errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
      ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::memory_storage> cp{{.tp = 2, .comm = comm}, mem};
      asking a;
      try {
        cp.load(a);
      } catch (...) {
        answered[r] = a.answered;
        throw;
      }
    });
    for (const auto& e : errors) {
      CHECK(e.find("rank 0: ") != std::string::npos);
      CHECK(e.find("metadata.json") != std::string::npos);
    }
    CHECK_FALSE(answered[0]);
    CHECK_FALSE(answered[1]);
  }
}

TEST_CASE("state created on load reshards: saved at tp=2, created and loaded at tp=1 and at tp=4") {
  test::temp_dir dir;
  auto errors = test::on_ranks(2, [&](ckpt::in_process comm, std::uint32_t r) {
    lazy_moments s(2, r);
    s.first_step();
    ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = 2, .comm = comm}, dir.str()};
    cp.save(1, s);
  });
  REQUIRE((errors == std::vector<std::string>{"", ""}));
  for (std::uint32_t tp : {1u, 4u}) {
    CAPTURE(tp);
    std::vector<std::vector<float>> got(tp);
    errors = test::on_ranks(tp, [&](ckpt::in_process comm, std::uint32_t r) {
      lazy_moments s(tp, r);
      ckpt::checkpointer<ckpt::megatron<ckpt::in_process>, ckpt::posix> cp{{.tp = tp, .comm = comm}, dir.str()};
      cp.load(s, {.strict = true, .on_topology_change = ckpt::topology_change::from_rank_0});
      got[r] = s.exp_avg;
    });
    REQUIRE((errors == std::vector<std::string>(tp)));
    std::vector<float> joined;
    for (const auto& g : got) joined.insert(joined.end(), g.begin(), g.end());
    CHECK((joined == std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f, 4.5f, 5.5f, 6.5f, 7.5f}));
  }
}
