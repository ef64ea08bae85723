#pragma once
// ckpt's one JSON library: the rapidjson that cereal ships (or Debian's, which cereal uses
// there), configured the way cereal configures it (a failed RAPIDJSON_ASSERT throws), so every
// translation unit of a program sees one rapidjson. metadata.json and the safetensors reader use
// it directly: parsed from memory and written into a string buffer, without the per-character
// std::istream/std::ostream calls of cereal's JSON archives.

#include <cereal/archives/json.hpp>

#include <string>

namespace ckpt::detail {

#if defined(CEREAL_RAPIDJSON_NAMESPACE)
namespace rj = CEREAL_RAPIDJSON_NAMESPACE;
#else
namespace rj = RAPIDJSON_NAMESPACE;
#endif

/// What a rapidjson parse error means, in words.
inline std::string rj_error_text(rj::ParseErrorCode code) {
  switch (code) {
    case rj::kParseErrorDocumentEmpty: return "the document is empty";
    case rj::kParseErrorDocumentRootNotSingular: return "text follows the JSON value";
    case rj::kParseErrorValueInvalid: return "invalid value";
    case rj::kParseErrorObjectMissName: return "an object member has no name";
    case rj::kParseErrorObjectMissColon: return "missing ':' after an object member name";
    case rj::kParseErrorObjectMissCommaOrCurlyBracket: return "missing ',' or '}' in an object";
    case rj::kParseErrorArrayMissCommaOrSquareBracket: return "missing ',' or ']' in an array";
    case rj::kParseErrorStringUnicodeEscapeInvalidHex: return "bad \\u escape";
    case rj::kParseErrorStringUnicodeSurrogateInvalid: return "bad UTF-16 surrogate in a \\u escape";
    case rj::kParseErrorStringEscapeInvalid: return "invalid escape in a string";
    case rj::kParseErrorStringMissQuotationMark: return "unterminated string";
    case rj::kParseErrorStringInvalidEncoding: return "invalid encoding in a string";
    case rj::kParseErrorNumberTooBig: return "number too big";
    case rj::kParseErrorNumberMissFraction: return "bad fraction";
    case rj::kParseErrorNumberMissExponent: return "bad exponent";
    default: return "parse error " + std::to_string(static_cast<int>(code));
  }
}

/// The member `name` of a JSON object, or nullptr. rapidjson 1.1's member iterators compare
/// ambiguously under C++20's reversed operators (clang rejects them), so members are reached by
/// index instead.
inline const rj::Value* find_member(const rj::Value& object, std::string_view name) {
  const auto first = object.MemberBegin();
  for (rj::SizeType i = 0; i < object.MemberCount(); ++i) {
    const auto& m = first[static_cast<std::ptrdiff_t>(i)];
    if (std::string_view(m.name.GetString(), m.name.GetStringLength()) == name) return &m.value;
  }
  return nullptr;
}

}  // namespace ckpt::detail
