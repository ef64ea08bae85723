#pragma once
// One S3 request at a time, done properly: the URL and the signature (curl's SigV4), the
// bodies in and out without copies, and the retry rule. ckpt::s3 (s3.hpp) builds the Storage
// operations on top of `s3_client::perform`.

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "digest.hpp"
#include "options.hpp"
#include "xml.hpp"

namespace ckpt::detail {

/// Percent-encodes everything but RFC 3986's unreserved characters (and '/' in paths), as
/// SigV4's canonical URI and query require.
inline std::string uri_encode(std::string_view s, bool keep_slash) {
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
        c == '~' || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

/// A query string in SigV4's canonical form (sorted by name, every name and value encoded,
/// "name=" for empty values), so that what curl signs is exactly what is sent.
inline std::string canonical_query(std::vector<std::pair<std::string, std::string>> params) {
  std::sort(params.begin(), params.end());
  std::string q;
  for (const auto& [k, v] : params) {
    if (!q.empty()) q += '&';
    q += uri_encode(k, false) + "=" + uri_encode(v, false);
  }
  return q;
}

/// One request. `body` is sent (PUT, POST); a successful GET's bytes go into `into` when it
/// is given (exactly its size is expected), otherwise into the response's `body`.
struct s3_request {
  const char* method = "GET";
  std::string key{};    ///< the object's full key (prefix included); "" for the bucket itself
  std::string query{};  ///< from canonical_query
  std::vector<std::string> headers{};
  std::span<const std::byte> body{};
  std::span<std::byte> into{};
  const char* content_type = "application/octet-stream";
  /// The body's MD5, when the caller has it already (it checks the ETag against it).
  std::optional<digest_bytes<16>> body_md5{};
};

struct s3_response {
  long status = 0;
  std::string body;              ///< bounded: S3's XML answers and error documents
  std::uint64_t received = 0;    ///< bytes written into the request's `into`
  std::string etag;              ///< without its quotes
  std::optional<std::uint64_t> content_length;
  std::string curl_error;        ///< curl's own description of a failed transfer
  bool overflow = false;         ///< the server sent more than `into` holds
};

/// An S3 error a caller may want to tell apart from others (404, 416, ...).
class s3_status_error : public error {
 public:
  s3_status_error(error_kind k, std::string msg, long status, std::string code)
      : error(k, std::move(msg)), status_(status), code_(std::move(code)) {}
  long status() const noexcept { return status_; }
  const std::string& code() const noexcept { return code_; }

 private:
  long status_;
  std::string code_;
};

class s3_client {
 public:
  explicit s3_client(s3_options o) : opt_(resolve(std::move(o))) {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    validate();
  }
  ~s3_client() {
    for (auto* h : idle_) curl_easy_cleanup(h);
  }
  s3_client(const s3_client&) = delete;
  s3_client& operator=(const s3_client&) = delete;

  const s3_options& options() const noexcept { return opt_; }

  /// The object's full key: the prefix, then `key`.
  std::string full_key(std::string_view key) const {
    if (opt_.prefix.empty()) return std::string(key);
    if (key.empty()) return opt_.prefix;
    return opt_.prefix + "/" + std::string(key);
  }

  /// "s3://bucket/prefix/key": how messages name an object. Never holds a secret.
  std::string describe(std::string_view key) const { return "s3://" + opt_.bucket + "/" + full_key(key); }

  std::string url(std::string_view full, std::string_view query) const {
    const auto scheme_end = opt_.endpoint.find("://") + 3;
    std::string u = opt_.addressing == s3_addressing::virtual_host
                        ? opt_.endpoint.substr(0, scheme_end) + opt_.bucket + "." + opt_.endpoint.substr(scheme_end) + "/"
                        : opt_.endpoint + "/" + opt_.bucket + (full.empty() ? "" : "/");
    u += uri_encode(full, true);
    if (!query.empty()) u += "?" + std::string(query);
    return u;
  }

  /// Performs `r`, trying again on transient failures (see s3_retry). Returns a 2xx response;
  /// throws s3_status_error for an error answer and ckpt::error when no answer came.
  s3_response perform(const s3_request& r) const {
    const auto start = std::chrono::steady_clock::now();
    // Digests once per request, not once per attempt.
    const std::string_view m = r.method;
    const bool has_body = !r.body.empty() || m == "PUT" || m == "POST";
    std::vector<std::string> lines = r.headers;
    if (has_body) {
      lines.push_back("Content-Type: " + std::string(r.content_type));
      lines.push_back("Content-MD5: " + to_base64(r.body_md5 ? *r.body_md5 : md5(r.body)));
    }
    // curl 7.88 neither sends x-amz-content-sha256 nor can hash a body it reads through a
    // callback; it signs the value this header carries, so the header makes both right.
    lines.push_back("x-amz-content-sha256: " +
                    (!has_body ? std::string(empty_sha256) : opt_.sign_payload ? to_hex(sha256(r.body)) : "UNSIGNED-PAYLOAD"));
    if (!opt_.credentials.session_token.empty()) lines.push_back("x-amz-security-token: " + opt_.credentials.session_token);
    std::string last;
    unsigned attempt = 0;
    for (;;) {
      ++attempt;
      s3_response resp;
      std::string transient;
      auto handle = acquire();
      const auto rc = run(handle.get(), r, lines, has_body, resp);
      if (rc != CURLE_OK) {
        transient = resp.curl_error.empty() ? std::string(curl_easy_strerror(rc)) : resp.curl_error;
        if (resp.overflow)
          throw error(error_kind::corrupt, what(r) + ": the server sent more than the " + std::to_string(r.into.size()) +
                                               " bytes asked for");
        if (!retryable(rc)) throw fail(r, "", transient);
      } else if (resp.status >= 200 && resp.status < 300) {
        release(std::move(handle));
        return resp;
      } else {
        const auto code = xml_text(resp.body, "Code").value_or("");
        const auto message = xml_text(resp.body, "Message").value_or("");
        if (!retryable(resp.status, code)) {
          release(std::move(handle));
          throw status_error(r, resp.status, code, message);
        }
        transient = "HTTP " + std::to_string(resp.status) + (code.empty() ? "" : " " + code) +
                    (message.empty() ? "" : ": " + message);
        release(std::move(handle));
      }
      last = std::move(transient);
      const auto elapsed = std::chrono::steady_clock::now() - start;
      if (attempt >= opt_.retry.max_attempts || elapsed >= opt_.retry.deadline)
        throw fail(r, " after " + std::to_string(attempt) + " attempts over " +
                          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count()) + " ms",
                   last);
      std::this_thread::sleep_for(backoff(attempt));
    }
  }

 private:
  struct handle_deleter {
    void operator()(CURL* h) const noexcept { curl_easy_cleanup(h); }
  };
  using handle = std::unique_ptr<CURL, handle_deleter>;

  /// Easy handles are pooled: each keeps its connection open, so back-to-back requests to the
  /// same server skip the TCP (and TLS) handshake.
  handle acquire() const {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        handle h(idle_.back());
        idle_.pop_back();
        return h;
      }
    }
    handle h(curl_easy_init());
    if (!h) throw error(error_kind::io, "s3: curl_easy_init failed");
    return h;
  }
  void release(handle h) const {
    std::lock_guard lock(mu_);
    idle_.push_back(h.release());
  }

  struct transfer {
    const s3_request* req;
    s3_response* resp;
    std::size_t sent = 0;
    CURL* h;
  };

  static std::size_t on_read(char* buf, std::size_t size, std::size_t n, void* p) {
    auto& t = *static_cast<transfer*>(p);
    const auto k = std::min(size * n, t.req->body.size() - t.sent);
    if (k) std::memcpy(buf, t.req->body.data() + t.sent, k);
    t.sent += k;
    return k;
  }
  static int on_seek(void* p, curl_off_t offset, int origin) {
    auto& t = *static_cast<transfer*>(p);
    if (origin != SEEK_SET || offset < 0 || static_cast<std::uint64_t>(offset) > t.req->body.size()) return CURL_SEEKFUNC_FAIL;
    t.sent = static_cast<std::size_t>(offset);
    return CURL_SEEKFUNC_OK;
  }
  static std::size_t on_write(char* data, std::size_t size, std::size_t n, void* p) {
    auto& t = *static_cast<transfer*>(p);
    const auto k = size * n;
    long status = 0;
    curl_easy_getinfo(t.h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300 && !t.req->into.empty()) {
      // More than was asked for is a server fault; stop rather than write past the buffer.
      if (k > t.req->into.size() - t.resp->received) {
        t.resp->overflow = true;
        return 0;
      }
      std::memcpy(t.req->into.data() + t.resp->received, data, k);
      t.resp->received += k;
      return k;
    }
    constexpr std::size_t max_body = std::size_t{64} << 20;  // far beyond any XML answer
    if (t.resp->body.size() + k > max_body) return 0;
    t.resp->body.append(data, k);
    return k;
  }
  static std::size_t on_header(char* data, std::size_t size, std::size_t n, void* p) {
    auto& t = *static_cast<transfer*>(p);
    const std::string_view line(data, size * n);
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) return size * n;
    std::string name(line.substr(0, colon));
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    auto value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n' || value.back() == ' ')) value.remove_suffix(1);
    if (name == "etag") {
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
      t.resp->etag = std::string(value);
    } else if (name == "content-length") {
      std::uint64_t v = 0;
      bool ok = !value.empty();
      for (char c : value) ok = ok && c >= '0' && c <= '9' && (v = v * 10 + static_cast<unsigned>(c - '0'), true);
      if (ok) t.resp->content_length = v;
    }
    return size * n;
  }

  CURLcode run(CURL* h, const s3_request& r, const std::vector<std::string>& lines, bool has_body, s3_response& resp) const {
    curl_easy_reset(h);  // keeps the connection; forgets the previous request's options
    transfer t{&r, &resp, 0, h};
    const auto u = url(r.key, r.query);
    curl_easy_setopt(h, CURLOPT_URL, u.c_str());
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    char curl_error[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_error);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(opt_.connect_timeout.count()));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>((opt_.stall_timeout.count() + 999) / 1000)));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    if (!opt_.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, opt_.ca_file.c_str());
    curl_slist* connect_to = nullptr;
    if (!opt_.connect_to.empty()) {
      connect_to = curl_slist_append(nullptr, opt_.connect_to.c_str());
      curl_easy_setopt(h, CURLOPT_CONNECT_TO, connect_to);
    }

    curl_slist* hdrs = nullptr;
    for (const auto& l : lines) hdrs = curl_slist_append(hdrs, l.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);

    const std::string_view m = r.method;
    if (m == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (m == "PUT") {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    } else if (m == "POST") {
      curl_easy_setopt(h, CURLOPT_POST, 1L);
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
    } else if (m != "GET") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r.method);
    }
    if (has_body) {
      curl_easy_setopt(h, CURLOPT_READFUNCTION, &on_read);
      curl_easy_setopt(h, CURLOPT_READDATA, &t);
      curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, &on_seek);
      curl_easy_setopt(h, CURLOPT_SEEKDATA, &t);
    }
    std::string sigv4;
    if (!opt_.credentials.access_key_id.empty()) {
      sigv4 = "aws:amz:" + opt_.region + ":s3";
      curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
      curl_easy_setopt(h, CURLOPT_USERNAME, opt_.credentials.access_key_id.c_str());
      curl_easy_setopt(h, CURLOPT_PASSWORD, opt_.credentials.secret_access_key.c_str());
    }
    const auto rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp.status);
    resp.curl_error = curl_error;
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);  // the buffer dies with this frame
    curl_slist_free_all(hdrs);
    curl_slist_free_all(connect_to);
    return rc;
  }

  static bool retryable(CURLcode rc) {
    switch (rc) {
      case CURLE_COULDNT_CONNECT:  // a server restarting; bounded by the retry policy
      case CURLE_OPERATION_TIMEDOUT:
      case CURLE_SEND_ERROR:
      case CURLE_RECV_ERROR:
      case CURLE_GOT_NOTHING:
      case CURLE_PARTIAL_FILE:
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
        return true;
      default:
        return false;
    }
  }
  static bool retryable(long status, const std::string& code) {
    return status == 500 || status == 502 || status == 503 || status == 504 || code == "SlowDown" ||
           code == "RequestTimeout" || code == "InternalError";
  }

  std::chrono::milliseconds backoff(unsigned attempt) const {
    thread_local std::minstd_rand rng{std::random_device{}()};
    const auto cap = std::min<std::int64_t>(opt_.retry.max_delay.count(),
                                            opt_.retry.base_delay.count() << std::min(attempt, 20u));
    return std::chrono::milliseconds(std::uniform_int_distribution<std::int64_t>(0, std::max<std::int64_t>(cap, 0))(rng));
  }

  std::string what(const s3_request& r) const {
    return "s3: " + std::string(r.method) + " " + describe_full(r.key) + (r.query.empty() ? "" : "?" + r.query);
  }
  std::string describe_full(std::string_view full) const { return "s3://" + opt_.bucket + "/" + std::string(full); }

  error fail(const s3_request& r, const std::string& tries, const std::string& why) const {
    return error(error_kind::io, what(r) + " failed" + tries + ": " + why + " (endpoint " + opt_.endpoint + ")");
  }
  s3_status_error status_error(const s3_request& r, long status, const std::string& code, const std::string& message) const {
    const auto kind = status == 404 ? error_kind::not_found : error_kind::io;
    return s3_status_error(kind,
                           what(r) + " failed: HTTP " + std::to_string(status) + (code.empty() ? "" : " " + code) +
                               (message.empty() ? "" : ": " + message),
                           status, code);
  }

  static std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  }

  static s3_options resolve(s3_options o) {
    if (o.region.empty()) o.region = env("AWS_REGION");
    if (o.region.empty()) o.region = env("AWS_DEFAULT_REGION");
    if (o.region.empty()) o.region = "us-east-1";
    if (o.endpoint.empty()) o.endpoint = env("AWS_ENDPOINT_URL_S3");
    if (o.endpoint.empty()) o.endpoint = env("AWS_ENDPOINT_URL");
    if (o.endpoint.empty()) o.endpoint = "https://s3." + o.region + ".amazonaws.com";
    while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
    if (o.credentials.access_key_id.empty()) {
      o.credentials.access_key_id = env("AWS_ACCESS_KEY_ID");
      o.credentials.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
      o.credentials.session_token = env("AWS_SESSION_TOKEN");
    }
    while (!o.prefix.empty() && o.prefix.back() == '/') o.prefix.pop_back();
    while (!o.prefix.empty() && o.prefix.front() == '/') o.prefix.erase(0, 1);
    return o;
  }

  void validate() const {
    auto bad = [](const std::string& why) { throw error(error_kind::invalid_argument, "s3: " + why); };
    if (opt_.bucket.empty()) bad("no bucket given");
    for (char c : opt_.bucket)
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.'))
        bad("bucket name \"" + opt_.bucket + "\" has a character S3 does not allow in bucket names");
    if (!opt_.endpoint.starts_with("http://") && !opt_.endpoint.starts_with("https://"))
      bad("endpoint \"" + opt_.endpoint + "\" must start with http:// or https://");
    if (opt_.endpoint.find('/', opt_.endpoint.find("://") + 3) != std::string::npos)
      bad("endpoint \"" + opt_.endpoint + "\" must not have a path (put it in the prefix)");
    if (opt_.part_bytes < (std::size_t{5} << 20) || opt_.part_bytes > (std::size_t{5} << 30))
      bad("part_bytes " + std::to_string(opt_.part_bytes) + " is outside S3's limits of 5 MiB to 5 GiB per part");
    if (opt_.upload_concurrency == 0 || opt_.download_concurrency == 0) bad("concurrency must be at least 1");
    if (opt_.range_bytes == 0) bad("range_bytes must not be 0");
    if (opt_.retry.max_attempts == 0) bad("retry.max_attempts must be at least 1");
    if (!opt_.credentials.access_key_id.empty() && opt_.credentials.secret_access_key.empty())
      bad("an access key id without a secret access key");
  }

  s3_options opt_;
  mutable std::mutex mu_;
  mutable std::vector<CURL*> idle_;
};

}  // namespace ckpt::detail
