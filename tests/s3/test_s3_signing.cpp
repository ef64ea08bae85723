// The requests ckpt::s3 sends are signed right. s3rver does not check signatures, so this
// checks them here, two ways:
//
// 1. A reference SigV4 signer (below, from the specification) reproduces AWS's published
//    examples for S3 (GET Object with Range, PUT Object, GET Bucket lifecycle, ListObjects).
// 2. ckpt's client sends requests to a loopback listener that captures them: the published
//    examples that its requests can express come out with AWS's exact signatures, and every
//    kind of request ckpt sends (PUT with Content-MD5, multipart, listing with odd prefixes and
//    continuation tokens, DELETE, HEAD) carries the signature the reference computes from the
//    bytes actually sent.
//
// Also here: option checking, error messages that never hold the secret, the XML helpers.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/hmac.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <ckpt/s3.hpp>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

// --- the reference signer ----------------------------------------------------------------------

std::string hex(std::string_view bytes) {
  static constexpr char d[] = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

std::string hmac(std::string_view key, std::string_view data) {
  unsigned char out[32];
  unsigned len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

std::string sha256_hex(std::string_view s) { return ckpt::detail::to_hex(ckpt::detail::sha256(std::as_bytes(std::span(s.data(), s.size())))); }

/// Signature V4 of a canonical request, for S3 in `region` on `date` (yyyymmddThhmmssZ).
std::string sign(const std::string& canonical_request, const std::string& date, const std::string& region, const std::string& secret) {
  const auto day = date.substr(0, 8);
  const auto scope = day + "/" + region + "/s3/aws4_request";
  const auto to_sign = "AWS4-HMAC-SHA256\n" + date + "\n" + scope + "\n" + sha256_hex(canonical_request);
  auto key = hmac("AWS4" + secret, day);
  key = hmac(key, region);
  key = hmac(key, "s3");
  key = hmac(key, "aws4_request");
  return hex(hmac(key, to_sign));
}

const std::string example_key = "AKIAIOSFODNN7EXAMPLE";
const std::string example_secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
const std::string example_date = "20130524T000000Z";

// --- a loopback listener that records requests -------------------------------------------------

struct captured {
  std::string method, target;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in order
  std::string header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return "";
  }
};

/// Answers every request with `status` and `body` (after reading the request's body, when it
/// does not wait for a 100 Continue) and keeps what it received.
class listener {
 public:
  /// What to answer a request with: a status and a body.
  using handler = std::function<std::pair<int, std::string>(const captured&)>;

  explicit listener(int status = 200, std::string body = "")
      : listener([status, body](const captured&) { return std::pair{status, body}; }) {}
  explicit listener(handler h) : answer_(std::move(h)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 16);
    thread_ = std::thread([this] { serve(); });
  }
  ~listener() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }
  std::vector<captured> requests() {
    std::lock_guard lock(mu_);
    return got_;
  }

 private:
  void serve() {
    while (!stop_) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string data;
      char buf[65536];
      for (;;) {  // one request per connection is all a test needs: answer "Connection: close"
        const auto head_end = data.find("\r\n\r\n");
        if (head_end != std::string::npos) {
          auto req = parse(data.substr(0, head_end));
          std::size_t body_len = 0;
          if (auto cl = req.header("content-length"); !cl.empty()) body_len = std::stoul(cl);
          const bool expects = req.header("expect") == "100-continue";
          while (!expects && data.size() < head_end + 4 + body_len) {
            const auto n = ::recv(c, buf, sizeof buf, 0);
            if (n <= 0) break;
            data.append(buf, static_cast<std::size_t>(n));
          }
          const auto [status, body] = answer_(req);
          {
            std::lock_guard lock(mu_);
            got_.push_back(std::move(req));
          }
          const auto answer = "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Length: " + std::to_string(body.size()) +
                              "\r\nETag: \"" + etag_ + "\"\r\nConnection: close\r\n\r\n" + body;
          (void)!::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
          break;
        }
        const auto n = ::recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        data.append(buf, static_cast<std::size_t>(n));
      }
      ::close(c);
    }
  }
  static captured parse(const std::string& head) {
    captured r;
    std::istringstream in(head);
    std::string line, version;
    std::getline(in, line);
    std::istringstream first(line);
    first >> r.method >> r.target >> version;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      auto value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      value.erase(value.find_last_not_of(" \t") + 1);
      r.headers.emplace_back(name, value);
    }
    return r;
  }

  handler answer_;
  std::string etag_ = "00000000000000000000000000000000";
  int fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<captured> got_;
  std::thread thread_;
};

