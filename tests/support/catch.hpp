// Catch2 v2 (single header, Debian 12) and v3 (split headers) behind one include.
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define QKV_CATCH_V3 1
#else
#include <catch2/catch.hpp>
#endif
