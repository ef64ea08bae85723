#pragma once
// What the S3 test programs share: the harness's environment (tests/s3/harness.py), store
// options for a test's own prefix, and the proxy's control API (faults, request log, kill and
// restart of s3rver).

#include <doctest/doctest.h>

#include <ckpt/s3.hpp>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace s3test {

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  REQUIRE_MESSAGE(v != nullptr, "run under tests/s3/harness.py: ", name, " is not set");
  return v;
}

inline bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// Options for a store under its own prefix, through s3rver directly or through the proxy.
inline ckpt::s3_options options(const std::string& prefix, bool via_proxy = false) {
  ckpt::s3_options o;
  o.endpoint = env(via_proxy ? "CKPT_TEST_S3_PROXY" : "CKPT_TEST_S3_ENDPOINT");
  o.bucket = env("CKPT_TEST_S3_BUCKET");
  o.prefix = "tests/" + prefix;
  o.part_bytes = std::size_t{5} << 20;  // S3's smallest: multipart uploads with small states
  o.range_bytes = std::size_t{2} << 20;
  o.upload_concurrency = 3;
  o.retry = {.max_attempts = 5, .base_delay = std::chrono::milliseconds(10), .max_delay = std::chrono::milliseconds(200)};
  o.stall_timeout = std::chrono::milliseconds(1500);
  return o;
}

/// A plain HTTP call to the harness's control server, with curl.
inline std::string control(const char* method, const std::string& path, const std::string& body = "") {
  CURL* h = curl_easy_init();
  std::string out;
  const auto url = env("CKPT_TEST_S3_CONTROL") + path;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  if (!body.empty()) curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, +[](char* d, std::size_t s, std::size_t n, void* p) {
    static_cast<std::string*>(p)->append(d, s * n);
    return s * n;
  });
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &out);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
  const auto rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(h);
  REQUIRE_MESSAGE(rc == CURLE_OK, "control ", method, " ", path, ": ", curl_easy_strerror(rc));
  REQUIRE_MESSAGE(status / 100 == 2, "control ", method, " ", path, ": HTTP ", status, " ", out);
  return out;
}

/// The proxy's request log, one "METHOD path?query status action" line per request.
inline std::vector<std::string> request_log() {
  const auto json = control("GET", "/log/lines");
  std::vector<std::string> lines;
  // {"lines": ["...", ...]}: paths are percent-encoded, so no line holds a quote.
  for (auto at = json.find('[') + 1; (at = json.find('"', at)) != std::string::npos;) {
    const auto end = json.find('"', at + 1);
    lines.push_back(json.substr(at + 1, end - at - 1));
    at = end + 1;
  }
  return lines;
}
inline std::size_t count(const std::vector<std::string>& lines, const std::string& what) {
  return static_cast<std::size_t>(std::count_if(lines.begin(), lines.end(), [&](const auto& l) { return mentions(l, what); }));
}


}  // namespace s3test
