// Concept tests: the types that must satisfy each concept, and near-misses that must not.
// (tests/compile_fail checks the messages users see when a type falls short.)

#include "helpers.hpp"

#include "failing_storage.hpp"

namespace {
struct with_member {
  std::vector<float> w;
  template <class V>
  void checkpoint(V& v) {
    v.tensor("w", w);
  }
};
struct with_private_member {
 private:
  friend class ckpt::access;
  template <class V>
  void checkpoint(V&) {}
};
struct foreign {};
struct nothing {};
struct wrong_signature {
  void checkpoint(int) {}
};
struct private_without_access {
 private:
  template <class V>
  void checkpoint(V&) {}
};
}  // namespace

template <>
struct ckpt::checkpoint_traits<foreign> {
  static void checkpoint(ckpt::visitor&, foreign&) {}
};

static_assert(ckpt::Checkpointable<with_member>);
static_assert(ckpt::Checkpointable<with_private_member>);
static_assert(ckpt::Checkpointable<foreign>);
static_assert(!ckpt::Checkpointable<nothing>);
static_assert(!ckpt::Checkpointable<wrong_signature>);
static_assert(!ckpt::Checkpointable<private_without_access>);
static_assert(!ckpt::Checkpointable<int>);

// Storage
namespace {
struct no_publish_writer {
  void write(std::span<const std::byte>) {}
  void sync() {}
};
struct storage_without_publish {
  no_publish_writer create(std::string_view);
  void read(std::string_view, std::uint64_t, std::span<std::byte>) const;
  std::optional<std::uint64_t> size(std::string_view) const;
  std::vector<std::string> list(std::string_view) const;
  void remove(std::string_view);
  void remove_all(std::string_view);
  std::string describe(std::string_view) const;
};
struct storage_without_list {
  ckpt::memory_storage::writer create(std::string_view);
  void read(std::string_view, std::uint64_t, std::span<std::byte>) const;
  std::optional<std::uint64_t> size(std::string_view) const;
  void remove(std::string_view);
  void remove_all(std::string_view);
  std::string describe(std::string_view) const;
};
}  // namespace
static_assert(ckpt::Storage<ckpt::posix>);
static_assert(ckpt::Storage<ckpt::memory_storage>);
static_assert(ckpt::Storage<test::failing_storage<ckpt::posix>>);
static_assert(!ckpt::Storage<storage_without_publish>);
static_assert(!ckpt::Storage<storage_without_list>);
static_assert(!ckpt::Storage<int>);

// Codec
namespace {
struct codec_without_id {
  std::size_t max_encoded_size(std::size_t n) const { return n; }
  std::size_t encode(std::span<const std::byte>, ckpt::dtype, std::span<std::byte>) const { return 0; }
  void decode(std::span<const std::byte>, ckpt::dtype, std::span<std::byte>) const {}
};
struct user_codec : codec_without_id {
  static constexpr std::uint8_t id = 200;
};
}  // namespace
static_assert(ckpt::Codec<ckpt::raw>);
static_assert(ckpt::Codec<user_codec>);
static_assert(ckpt::Codec<ckpt::zstd>);
static_assert(ckpt::Codec<ckpt::zstd_bytegroup>);
static_assert(ckpt::Codec<ckpt::auto_codec>);
static_assert(!ckpt::Codec<codec_without_id>);

// DevicePolicy
namespace {
struct device_without_from_host {
  bool accepts(ckpt::device) const { return true; }
  void to_host(const ckpt::tensor_ref&, std::uint64_t, std::span<std::byte>) {}
};
}  // namespace
static_assert(ckpt::DevicePolicy<ckpt::host_copy>);
static_assert(!ckpt::DevicePolicy<device_without_from_host>);

// Communicator
namespace {
struct comm_without_gather {
  int rank() const { return 0; }
  int size() const { return 1; }
  void barrier() {}
  void broadcast(std::vector<std::byte>&, int) {}
  std::vector<std::vector<std::byte>> all_gather(std::span<const std::byte>);
  std::uint64_t all_reduce_max(std::uint64_t x) { return x; }
};
}  // namespace
static_assert(ckpt::Communicator<ckpt::local>);
static_assert(!ckpt::Communicator<comm_without_gather>);

// ShardPolicy
namespace {
struct policy_without_topology {
  using communicator_type = ckpt::local;
  ckpt::local c;
  ckpt::local& communicator() { return c; }
  std::optional<std::string> shard_file() const { return "x"; }
  bool writes(std::string_view, const ckpt::tensor_ref&) const { return true; }
};
struct policy_with_bad_comm {
  using communicator_type = comm_without_gather;
};
}  // namespace
static_assert(ckpt::ShardPolicy<ckpt::single_process>);
static_assert(!ckpt::ShardPolicy<policy_without_topology>);
static_assert(!ckpt::ShardPolicy<policy_with_bad_comm>);

