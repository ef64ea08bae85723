#pragma once
/// @file s3.hpp
/// `ckpt::s3`: a Storage in an S3-compatible bucket (AWS S3, MinIO, Ceph, s3rver, ...), on
/// libcurl with AWS Signature V4. Never included by ckpt.hpp: include it, and link libcurl
/// and libcrypto (Meson: `ckpt_s3_dep`).
///
/// How the commit protocol maps onto object storage: a PUT (or the completion of a multipart
/// upload) makes an object appear whole or not at all, which is what `publish` needs. Shard
/// files are published first, then `metadata.json` (the commit point), then `latest`; a tag
/// without `metadata.json` is never loaded, and the next save's retention deletes it.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "detail/keys.hpp"
#include "error.hpp"
#include "impl/checkpointer.ipp"  // its users make checkpointers other than impl/instances.hpp's
#include "s3/client.hpp"
#include "s3/options.hpp"

namespace ckpt {

/// Keys are objects under `bucket/prefix/`. Copies share one connection pool.
///
/// - Objects up to `part_bytes` are one PUT; larger ones a multipart upload whose parts go up
///   `upload_concurrency` at a time while the save goes on producing the next ones. Any
///   failure aborts the upload, so no parts are left behind.
/// - Every body carries Content-MD5 and every answered ETag is compared with it; every read
///   is then checked against ckpt's own XXH3 checksums by the load.
/// - Reads are ranged GETs of exactly the bytes a load needs; large ones are split into
///   `range_bytes` ranges fetched `download_concurrency` at a time, and a load reads
///   several chunks at once (`concurrent_reads`).
/// - Transient failures are retried as `s3_retry` says; errors name the object and S3's
///   error code and message, never the credentials.
///
/// @code
/// #include <ckpt/s3.hpp>
/// ckpt::s3 store{{.endpoint = "http://127.0.0.1:9000", .bucket = "runs", .prefix = "gpt/run7"}};
/// ckpt::checkpointer<ckpt::single_process, ckpt::s3> cp{{}, store, {.keep_last_n = 3}};
/// cp.save(step, model);                       // s3://runs/gpt/run7/global_step<step>/...
/// @endcode
class s3 {
 public:
  /// Loads read chunks from several threads at once.
  static constexpr bool concurrent_reads = true;
  /// A load reads each chunk in one request (split by `range_bytes`), not in the small pieces
  /// that suit a local file: every request costs a round trip.
  static constexpr std::size_t read_piece_bytes = std::numeric_limits<std::size_t>::max();

  explicit s3(s3_options options) : client_(std::make_shared<detail::s3_client>(std::move(options))) {}

  const s3_options& options() const noexcept { return client_->options(); }

  class writer;
  writer create(std::string_view key);

  void read(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
    detail::check_key(key);
    if (out.empty()) return;
    const auto& o = client_->options();
    const auto n = out.size();
    if (n <= o.range_bytes || o.download_concurrency == 1) return read_range(key, offset, out);
    // Large reads: ranges fetched in parallel, each by the next free thread.
    const std::size_t ranges = (n + o.range_bytes - 1) / o.range_bytes;
    std::atomic<std::size_t> next{0};
    std::atomic<bool> stop{false};
    std::exception_ptr first;
    std::mutex mu;
    auto work = [&] {
      for (std::size_t i; !stop && (i = next++) < ranges;) {
        try {
          const auto at = i * o.range_bytes;
          read_range(key, offset + at, out.subspan(at, std::min(o.range_bytes, n - at)));
        } catch (...) {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
          stop = true;
        }
      }
    };
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < std::min<std::size_t>(o.download_concurrency, ranges); ++t) pool.emplace_back(work);
    work();
    pool.clear();
    if (first) std::rethrow_exception(first);
  }

  std::optional<std::uint64_t> size(std::string_view key) const {
    detail::check_key(key);
    detail::s3_request r{.method = "HEAD", .key = client_->full_key(key)};
    try {
      const auto resp = client_->perform(r);
      if (!resp.content_length)
        throw error(error_kind::io, "s3: HEAD " + describe(key) + " answered without a Content-Length");
      return resp.content_length;
    } catch (const detail::s3_status_error& e) {
      if (e.status() == 404) return std::nullopt;
      throw;
    }
  }

