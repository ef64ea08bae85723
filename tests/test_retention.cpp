// Retention: keep the newest N committed tags, never the one latest names, never anything ckpt
// did not write; remove what crashed saves left behind.

#include "helpers.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

namespace fs = std::filesystem;

namespace {
struct tiny {
  std::vector<float> w = std::vector<float>(8);
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", w);
  }
};
std::vector<std::string> tag_names(const auto& cp) {
  std::vector<std::string> v;
  for (const auto& t : cp.tags()) v.push_back(t.tag);
  return v;
}
}  // namespace

TEST_CASE("keep_last_n keeps the newest committed tags") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path(), {.keep_last_n = 2}};
  tiny s;
  for (std::uint64_t it = 1; it <= 5; ++it) cp.save(it * 100, s);
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step400", "global_step500"});
  cp.wait();  // on posix the old tags' files go in the background, after their metadata.json
  CHECK_FALSE(fs::exists(dir.path() / "global_step300"));
  CHECK(cp.latest() == "global_step500");
}

TEST_CASE("retention never deletes the tag latest names, nor directories ckpt did not write") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path(), {.keep_last_n = 1}};
  tiny s;
  // Things that are not ckpt's: a user's notes, a directory named like a tag without ckpt's
  // marker, a stray file.
  fs::create_directories(dir.path() / "global_step1" / "mine");
  fs::create_directories(dir.path() / "notes");
  std::ofstream(dir.path() / "README") << "mine\n";
  cp.save(300, s);
  cp.save(50, s);  // an older iteration saved last: latest names it
  const auto tags = tag_names(cp);
  CHECK(tags == std::vector<std::string>{"global_step50", "global_step300"});  // newest by iteration + latest
  CHECK(cp.latest() == "global_step50");
  cp.wait();
  CHECK(fs::exists(dir.path() / "global_step1" / "mine"));
  CHECK(fs::exists(dir.path() / "notes"));
  CHECK(fs::exists(dir.path() / "README"));
  cp.save(400, s);
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step400"});
  cp.wait();
  CHECK(fs::exists(dir.path() / "global_step1" / "mine"));
}

TEST_CASE("leftovers of a crashed save are removed by the next save, even with retention off") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path()};
  tiny s;
  cp.save(10, s);
  // What a save killed before its commit leaves: ckpt's marker, a shard, a temp file.
  const auto crashed = dir.path() / "global_step20";
  fs::create_directories(crashed / "mp_rank_00");
  fs::copy_file(dir.path() / "global_step10" / ".ckpt_tag", crashed / ".ckpt_tag");
  std::ofstream(crashed / "mp_rank_00" / "model_optim_rng.ckpt.tmp.123.0") << "partial";
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step10"});  // never listed, never loaded
  tiny x;
  CHECK_THROWS_AS(cp.load(x, {.tag = "global_step20"}), ckpt::error);
  cp.save(30, s);
  cp.wait();
  CHECK_FALSE(fs::exists(crashed));
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step10", "global_step30"});
}

TEST_CASE("a save killed while writing its marker leaves a directory the next saves recognise and reuse") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path()};
  tiny s;
  cp.save(10, s);
  // Killed between creating the tag directory and renaming the marker into place: only the
  // marker's temporary file is there. Found by the crash campaign.
  fs::create_directories(dir.path() / "global_step20");
  std::ofstream(dir.path() / "global_step20" / ".ckpt_tag.tmp.4242.0") << "written by ckpt";
  fs::create_directories(dir.path() / "global_step30");
  std::ofstream(dir.path() / "global_step30" / ".ckpt_tag.tmp.4242.1") << "";
  fs::create_directories(dir.path() / "global_step35");  // killed right after mkdir: empty
  cp.save(20, s);  // the restarted run saves the same tag: not refused
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step10", "global_step20"});
  cp.wait();
  CHECK_FALSE(fs::exists(dir.path() / "global_step30"));  // cleaned up like any crashed save
  CHECK(fs::exists(dir.path() / "global_step35"));  // empty: may be anyone's, left alone...
  cp.save(35, s);                                    // ...and saved into without complaint
  CHECK(cp.latest() == "global_step35");
  // With anything else beside it, the directory is not ckpt's and stays untouched.
  fs::create_directories(dir.path() / "global_step40");
  std::ofstream(dir.path() / "global_step40" / ".ckpt_tag.tmp.1.0") << "";
  std::ofstream(dir.path() / "global_step40" / "mine.txt") << "mine";
  CHECK_THROWS_AS(cp.save(40, s), ckpt::error);
  cp.save(50, s);
  cp.wait();
  CHECK(fs::exists(dir.path() / "global_step40" / "mine.txt"));
}

