#pragma once
/// @file s3/options.hpp
/// How `ckpt::s3` reaches a bucket: endpoint, region, bucket, prefix, addressing, credentials,
/// and the knobs of its transfers (part size, parallelism, retries, timeouts).

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <string>

namespace ckpt {

/// Whether the bucket goes into the path (`http://host/bucket/key`, what most S3-compatible
/// servers expect) or into the host name (`https://bucket.host/key`, AWS's preferred form).
enum class s3_addressing { path, virtual_host };

/// Access keys. Empty `access_key_id` means "take them from the environment"
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`); if the environment has
/// none either, requests go unsigned (public buckets). They are never put into messages.
struct s3_credentials {
  std::string access_key_id{};
  std::string secret_access_key{};
  std::string session_token{};  ///< for temporary credentials; sent as x-amz-security-token
};

/// Which failures are tried again, and for how long. Timeouts, connection resets, HTTP
/// 500/502/503/504 and `SlowDown` are; other 4xx answers are not (they will not get better).
/// The delay before attempt k+1 is uniform in [0, min(max_delay, base_delay * 2^k)] ("full
/// jitter"), so ranks that failed together do not retry together.
struct s3_retry {
  unsigned max_attempts = 6;                          ///< tries per request, the first included
  std::chrono::milliseconds base_delay{100};
  std::chrono::milliseconds max_delay{5000};
  std::chrono::milliseconds deadline{120000};         ///< no new attempt starts after this long
};

/// Everything `ckpt::s3` needs to know. Empty fields are filled from the environment by
/// `ckpt::s3`'s constructor: `endpoint` from `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`
/// (else `https://s3.<region>.amazonaws.com`), `region` from `AWS_REGION` or
/// `AWS_DEFAULT_REGION` (else us-east-1).
///
/// @code
/// ckpt::s3_options o{.endpoint = "http://127.0.0.1:9000", .bucket = "runs", .prefix = "gpt/run7"};
/// ckpt::checkpointer<ckpt::single_process, ckpt::s3> cp{{}, ckpt::s3{o}};
/// @endcode
struct s3_options {
  std::string endpoint{};  ///< scheme://host[:port], no path
  std::string region{};
  std::string bucket{};
  std::string prefix{};    ///< keys are stored as prefix/key ("" for the bucket's root)
  s3_addressing addressing = s3_addressing::path;
  s3_credentials credentials{};

  /// Objects up to this size go in one PUT; larger ones as a multipart upload of parts this
  /// size (S3 needs at least 5 MiB per part but the last, and at most 10 000 parts).
  std::size_t part_bytes = std::size_t{64} << 20;
  /// Parts of one object uploaded at once, and ranges of one large read fetched at once.
  /// A writer holds at most `upload_concurrency + 1` parts in memory.
  unsigned upload_concurrency = 4;
  unsigned download_concurrency = 4;
  /// A read larger than this is split into ranges of this size fetched in parallel.
  std::size_t range_bytes = std::size_t{16} << 20;

  /// Sign the SHA-256 of every body (`x-amz-content-sha256`) instead of `UNSIGNED-PAYLOAD`.
  /// Either way every body carries `Content-MD5`, which S3 checks, and ckpt checks the ETag
  /// the server returns against the same MD5.
  bool sign_payload = false;
  /// Compare the ETag of each PUT and part with the MD5 of what was sent. Turn off for buckets
  /// whose ETags are not MD5s (SSE-KMS encryption).
  bool check_etag = true;

  s3_retry retry{};
  std::chrono::milliseconds connect_timeout{5000};
  /// A transfer that moves no byte for this long is abandoned (and retried): a stalled
  /// connection fails instead of hanging a save forever.
  std::chrono::milliseconds stall_timeout{30000};

  /// Passed to curl's CURLOPT_CONNECT_TO ("HOST:PORT:CONNECT-HOST:CONNECT-PORT"): connect to
  /// another address than the URL's without changing the signed Host header. For tests.
  std::string connect_to{};
  /// CA bundle for https endpoints (curl's default when empty).
  std::string ca_file{};
};

}  // namespace ckpt
