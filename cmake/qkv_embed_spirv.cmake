# cmake -DSPV=file.spv -DOUT=file.cpp -DSYMBOL=name -P qkv_embed_spirv.cmake
# Writes the SPIR-V words of SPV as `extern "C" const std::uint32_t SYMBOL[]` and its word count.
file(READ ${SPV} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR rem "${n} % 8")
if(n EQUAL 0 OR NOT rem EQUAL 0)
  message(FATAL_ERROR "${SPV}: not a whole number of 32-bit words")
endif()
# Little-endian bytes b0 b1 b2 b3 -> 0xb3b2b1b0
string(REGEX REPLACE "([0-9a-f][0-9a-f])([0-9a-f][0-9a-f])([0-9a-f][0-9a-f])([0-9a-f][0-9a-f])" "0x\\4\\3\\2\\1u," words "${hex}")
string(REGEX REPLACE "((0x[0-9a-f]+u,){8})" "\\1\n" words "${words}")
math(EXPR count "${n} / 8")
file(WRITE ${OUT} "// Generated from ${SPV} by cmake/qkv_embed_spirv.cmake. Do not edit.\n"
                  "#include <cstddef>\n#include <cstdint>\n"
                  "extern \"C\" const std::uint32_t ${SYMBOL}[] = {\n${words}\n};\n"
                  "extern \"C\" const std::size_t ${SYMBOL}_words = ${count};\n")