TEST_CASE("retention works the same on memory storage") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> cp{{}, mem, {.keep_last_n = 3}};
  tiny s;
  for (std::uint64_t it = 1; it <= 6; ++it) cp.save(it, s);
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step4", "global_step5", "global_step6"});
  for (const auto& k : mem.keys()) CHECK((k == "latest" || k.starts_with("global_step4/") ||
                                         k.starts_with("global_step5/") || k.starts_with("global_step6/")));
}

TEST_CASE("a save never writes into a directory ckpt did not create") {
  test::temp_dir dir;
  ckpt::checkpointer<> cp{{}, dir.path()};
  fs::create_directories(dir.path() / "global_step5");
  std::ofstream(dir.path() / "global_step5" / "my_notes.txt") << "precious\n";
  tiny s;
  try {
    cp.save(5, s);
    FAIL("saved into a user's directory");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::invalid_argument);
    CHECK(std::string(e.what()).find("not written by ckpt") != std::string::npos);
  }
  cp.save(6, s);
  CHECK(fs::exists(dir.path() / "global_step5" / "my_notes.txt"));
  CHECK_FALSE(fs::exists(dir.path() / "global_step5" / ".ckpt_tag"));
}

// --- one writer per root ------------------------------------------------------------------------

TEST_CASE("a second writer to the same root gets a busy error and damages nothing") {
  test::temp_dir dir;
  tiny s;
  s.w[0] = 1;
  std::optional<ckpt::checkpointer<>> first{std::in_place, ckpt::single_process{}, ckpt::posix(dir.path())};
  first->save(100, s);
  CHECK(fs::exists(dir.path() / ".ckpt_lock"));

  ckpt::checkpointer<> second{{}, dir.path()};
  tiny other;
  other.w[0] = 2;
  try {
    second.save(200, other);
    FAIL("the second writer saved");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::busy);
    CHECK(std::string(e.what()).find(dir.str()) != std::string::npos);
    CHECK(std::string(e.what()).find(".ckpt_lock") != std::string::npos);
  }
  CHECK(second.latest() == "global_step100");  // loading never needs the lock
  tiny back;
  second.load(back);
  CHECK(back.w[0] == 1);

  first->save(300, s);  // the holder goes on saving; the lock file is never taken for a tag
  CHECK(tag_names(*first) == std::vector<std::string>{"global_step100", "global_step300"});
  first.reset();  // its lock goes with it
  second.save(400, other);
  CHECK(second.latest() == "global_step400");
}

TEST_CASE("a writer in another process is detected; wait_for_other_writer waits for it to finish") {
  test::temp_dir dir;
  int to_child[2], from_child[2];
  REQUIRE(::pipe(to_child) == 0);
  REQUIRE(::pipe(from_child) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // holds the root's lock from its first save until told to go
    int rc = 0;
    try {
      ckpt::checkpointer<> cp{{}, dir.path()};
      tiny s;
      cp.save(1, s);
      char c = 'r';
      if (::write(from_child[1], &c, 1) != 1) rc = 3;
      if (::read(to_child[0], &c, 1) != 1) rc = 4;
      ::usleep(200'000);  // still holding it when the parent starts to wait
    } catch (...) {
      rc = 2;
    }
    ::_exit(rc);
  }
  char c;
  REQUIRE(::read(from_child[0], &c, 1) == 1);
  tiny s;
  {
    ckpt::checkpointer<> cp{{}, dir.path()};
    CHECK_THROWS_WITH_AS(cp.save(2, s), doctest::Contains("another writer is saving to"), ckpt::error);
  }
  ckpt::checkpointer<> patient{{}, dir.path(), {.wait_for_other_writer = true}};
  c = 'g';
  // The clock starts before the child is let go, so the 200 ms it sleeps all fall inside it.
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::write(to_child[1], &c, 1) == 1);
  patient.save(3, s);  // blocks until the child exits and the kernel drops its lock
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(150));  // the child held it 200 ms more
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(patient.latest() == "global_step3");
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
}

// --- retention's deletion in the background -----------------------------------------------------

namespace {
/// A memory storage whose deletions may run in the background, as posix's do, and whose
/// `remove_all` (the bulk of deleting a tag) waits at a gate the test opens, or fails while the
/// test asks it to.
struct held_removal_storage : test::wrapped_memory_storage {
  static constexpr bool background_removal = true;
  struct gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = true;
    bool timed_out = false;
    int failures = 0;  // remove_all calls still to fail
  };
  std::shared_ptr<gate> g = std::make_shared<gate>();

