#pragma once
/// @file interop/pickle_opcodes.hpp
/// The opcodes of Python's pickle format that ckpt reads and writes, and the names of all of
/// them for messages (an opcode ckpt refuses is named in the error).

#include <cstdint>
#include <string>

namespace ckpt::interop::detail {

namespace op {
inline constexpr std::uint8_t MARK = '(', STOP = '.', BININT = 'J', BININT1 = 'K', BININT2 = 'M', NONE = 'N',
                              BINPERSID = 'Q', REDUCE = 'R', BINUNICODE = 'X', APPEND = 'a', BUILD = 'b', GLOBAL = 'c',
                              DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', BINGET = 'h', LONG_BINGET = 'j', LIST = 'l',
                              EMPTY_LIST = ']', BINPUT = 'q', LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't',
                              EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G', PROTO = 0x80, TUPLE1 = 0x85,
                              TUPLE2 = 0x86, TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b,
                              SHORT_BINBYTES = 'C', BINBYTES = 'B', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d,
                              BINBYTES8 = 0x8e, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95, NEWOBJ = 0x81,
                              EMPTY_SET = 0x8f, ADDITEMS = 0x90, FROZENSET = 0x91;
}  // namespace op

/// Name of a pickle opcode, for messages (including those refused).
inline std::string opcode_name(std::uint8_t c) {
  switch (c) {
    case '(': return "MARK"; case '.': return "STOP"; case '0': return "POP"; case '1': return "POP_MARK";
    case '2': return "DUP"; case 'F': return "FLOAT"; case 'I': return "INT"; case 'J': return "BININT";
    case 'K': return "BININT1"; case 'L': return "LONG"; case 'M': return "BININT2"; case 'N': return "NONE";
    case 'P': return "PERSID"; case 'Q': return "BINPERSID"; case 'R': return "REDUCE"; case 'S': return "STRING";
    case 'T': return "BINSTRING"; case 'U': return "SHORT_BINSTRING"; case 'V': return "UNICODE";
    case 'X': return "BINUNICODE"; case 'a': return "APPEND"; case 'b': return "BUILD"; case 'c': return "GLOBAL";
    case 'd': return "DICT"; case '}': return "EMPTY_DICT"; case 'e': return "APPENDS"; case 'g': return "GET";
    case 'h': return "BINGET"; case 'i': return "INST"; case 'j': return "LONG_BINGET"; case 'l': return "LIST";
    case ']': return "EMPTY_LIST"; case 'o': return "OBJ"; case 'p': return "PUT"; case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT"; case 's': return "SETITEM"; case 't': return "TUPLE"; case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS"; case 'G': return "BINFLOAT"; case 'B': return "BINBYTES"; case 'C': return "SHORT_BINBYTES";
    case 0x80: return "PROTO"; case 0x81: return "NEWOBJ"; case 0x82: return "EXT1"; case 0x83: return "EXT2";
    case 0x84: return "EXT4"; case 0x85: return "TUPLE1"; case 0x86: return "TUPLE2"; case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE"; case 0x89: return "NEWFALSE"; case 0x8a: return "LONG1"; case 0x8b: return "LONG4";
    case 0x8c: return "SHORT_BINUNICODE"; case 0x8d: return "BINUNICODE8"; case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET"; case 0x90: return "ADDITEMS"; case 0x91: return "FROZENSET"; case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL"; case 0x94: return "MEMOIZE"; case 0x95: return "FRAME"; case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER"; case 0x98: return "READONLY_BUFFER";
    default: {
      static constexpr char hex[] = "0123456789abcdef";
      return std::string("0x") + hex[c >> 4] + hex[c & 15];
    }
  }
}

}  // namespace ckpt::interop::detail