/// What the Authorization header of a captured request says.
struct authorization {
  std::string credential, signed_headers, signature;
};
authorization parse_authorization(const std::string& v) {
  authorization a;
  REQUIRE(v.starts_with("AWS4-HMAC-SHA256 "));
  auto field = [&](std::string_view name) {
    const auto at = v.find(std::string(name) + "=");
    REQUIRE(at != std::string::npos);
    const auto start = at + name.size() + 1;
    return v.substr(start, v.find(',', start) - start);
  };
  a.credential = field("Credential");
  a.signed_headers = field("SignedHeaders");
  a.signature = field("Signature");
  return a;
}

/// The signature the reference signer gives the request as it was received: the canonical
/// request is rebuilt from the bytes on the wire, so anything curl signed differently from
/// what it sent shows up as a mismatch.
std::string reference_signature(const captured& r, const std::string& region, const std::string& secret) {
  const auto auth = parse_authorization(r.header("authorization"));
  const auto q = r.target.find('?');
  const auto path = r.target.substr(0, q);
  std::string query = q == std::string::npos ? "" : r.target.substr(q + 1);
  std::vector<std::string> params;
  for (std::size_t at = 0; !query.empty() && at <= query.size();) {
    auto amp = query.find('&', at);
    if (amp == std::string::npos) amp = query.size();
    auto p = query.substr(at, amp - at);
    if (p.find('=') == std::string::npos) p += "=";
    params.push_back(p);
    at = amp + 1;
  }
  std::sort(params.begin(), params.end());
  std::string canonical_query;
  for (const auto& p : params) canonical_query += (canonical_query.empty() ? "" : "&") + p;
  std::string headers;
  std::istringstream names(auth.signed_headers);
  for (std::string name; std::getline(names, name, ';');) headers += name + ":" + r.header(name) + "\n";
  const auto canonical = r.method + "\n" + path + "\n" + canonical_query + "\n" + headers + "\n" + auth.signed_headers + "\n" +
                         r.header("x-amz-content-sha256");
  return sign(canonical, r.header("x-amz-date"), region, secret);
}

ckpt::s3_options example_options(const listener& l) {
  ckpt::s3_options o;
  o.endpoint = "http://s3.amazonaws.com";
  o.region = "us-east-1";
  o.bucket = "examplebucket";
  o.addressing = ckpt::s3_addressing::virtual_host;
  o.credentials = {example_key, example_secret, ""};
  o.connect_to = "examplebucket.s3.amazonaws.com:80:127.0.0.1:" + std::to_string(l.port());
  o.retry.max_attempts = 1;
  return o;
}

}  // namespace