  void remove_all(std::string_view prefix) {
    {
      std::unique_lock lock(g->mu);
      // A save that waited for the deletion would never return to open the gate: give up after
      // a while and say so, rather than hang.
      if (!g->cv.wait_for(lock, std::chrono::seconds(20), [&] { return g->open; })) g->timed_out = true;
      if (g->failures > 0) {
        --g->failures;
        throw ckpt::error(ckpt::error_kind::io, "remove " + describe(prefix) + ": injected fault");
      }
    }
    inner.remove_all(prefix);
  }
  void set_open(bool open) {
    std::lock_guard lock(g->mu);
    g->open = open;
    g->cv.notify_all();
  }
  bool holds(std::string_view key) const { return inner.size(key).has_value(); }
  /// The keys left that are neither `latest` nor under `tag`, one per line: "" once the other
  /// tags are wholly deleted.
  std::string strays(const std::string& tag) const {
    std::string out;
    for (const auto& k : inner.keys())
      if (k != "latest" && !k.starts_with(tag + "/")) out += k + "\n";
    return out;
  }
};

/// A checkpointer keeping the last tag, on a held_removal_storage.
struct held_removal_fixture {
  held_removal_storage store;
  ckpt::checkpointer<ckpt::single_process, held_removal_storage> cp{{}, store, {.keep_last_n = 1}};
  tiny s;
};
}  // namespace

TEST_CASE_FIXTURE(held_removal_fixture, "a save returns once committed while the old tag's files are deleted in the background") {
  cp.save(1, s);
  REQUIRE(store.holds("global_step1/mp_rank_00/model_optim_rng.ckpt"));
  store.set_open(false);
  cp.save(2, s);  // returns with the deletion of global_step1 held at the gate
  // Already uncommitted: neither listed nor loadable, though its shard is still there.
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step2"});
  CHECK_FALSE(store.holds("global_step1/metadata.json"));
  CHECK(store.holds("global_step1/mp_rank_00/model_optim_rng.ckpt"));
  store.set_open(true);
  cp.wait();
  CHECK_FALSE(store.g->timed_out);
  CHECK(store.strays("global_step2") == "");
  // A load waits for the deletion in flight: it reads from a quiet disk.
  store.set_open(false);
  cp.save(3, s);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    store.set_open(true);
  });
  tiny x;
  const auto r = cp.load(x);
  opener.join();
  CHECK(r.tag == "global_step3");
  CHECK_FALSE(store.holds("global_step2/mp_rank_00/model_optim_rng.ckpt"));
  CHECK_FALSE(store.g->timed_out);
}

TEST_CASE_FIXTURE(held_removal_fixture, "a background deletion that fails is reported by the next save after its commit, and finished by it") {
  cp.save(1, s);
  store.g->failures = 1;
  cp.save(2, s);  // global_step1's deletion fails on the background thread
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step2"});
  try {
    cp.save(3, s);
    FAIL("the failed deletion was not reported");
  } catch (const ckpt::error& e) {
    CHECK(e.kind() == ckpt::error_kind::io);
    CHECK(std::string(e.what()).find("injected fault") != std::string::npos);
    CHECK(std::string(e.what()).find("global_step1") != std::string::npos);
  }
  CHECK(cp.latest() == "global_step3");  // the save itself committed
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step3"});
  cp.wait();  // global_step1's leftovers (uncommitted, marked) went with global_step2
  CHECK(store.strays("global_step3") == "");

  // wait() reports it too, once.
  store.g->failures = 1;
  cp.save(4, s);
  CHECK_THROWS_AS(cp.wait(), ckpt::error);
  cp.wait();
  cp.save(5, s);  // not thrown again; the leftovers of global_step3 go now
  cp.wait();
  CHECK(store.strays("global_step5") == "");
}

TEST_CASE_FIXTURE(held_removal_fixture, "prune after a failed background deletion deletes the leftovers and reports only its own errors") {
  cp.save(1, s);
  store.g->failures = 1;
  cp.save(2, s);
  const auto gone = cp.prune(1);
  CHECK(gone == std::vector<std::string>{"global_step1"});  // uncommitted leftovers, listed as deleted
  CHECK(store.strays("global_step2") == "");
  cp.save(3, s);  // nothing left to report
  cp.wait();
}

TEST_CASE_FIXTURE(held_removal_fixture, "save_async does not block on the deletion the save before left running; its write waits for it") {
  cp.save(1, s);
  store.set_open(false);
  cp.save(2, s);                      // global_step1's deletion held at the gate
  auto pending = cp.save_async(3, s);  // returns once snapshotted, the gate still closed
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(store.holds("global_step3/metadata.json"));  // its write waits for the deletion
  store.set_open(true);
  pending.wait();
  cp.wait();
  CHECK_FALSE(store.g->timed_out);
  CHECK(tag_names(cp) == std::vector<std::string>{"global_step3"});
  CHECK(store.strays("global_step3") == "");
}