  /// The names directly under `prefix` ("" for the root): objects and "directories" alike.
  std::vector<std::string> list(std::string_view prefix) const {
    detail::check_key(prefix, true);
    std::set<std::string> names;
    const auto under = listing_prefix(prefix);
    for_each_listed(under, true, [&](std::string_view entry) {
      auto rest = entry.substr(under.size());
      if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
      if (!rest.empty()) names.emplace(rest);
    });
    return {names.begin(), names.end()};
  }

  void remove(std::string_view key) {
    detail::check_key(key);
    delete_object(client_->full_key(key));
  }

  /// Deletes `prefix` and every object under `prefix/`.
  void remove_all(std::string_view prefix) {
    detail::check_key(prefix);
    std::vector<std::string> doomed;
    for_each_listed(listing_prefix(prefix), false, [&](std::string_view k) { doomed.emplace_back(k); });
    for (const auto& k : doomed) delete_object(k);
    delete_object(client_->full_key(prefix));
  }

  std::string describe(std::string_view key) const { return client_->describe(key); }

 private:
  std::string listing_prefix(std::string_view prefix) const {
    const auto full = client_->full_key(prefix);
    return full.empty() ? std::string() : full + "/";
  }

  /// ListObjectsV2 over every page. With `by_level`, names below the next '/' are rolled up
  /// into one common prefix (a "directory").
  template <class F>
  void for_each_listed(const std::string& under, bool by_level, F&& each) const {
    std::string token;
    for (std::size_t page = 0;; ++page) {
      std::vector<std::pair<std::string, std::string>> q{{"list-type", "2"}, {"prefix", under}};
      if (by_level) q.emplace_back("delimiter", "/");
      if (!token.empty()) q.emplace_back("continuation-token", token);
      detail::s3_response resp;
      try {
        resp = client_->perform({.method = "GET", .key = "", .query = detail::canonical_query(std::move(q))});
      } catch (const detail::s3_status_error& e) {
        // Some S3-compatible servers (s3rver) answer a listing of a prefix under which nothing
        // exists with NoSuchKey rather than an empty list. A missing bucket stays an error.
        if (e.status() == 404 && e.code() == "NoSuchKey") return;
        throw;
      }
      for (const auto& block : detail::xml_blocks(resp.body, "Contents"))
        if (auto k = detail::xml_text(block, "Key"); k && k->starts_with(under)) each(*k);
      for (const auto& block : detail::xml_blocks(resp.body, "CommonPrefixes"))
        if (auto p = detail::xml_text(block, "Prefix"); p && p->starts_with(under)) each(*p);
      if (detail::xml_text(resp.body, "IsTruncated").value_or("false") != "true") return;
      auto next = detail::xml_text(resp.body, "NextContinuationToken");
      if (!next || next->empty() || *next == token || page > 1'000'000)
        throw error(error_kind::io, "s3: listing " + client_->describe(under) +
                                        " is truncated but gives no new continuation token");
      token = *next;
    }
  }

  void delete_object(const std::string& full) const {
    try {
      client_->perform({.method = "DELETE", .key = full});
    } catch (const detail::s3_status_error& e) {
      if (e.status() != 404) throw;  // already gone is what was asked for
    }
  }

  void read_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out) const {
    const auto last = offset + out.size() - 1;
    detail::s3_request r{.method = "GET",
                         .key = client_->full_key(key),
                         .headers = {"Range: bytes=" + std::to_string(offset) + "-" + std::to_string(last)},
                         .into = out};
    auto truncated = [&](const std::string& ends) {
      return error(error_kind::corrupt, describe(key) + " is truncated: needed bytes [" + std::to_string(offset) + ", " +
                                            std::to_string(offset + out.size()) + "), " + ends);
    };
    detail::s3_response resp;
    try {
      resp = client_->perform(r);
    } catch (const detail::s3_status_error& e) {
      if (e.status() == 404) throw error(error_kind::not_found, "no such file: " + describe(key) + " (" + e.what() + ")");
      if (e.status() != 416) throw;
      const auto sz = size(key);
      throw truncated(sz ? "the object ends at " + std::to_string(*sz) : std::string("the object is gone"));
    }
    if (resp.received != out.size()) throw truncated("the server sent " + std::to_string(resp.received) + " bytes");
  }

  std::shared_ptr<detail::s3_client> client_;
};

