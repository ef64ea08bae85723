// A failing storage fails each operation of a save, and of a load, in turn. Every time: a
// clear error, the previous checkpoint still loads with exactly its data, nothing is half
// published, and the next successful save cleans up what the failed one left.

#include "failing_storage.hpp"
#include "helpers.hpp"

#include <set>

using test::every_dtype_state;

namespace {
template <class B>
struct fault_fixture {
  B backend;
  using storage = test::failing_storage<typename B::storage>;
  storage store{backend.make()};
  ckpt::checkpointer<ckpt::single_process, storage> cp{{}, store, {.keep_last_n = 2, .chunk_bytes = 1024}};
};
}  // namespace

TEST_CASE_TEMPLATE("every operation of a save can fail without harming the last good checkpoint", B,
                   test::posix_backend, test::memory_backend) {
  // Count the operations of a clean save first.
  long total = 0;
  {
    fault_fixture<B> f;
    every_dtype_state s;
    f.cp.save(1, s);
    f.store.fail_at(-1);
    f.cp.save(2, s);
    total = f.store.operations();
  }
  REQUIRE(total > 20);
  std::set<std::string> kinds;
  int committed_anyway = 0;
  for (long k = 0; k < total; ++k) {
    CAPTURE(k);
    fault_fixture<B> f;
    every_dtype_state good, next;
    good.randomise(1);
    next.randomise(2);
    f.cp.save(1, good);
    f.store.fail_at(k, k % 3 == 0 ? ENOSPC : (k % 3 == 1 ? EIO : EACCES));
    bool failed = false;
    try {
      f.cp.save(2, next);
    } catch (const ckpt::error& e) {
      failed = true;
      CHECK(e.kind() == ckpt::error_kind::io);
      CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
    }
    if (!failed) MESSAGE("no failure at k=" << k << " of " << total << ", ops=" << f.store.operations());
    REQUIRE(failed);
    kinds.insert(f.store.last_failure().substr(0, f.store.last_failure().find(' ')));
    f.store.fail_at(-1);

    // latest names a tag that loads completely, with exactly the data saved under it.
    every_dtype_state loaded;
    const auto r = f.cp.load(loaded);
    if (r.iteration == 1) {
      CHECK(loaded == good);
    } else {
      // Only a failure after `latest` was replaced (in retention) leaves the new save committed.
      CHECK(r.iteration == 2);
      CHECK(loaded == next);
      ++committed_anyway;
    }
    // The new tag is either committed (metadata.json written; only `latest` failed to move)
    // and then complete, or not loadable at all.
    if (f.store.inner().size("global_step2/metadata.json")) {
      every_dtype_state second;
      f.cp.load(second, {.tag = "global_step2"});
      CHECK(second == next);
    } else {
      CHECK_THROWS_AS(f.cp.load(loaded, {.tag = "global_step2"}), ckpt::error);
    }

    // The next save succeeds and leaves nothing behind but committed tags and latest.
    every_dtype_state third;
    third.randomise(3);
    f.cp.save(3, third);
    for (const auto& name : f.store.inner().list("")) {
      CAPTURE(name);
      if (name == "latest" || name == ".ckpt_lock") continue;  // the lock file stays, empty
      CHECK(f.store.inner().size(name + "/metadata.json").has_value());
      for (const auto& sub : f.store.inner().list(name + "/mp_rank_00"))
        CHECK_MESSAGE(sub.find(".tmp.") == std::string::npos, "temporary file left: " << sub);
    }
    CHECK(f.cp.load(loaded).iteration == 3);
    CHECK(loaded == third);
  }
  MESSAGE(total << " fault points in a save, operations failed: " << kinds.size() << " kinds; "
                << committed_anyway << " failed after the commit point");
  for (const char* op : {"open", "write", "fsync", "rename", "stat", "list"}) CHECK_MESSAGE(kinds.count(op), op);
}

TEST_CASE_TEMPLATE("every operation of a load can fail with a clear error and no damage", B, test::posix_backend,
                   test::memory_backend) {
  fault_fixture<B> f;
  every_dtype_state good;
  good.randomise(4);
  f.cp.save(4, good);
  every_dtype_state x;
  f.store.fail_at(-1);
  f.cp.load(x);
  const long total = f.store.operations();
  REQUIRE(total > 5);
  for (long k = 0; k < total; ++k) {
    CAPTURE(k);
    f.store.fail_at(k, EIO);
    every_dtype_state y;
    try {
      f.cp.load(y);
      FAIL("the load should have failed");
    } catch (const ckpt::error& e) {
      CHECK(e.kind() == ckpt::error_kind::io);
      CHECK(std::string(e.what()).find("Input/output error") != std::string::npos);
    }
    f.store.fail_at(-1);
    every_dtype_state z;
    f.cp.load(z);
    CHECK(z == good);
  }
}