TEST_CASE("the reference signer reproduces AWS's published Signature V4 examples for S3") {
  // https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html
  const std::string empty = std::string(ckpt::detail::empty_sha256);
  CHECK(sign("GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:" + empty +
                 "\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n" + empty,
             example_date, "us-east-1", example_secret) == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  const auto body_hash = sha256_hex("Welcome to Amazon S3.");
  CHECK(body_hash == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  CHECK(sign("PUT\n/test%24file.text\n\ndate:Fri, 24 May 2013 00:00:00 GMT\nhost:examplebucket.s3.amazonaws.com\n"
             "x-amz-content-sha256:" + body_hash + "\nx-amz-date:20130524T000000Z\nx-amz-storage-class:REDUCED_REDUNDANCY\n\n"
             "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class\n" + body_hash,
             example_date, "us-east-1", example_secret) == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
  CHECK(sign("GET\n/\nlifecycle=\nhost:examplebucket.s3.amazonaws.com\nx-amz-content-sha256:" + empty +
                 "\nx-amz-date:20130524T000000Z\n\nhost;x-amz-content-sha256;x-amz-date\n" + empty,
             example_date, "us-east-1", example_secret) == "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  CHECK(sign("GET\n/\nmax-keys=2&prefix=J\nhost:examplebucket.s3.amazonaws.com\nx-amz-content-sha256:" + empty +
                 "\nx-amz-date:20130524T000000Z\n\nhost;x-amz-content-sha256;x-amz-date\n" + empty,
             example_date, "us-east-1", example_secret) == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST_CASE("ckpt's client signs AWS's examples with AWS's published signatures") {
  listener l;
  ckpt::detail::s3_client c{example_options(l)};
  const std::string date = "x-amz-date: " + example_date;  // curl signs with the date it is given
  std::byte ten[10];
  c.perform({.method = "GET", .key = "test.txt", .headers = {date, "Range: bytes=0-9"}, .into = ten});
  c.perform({.method = "GET", .key = "", .query = "lifecycle=", .headers = {date}});
  c.perform({.method = "GET", .key = "", .query = ckpt::detail::canonical_query({{"prefix", "J"}, {"max-keys", "2"}}), .headers = {date}});
  const auto got = l.requests();
  REQUIRE(got.size() == 3);
  CHECK(got[0].target == "/test.txt");
  CHECK(parse_authorization(got[0].header("authorization")).signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  CHECK(got[1].target == "/?lifecycle=");
  CHECK(parse_authorization(got[1].header("authorization")).signature == "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
  CHECK(got[2].target == "/?max-keys=2&prefix=J");
  CHECK(parse_authorization(got[2].header("authorization")).signature == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
  for (const auto& r : got) CHECK(parse_authorization(r.header("authorization")).credential == example_key + "/20130524/us-east-1/s3/aws4_request");
}

TEST_CASE("every kind of request ckpt::s3 sends is signed over exactly what it sends") {
  for (const bool sign_payload : {false, true}) {
    for (const auto addressing : {ckpt::s3_addressing::path, ckpt::s3_addressing::virtual_host}) {
      CAPTURE(sign_payload);
      CAPTURE(static_cast<int>(addressing));
      listener l;
      auto o = example_options(l);
      o.addressing = addressing;
      o.endpoint = addressing == ckpt::s3_addressing::path ? "http://127.0.0.1:" + std::to_string(l.port()) : o.endpoint;
      if (addressing == ckpt::s3_addressing::path) o.connect_to.clear();
      o.region = "eu-west-3";
      o.prefix = "runs/gpt 7";
      o.sign_payload = sign_payload;
      o.credentials.session_token = "FQoGZXIvYXdzEXAMPLETOKEN+/=";
      ckpt::detail::s3_client c{o};
      const std::string body = "some bytes of a shard file \x01\x02";
      const auto bytes = std::as_bytes(std::span(body.data(), body.size()));
      const auto k = c.full_key("global_step10/mp_rank_00/model optim+rng.ckpt");
      c.perform({.method = "PUT", .key = k, .body = bytes});
      c.perform({.method = "POST", .key = k, .query = "uploads=", .body = {}});
      c.perform({.method = "PUT", .key = k, .query = ckpt::detail::canonical_query({{"partNumber", "3"}, {"uploadId", "a/b+c=="}}), .body = bytes});
      c.perform({.method = "POST", .key = k, .query = ckpt::detail::canonical_query({{"uploadId", "a/b+c=="}}), .body = bytes, .content_type = "application/xml"});
      c.perform({.method = "GET", .key = "", .query = ckpt::detail::canonical_query({{"list-type", "2"}, {"prefix", c.full_key("") + "/"}, {"delimiter", "/"}, {"continuation-token", "1/2+3=&x"}})});
      c.perform({.method = "HEAD", .key = k});
      c.perform({.method = "DELETE", .key = k});
      c.perform({.method = "DELETE", .key = k, .query = ckpt::detail::canonical_query({{"uploadId", "a/b+c=="}})});
      std::byte out[4];
      c.perform({.method = "GET", .key = k, .headers = {"Range: bytes=4-7"}, .into = out});
      const auto got = l.requests();
      REQUIRE(got.size() == 9);
      for (const auto& r : got) {
        CAPTURE(r.method + " " + r.target);
        const auto auth = parse_authorization(r.header("authorization"));
        CHECK(auth.signature == reference_signature(r, "eu-west-3", example_secret));
        CHECK(auth.signed_headers.find("x-amz-security-token") != std::string::npos);
        CHECK(r.header("x-amz-security-token") == "FQoGZXIvYXdzEXAMPLETOKEN+/=");
        const bool names_object = r.target.find("gpt%207") != std::string::npos;
        const bool lists_bucket = r.target.starts_with("/?") || r.target.starts_with("/examplebucket?");
        CHECK((names_object || lists_bucket));
      }
      // Bodies carry their MD5, signed; and with sign_payload their SHA-256 in place of UNSIGNED-PAYLOAD.
      CHECK(got[0].header("content-md5") == ckpt::detail::to_base64(ckpt::detail::md5(bytes)));
      CHECK(parse_authorization(got[0].header("authorization")).signed_headers.find("content-md5") != std::string::npos);
      CHECK(got[0].header("x-amz-content-sha256") == (sign_payload ? sha256_hex(body) : "UNSIGNED-PAYLOAD"));
      CHECK(got[5].header("x-amz-content-sha256") == ckpt::detail::empty_sha256);
      CHECK(got[2].target.ends_with("?partNumber=3&uploadId=a%2Fb%2Bc%3D%3D"));
    }
  }
}

TEST_CASE("S3 errors name the object, the status and S3's code, never the secret; 4xx is not retried") {
  listener l(403, "<?xml version=\"1.0\"?><Error><Code>AccessDenied</Code><Message>Access &amp; denied</Message></Error>");
  auto o = example_options(l);
  o.retry.max_attempts = 4;
  ckpt::s3 store{o};
  std::byte b[8];
  try {
    store.read("global_step1/metadata.json", 0, b);
    FAIL("no error");
  } catch (const ckpt::error& e) {
    const std::string m = e.what();
    CHECK(m.find("s3://examplebucket/global_step1/metadata.json") != std::string::npos);
    CHECK(m.find("HTTP 403 AccessDenied: Access & denied") != std::string::npos);
    CHECK(m.find(example_secret) == std::string::npos);
    CHECK(m.find("wJalr") == std::string::npos);
  }
  CHECK(l.requests().size() == 1);  // not retried
}

TEST_CASE("503 SlowDown is retried with backoff until the attempts run out") {
  listener l(503, "<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>");
  auto o = example_options(l);
  o.retry = {.max_attempts = 3, .base_delay = std::chrono::milliseconds(1), .max_delay = std::chrono::milliseconds(5)};
  ckpt::s3 store{o};
  CHECK_THROWS_WITH_AS(store.size("a"), doctest::Contains("after 3 attempts"), ckpt::error);
  CHECK(l.requests().size() == 3);
}

TEST_CASE("s3_options are checked when the store is made") {
  auto bad = [](ckpt::s3_options o) {
    try {
      ckpt::s3 s{o};
      return std::string();
    } catch (const ckpt::error& e) {
      CHECK(e.kind() == ckpt::error_kind::invalid_argument);
      return std::string(e.what());
    }
  };
  const ckpt::s3_options ok{.endpoint = "http://127.0.0.1:9", .bucket = "b", .credentials = {"k", "s", ""}};
  CHECK(bad(ok).empty());
  auto o = ok;
  o.bucket = "";
  CHECK(bad(o).find("no bucket") != std::string::npos);
  o = ok;
  o.bucket = "Bad_Bucket";
  CHECK(bad(o).find("Bad_Bucket") != std::string::npos);
  o = ok;
  o.endpoint = "ftp://x";
  CHECK(bad(o).find("http://") != std::string::npos);
  o = ok;
  o.endpoint = "http://127.0.0.1:9/path";
  CHECK(bad(o).find("prefix") != std::string::npos);
  o = ok;
  o.part_bytes = 1 << 20;
  CHECK(bad(o).find("5 MiB") != std::string::npos);
  o = ok;
  o.credentials = {"key-only", "", ""};
  CHECK(bad(o).find("secret") != std::string::npos);
}

TEST_CASE("the XML helpers read S3's answers") {
  using namespace ckpt::detail;
  const std::string doc =
      "<ListBucketResult><Prefix>a/</Prefix><KeyCount>2</KeyCount><Contents><Key>a/x&amp;y</Key></Contents>"
      "<Contents><Key>a/&#233;&#x4E2D;</Key></Contents><CommonPrefixes><Prefix>a/d/</Prefix></CommonPrefixes>"
      "<IsTruncated>true</IsTruncated><NextContinuationToken>t&lt;1&gt;</NextContinuationToken><Empty/></ListBucketResult>";
  CHECK(xml_texts(doc, "Key") == std::vector<std::string>{"a/x&y", "a/\xC3\xA9\xE4\xB8\xAD"});
  CHECK(xml_text(doc, "KeyCount") == "2");
  CHECK(xml_text(doc, "NextContinuationToken") == "t<1>");
  CHECK(xml_text(doc, "Empty") == "");
  CHECK(!xml_text(doc, "Missing"));
  const auto prefixes = xml_blocks(doc, "CommonPrefixes");
  REQUIRE(prefixes.size() == 1);
  CHECK(xml_text(prefixes[0], "Prefix") == "a/d/");
  CHECK(xml_unescape("&bogus; &#xZZ; &") == "&bogus; &#xZZ; &");
  CHECK(xml_escape("<\"a&b\">") == "&lt;&quot;a&amp;b&quot;&gt;");
  CHECK(uri_encode("a b/c+d~", true) == "a%20b/c%2Bd~");
  CHECK(canonical_query({{"b", "2"}, {"a", "x/y"}, {"uploads", ""}}) == "a=x%2Fy&b=2&uploads=");
}

TEST_CASE("listings follow continuation tokens across pages, and a truncated page without one is an error") {
  // Three pages; each token is only valid once and carries characters that need encoding.
  listener l([](const captured& r) {
    auto page = [](std::string keys, std::string prefixes, const char* next) {
      return std::pair{200, "<ListBucketResult><Prefix>run/</Prefix>" + keys + prefixes + "<IsTruncated>" +
                                std::string(next ? "true" : "false") + "</IsTruncated>" +
                                (next ? "<NextContinuationToken>" + std::string(next) + "</NextContinuationToken>" : std::string()) +
                                "</ListBucketResult>"};
    };
    if (r.target.find("continuation-token") == std::string::npos)
      return page("<Contents><Key>run/latest</Key></Contents>", "<CommonPrefixes><Prefix>run/global_step1/</Prefix></CommonPrefixes>", "a/1+=");
    if (r.target.find("continuation-token=a%2F1%2B%3D") != std::string::npos)
      return page("", "<CommonPrefixes><Prefix>run/global_step2/</Prefix></CommonPrefixes>", "b&lt;2");
    if (r.target.find("continuation-token=b%3C2") != std::string::npos)
      return page("<Contents><Key>run/z.txt</Key></Contents>", "", nullptr);
    return std::pair{400, std::string("<Error><Code>InvalidArgument</Code><Message>bad token</Message></Error>")};
  });
  auto o = example_options(l);
  o.prefix = "run";
  ckpt::s3 store{o};
  CHECK(store.list("") == std::vector<std::string>{"global_step1", "global_step2", "latest", "z.txt"});
  CHECK(l.requests().size() == 3);

  listener broken(200, "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>");
  ckpt::s3 bad{example_options(broken)};
  CHECK_THROWS_WITH_AS(bad.list(""), doctest::Contains("no new continuation token"), ckpt::error);
}