/// An object being written. Bytes accumulate into a part; full parts upload in the
/// background (a multipart upload, started with the first full part) while `write` goes on,
/// at most `upload_concurrency` at once. `publish` uploads the rest and completes the upload
/// (or PUTs a small object whole), making the object appear at once. A writer destroyed, or
/// failing, before `publish` aborts its upload.
class s3::writer {
 public:
  writer(writer&&) noexcept = default;
  writer& operator=(writer&& other) noexcept {
    if (this != &other) {
      abandon();
      up_ = std::move(other.up_);
    }
    return *this;
  }
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;
  ~writer() { abandon(); }

  void write(std::span<const std::byte> bytes) {
    guarded([&] {
      auto& u = *up_;
      if (u.sent_last)
        throw error(error_kind::invalid_argument, "s3: write to " + u.client->describe(u.key) + " after sync");
      const auto part = u.client->options().part_bytes;
      while (!bytes.empty()) {
        if (u.buffer.capacity() < part) u.buffer.reserve(part);
        const auto k = std::min(bytes.size(), part - u.buffer.size());
        u.buffer.insert(u.buffer.end(), bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(k));
        bytes = bytes.subspan(k);
        if (u.buffer.size() == part) send_part();
      }
    });
  }

  /// Uploads what is buffered, once a multipart upload has begun, and waits for every part:
  /// failures surface here, before the object is published. A small object waits for publish.
  void sync() {
    guarded([&] {
      auto& u = *up_;
      if (u.upload_id.empty() || u.sent_last) return;
      if (!u.buffer.empty()) send_part();
      u.sent_last = true;
      while (!u.inflight.empty()) finish_oldest();
    });
  }

  void publish() {
    sync();
    guarded([&] {
      auto& u = *up_;
      if (u.upload_id.empty())
        put_whole();
      else
        complete();
      u.published = true;
    });
  }

 private:
  friend class s3;

  struct upload {
    std::shared_ptr<detail::s3_client> client;
    std::string key, full;
    std::vector<std::byte> buffer;
    std::string upload_id;
    std::deque<std::string> etags;  // by part number - 1; a deque, so parts in flight keep their slot
    std::deque<std::future<std::vector<std::byte>>> inflight;
    std::vector<std::vector<std::byte>> spare;  // buffers of finished parts, for the next ones
    bool sent_last = false, published = false, failed = false;
  };

  writer(std::shared_ptr<detail::s3_client> client, std::string key) : up_(std::make_unique<upload>()) {
    up_->full = client->full_key(key);
    up_->key = std::move(key);
    up_->client = std::move(client);
  }

  /// Runs `f`; on failure, aborts the upload, and says so in the error if the abort failed too.
  template <class F>
  void guarded(F&& f) {
    if (!up_ || up_->published) throw error(error_kind::invalid_argument, "s3: writer used after publish or move");
    if (up_->failed) throw error(error_kind::io, "s3: " + up_->client->describe(up_->key) + ": an earlier write failed");
    try {
      f();
    } catch (const error& e) {
      up_->failed = true;
      if (auto why = abort_upload(); !why.empty()) throw error(e.kind(), std::string(e.what()) + "; " + why);
      throw;
    }
  }

  void send_part() {
    auto& u = *up_;
    auto& client = *u.client;
    if (u.upload_id.empty()) {
      const auto resp = client.perform({.method = "POST", .key = u.full, .query = "uploads=", .content_type = "application/octet-stream"});
      auto id = detail::xml_text(resp.body, "UploadId");
      if (!id || id->empty())
        throw error(error_kind::io, "s3: starting a multipart upload of " + client.describe(u.key) + " gave no UploadId");
      u.upload_id = *id;
    }
    if (u.etags.size() == 10000)
      throw error(error_kind::invalid_argument, "s3: " + client.describe(u.key) + " needs more than S3's 10000 parts of " +
                                                    std::to_string(client.options().part_bytes) + " bytes; raise part_bytes");
    while (u.inflight.size() >= client.options().upload_concurrency) finish_oldest();
    const auto number = u.etags.size() + 1;
    u.etags.emplace_back();
    std::string* slot = &u.etags.back();
    std::vector<std::byte> next;
    if (!u.spare.empty()) {
      next = std::move(u.spare.back());
      u.spare.pop_back();
    }
    next.clear();
    u.inflight.push_back(std::async(std::launch::async, [c = u.client, full = u.full, key = u.key, id = u.upload_id, number, slot,
                                                         data = std::move(u.buffer)]() mutable {
      *slot = put_checked(*c, full, key, detail::canonical_query({{"partNumber", std::to_string(number)}, {"uploadId", id}}),
                          data, "part " + std::to_string(number) + " of ");
      return std::move(data);
    }));
    u.buffer = std::move(next);
  }