// The diagnostics agree with the concepts on the types that satisfy them.
static_assert(ckpt::detail::diagnose_checkpointable<with_member>());
static_assert(ckpt::detail::diagnose_storage<ckpt::posix>());
static_assert(ckpt::detail::diagnose_codec<ckpt::raw>());
static_assert(ckpt::detail::diagnose_device_policy<ckpt::host_copy>());
static_assert(ckpt::detail::diagnose_shard_policy<ckpt::single_process>());

namespace {
// A codec that stores bytes reversed, to show ids from 128 up are honoured on load.
struct reversed {
  static constexpr std::uint8_t id = 130;
  std::size_t max_encoded_size(std::size_t n) const { return n; }
  std::size_t encode(std::span<const std::byte> in, ckpt::dtype, std::span<std::byte> out) const {
    std::reverse_copy(in.begin(), in.end(), out.begin());
    return in.size();
  }
  void decode(std::span<const std::byte> in, ckpt::dtype, std::span<std::byte> out) const {
    if (in.size() != out.size()) throw ckpt::error(ckpt::error_kind::corrupt, "size");
    std::reverse_copy(in.begin(), in.end(), out.begin());
  }
};
}  // namespace

TEST_CASE("a user codec composes with the checkpointer") {
  ckpt::memory_storage mem;
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage, reversed> cp{{}, mem};
  test::every_dtype_state a, b;
  a.randomise(21);
  cp.save(1, a);
  cp.load(b);
  CHECK(a == b);
  // A checkpointer with the default codec cannot decode id 130 and says so.
  ckpt::checkpointer<ckpt::single_process, ckpt::memory_storage> plain{{}, mem};
  const auto e = test::catch_error([&] { plain.load(b); });
  CHECK(e.kind() == ckpt::error_kind::corrupt);
  CHECK(std::string(e.what()).find("unknown codec id 130") != std::string::npos);
}

#include <ckpt/in_process.hpp>

// Capabilities are found by name (concepts.hpp); a misspelt member would silently turn a fast
// path off, so ckpt's own back ends are pinned here to the ones they declare.
TEST_CASE("capabilities: ckpt's own back ends offer exactly the optional members they declare") {
  using namespace ckpt::detail;
  static_assert(concurrent_reads<ckpt::posix> && lockable_root<ckpt::posix> && opens_readers<ckpt::posix>);
  static_assert(announces_reads<reader_of<ckpt::posix>::type> && reads_in_place<reader_of<ckpt::posix>::type>);
  static_assert(has_read_depth<ckpt::posix> && !has_read_depth<ckpt::memory_storage>);
  static_assert(reserves_space<ckpt::posix::writer> && !reserves_space<ckpt::memory_storage::writer>);
  static_assert(retains_writes<ckpt::posix::writer> && !retains_writes<ckpt::memory_storage::writer>);
  static_assert(concurrent_reads<ckpt::memory_storage> && !lockable_root<ckpt::memory_storage>);
  static_assert(has_host_view<ckpt::host_copy> && !lends_buffers<ckpt::host_copy> && !starts_copies<ckpt::host_copy>);
  static_assert(chooses_per_tensor<ckpt::auto_codec> && encodes_with<ckpt::auto_codec>);
  static_assert(!chooses_per_tensor<ckpt::zstd> && !encodes_with<ckpt::raw>);
  static_assert(reports_thread_safety<ckpt::in_process> && chooses_tensors<ckpt::in_process>);
  static_assert(!reports_thread_safety<ckpt::local>);
  static_assert(gathers<ckpt::gather_to_root<ckpt::local>> && !streams<ckpt::gather_to_root<ckpt::local>>);
  static_assert(scatters<ckpt::gather_to_root<ckpt::in_process>>);
  static_assert(!gathers<ckpt::megatron<ckpt::local>> && !gathers<ckpt::single_process>);
  CHECK(read_piece_bytes<ckpt::posix>() == std::size_t{256} * 1024);
  CHECK(read_piece_bytes<ckpt::memory_storage>() == std::size_t{256} * 1024);
  CHECK(ckpt::posix("/nonexistent").reads_in_flight() == 16);
  CHECK(ckpt::posix("/nonexistent", {.reads_in_flight = 3}).reads_in_flight() == 3);
}