  void finish_oldest() {
    auto f = std::move(up_->inflight.front());
    up_->inflight.pop_front();
    up_->spare.push_back(f.get());  // rethrows the part's error
  }

  /// PUTs `data` (an object or a part) and checks the ETag against its MD5: the server
  /// checked Content-MD5 already, if it checks anything, and this catches one that does not.
  static std::string put_checked(const detail::s3_client& c, const std::string& full, const std::string& key,
                                 std::string query, std::span<const std::byte> data, const std::string& what) {
    const auto sum = detail::md5(data);
    const auto resp = c.perform({.method = "PUT", .key = full, .query = std::move(query), .body = data, .body_md5 = sum});
    const auto want = detail::to_hex(sum);
    auto got = resp.etag;
    for (auto& ch : got) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (c.options().check_etag && got != want)
      throw error(error_kind::corrupt, "s3: " + what + c.describe(key) + " was stored with ETag \"" + resp.etag +
                                           "\", not the MD5 " + want + " of the " + std::to_string(data.size()) +
                                           " bytes sent");
    return resp.etag;
  }

  void put_whole() {
    auto& u = *up_;
    put_checked(*u.client, u.full, u.key, "", u.buffer, "");
    std::vector<std::byte>().swap(u.buffer);
  }

  void complete() {
    auto& u = *up_;
    std::string body = "<CompleteMultipartUpload>";
    for (std::size_t i = 0; i < u.etags.size(); ++i)
      body += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>\"" + detail::xml_escape(u.etags[i]) +
              "\"</ETag></Part>";
    body += "</CompleteMultipartUpload>";
    const auto resp = u.client->perform({.method = "POST",
                                         .key = u.full,
                                         .query = detail::canonical_query({{"uploadId", u.upload_id}}),
                                         .body = std::as_bytes(std::span(body.data(), body.size())),
                                         .content_type = "application/xml"});
    // S3 may answer 200 and still report a failure in the body.
    if (auto code = detail::xml_text(resp.body, "Code"); code && resp.body.find("<Error") != std::string::npos)
      throw error(error_kind::io, "s3: completing the multipart upload of " + u.client->describe(u.key) + " failed: " + *code +
                                      ": " + detail::xml_text(resp.body, "Message").value_or(""));
    u.upload_id.clear();  // nothing left to abort
    u.spare.clear();
  }

  /// Waits for the parts in flight and aborts the multipart upload, if one was started, once.
  /// Returns what went wrong if the abort failed, or "" when it succeeded or there was nothing
  /// to abort.
  std::string abort_upload() noexcept {
    if (!up_) return "";
    auto& u = *up_;
    while (!u.inflight.empty()) {
      try {
        finish_oldest();
      } catch (...) {
        // the first failure is the one being reported
      }
    }
    if (u.upload_id.empty()) return "";
    const auto id = std::exchange(u.upload_id, std::string());
    try {
      u.client->perform({.method = "DELETE", .key = u.full, .query = detail::canonical_query({{"uploadId", id}})});
      return "";
    } catch (const std::exception& e) {
      return "aborting multipart upload " + id + " failed too (" + e.what() +
             "): its parts stay in the bucket until a lifecycle rule (AbortIncompleteMultipartUpload) removes them";
    }
  }

  void abandon() noexcept {
    if (up_ && !up_->published) abort_upload();
  }

  std::unique_ptr<upload> up_;
};

inline s3::writer s3::create(std::string_view key) {
  detail::check_key(key);
  return writer(client_, std::string(key));
}

}  // namespace ckpt
