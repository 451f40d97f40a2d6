// Unit tests for qkv::npy (tools/npy). Fixtures in tests/data/npy/ come from numpy itself,
// see tests/data/npy/make_npy_fixtures.py; the build defines QKV_TEST_DATA_DIR.
#include "support/catch.hpp"

#include "npy/npy.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#ifndef QKV_TEST_DATA_DIR
#error "QKV_TEST_DATA_DIR must be defined (absolute path of tests/data)"
#endif

namespace {

namespace npy = qkv::npy;
namespace fs = std::filesystem;
using namespace std::literals;

fs::path fixture(std::string_view name) { return fs::path(QKV_TEST_DATA_DIR) / "npy" / name; }

std::vector<std::byte> file_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(chars.size());
    if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
    return out;
}

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }
std::uint64_t bits(double d) { return std::bit_cast<std::uint64_t>(d); }

std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
    std::vector<std::uint32_t> out;
    for (const float f : v) out.push_back(bits(f));
    return out;
}

// The values make_npy_fixtures.py writes: element i is i / 4 - 0.5.
std::vector<double> ramp(std::size_t n) {
    std::vector<double> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(static_cast<double>(i) / 4 - 0.5);
    return out;
}
std::vector<float> ramp_f(std::size_t n) {
    std::vector<float> out;
    for (const double d : ramp(n)) out.push_back(static_cast<float>(d));
    return out;
}

template <class T>
std::string raw(std::initializer_list<T> values) {
    std::string out(values.size() * sizeof(T), '\0');
    if (values.size() != 0) std::memcpy(out.data(), std::data(values), out.size());
    return out;
}

// A .npy image with a literal header (no padding added) followed by `data`.
std::vector<std::byte> make_npy(std::string_view header, std::string_view data = {}, unsigned major = 1) {
    std::vector<std::byte> out;
    const auto put = [&out](std::size_t c) { out.push_back(static_cast<std::byte>(c & 0xffu)); };
    for (const char c : "\x93NUMPY"sv) put(static_cast<unsigned char>(c));
    put(major);
    put(0);
    const std::size_t n = header.size();
    put(n);
    put(n >> 8);
    if (major != 1) {
        put(n >> 16);
        put(n >> 24);
    }
    for (const char c : header) put(static_cast<unsigned char>(c));
    for (const char c : data) put(static_cast<unsigned char>(c));
    return out;
}

std::string header_for(std::string_view descr, std::string_view shape, std::string_view fortran = "False") {
    return "{'descr': '" + std::string(descr) + "', 'fortran_order': " + std::string(fortran) +
           ", 'shape': " + std::string(shape) + ", }\n";
}

template <class F>
std::string thrown_message(F&& f) {
    try {
        f();
    } catch (const npy::error& e) {
        return e.what();
    }
    FAIL("expected a qkv::npy::error to be thrown");
    return {};
}

void check_message(const std::string& message, std::string_view name, std::initializer_list<std::string_view> parts) {
    INFO("what(): " << message);
    CHECK(message.rfind(name, 0) == 0);  // starts with the file name
    for (const std::string_view part : parts) {
        INFO("expected to contain: " << part);
        CHECK(message.find(part) != std::string::npos);
    }
}

#define CHECK_NPY_ERROR(expr, name, ...) check_message(thrown_message([&] { (void)(expr); }), name, {__VA_ARGS__})

// A fresh directory under the system temp directory, removed (with its contents) afterwards.
struct temp_dir {
    fs::path path;
    temp_dir() {
        std::random_device rd;
        for (int i = 0;; ++i) {
            path = fs::temp_directory_path() / ("qkv_npy_test_" + std::to_string(rd()) + std::to_string(i));
            if (fs::create_directory(path)) break;
        }
    }
    ~temp_dir() {
        std::error_code ec;
        fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
        fs::remove_all(path, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;

    std::vector<std::string> entries() const {
        std::vector<std::string> out;
        for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
        return out;
    }
};

}  // namespace

TEST_CASE("npy: write then read round-trips shape and bits", "[npy]") {
    temp_dir dir;
    const std::vector<std::vector<std::size_t>> shapes = {
        {2, 3}, {5}, {}, {0}, {0, 3}, {3, 0, 2}, {1, 1, 1, 4}, {2, 3, 4}, {17, 33}, {1},
    };
    std::mt19937 rng(42);
    for (const auto& shape : shapes) {
        std::size_t n = 1;
        for (const std::size_t d : shape) n *= d;
        std::vector<float> data(n);
        for (auto& x : data) x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));  // any bits, NaNs too
        const float specials[] = {-0.0f, std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                                  std::bit_cast<float>(0x7fa00001u)};
        for (std::size_t i = 0; i < n && i < std::size(specials); ++i) data[i] = specials[i];

        const fs::path file = dir.path / "out.npy";
        npy::write(file, shape, data);
        const npy::array a = npy::read(file);
        INFO("shape " << a.shape_string());
        CHECK(a.name == file.string());
        CHECK(a.shape == shape);
        CHECK(a.type == npy::dtype::f32);
        CHECK(a.size() == n);
        CHECK(bits_of(a.to_float()) == bits_of(data));

        const std::vector<std::byte> bytes = file_bytes(file);
        REQUIRE(bytes.size() >= 10);
        CHECK(bytes[6] == std::byte{1});
        CHECK((bytes.size() - n * 4) % 64 == 0);  // data starts 64-byte aligned
        CHECK(bytes == npy::serialize(shape, data));
        CHECK(dir.entries() == std::vector<std::string>{"out.npy"});  // no temporary left behind
    }
}

TEST_CASE("npy: shape_string and size", "[npy]") {
    npy::array a;
    CHECK(a.shape_string() == "()");
    CHECK(a.size() == 1);
    a.shape = {7};
    CHECK(a.shape_string() == "(7,)");
    CHECK(a.size() == 7);
    a.shape = {2, 3, 0};
    CHECK(a.shape_string() == "(2, 3, 0)");
    CHECK(a.size() == 0);
    CHECK(npy::dtype_name(npy::dtype::f32) == "float32");
    CHECK(npy::dtype_name(npy::dtype::f64) == "float64");
    CHECK(npy::dtype_name(npy::dtype::b1) == "bool");
    CHECK(npy::itemsize(npy::dtype::f64) == 8);
}

TEST_CASE("npy: serialize is byte-identical to np.save for float32", "[npy]") {
    const struct {
        const char* file;
        std::vector<std::size_t> shape;
        std::vector<float> data;
    } cases[] = {
        {"f4_2x3.npy", {2, 3}, ramp_f(6)},
        {"f4_5.npy", {5}, ramp_f(5)},
        {"f4_0d.npy", {}, {3.5f}},
        {"f4_0x3.npy", {0, 3}, {}},
        {"f4_1x1x1x4.npy", {1, 1, 1, 4}, ramp_f(4)},
    };
    for (const auto& c : cases) {
        INFO(c.file);
        CHECK(npy::serialize(c.shape, c.data) == file_bytes(fixture(c.file)));
    }
    // An empty braced list is the 0-d shape.
    const float one = 1.0f;
    CHECK(npy::serialize({}, std::span(&one, 1)) == npy::serialize(std::vector<std::size_t>{}, std::span(&one, 1)));
}

TEST_CASE("npy: reads numpy files of every supported version, dtype and byte order", "[npy]") {
    for (const char* file : {"f4_2x3.npy", "f4_2x3_v2.npy", "f4_2x3_v3.npy", "f4_be_2x3.npy"}) {
        INFO(file);
        const npy::array a = npy::read(fixture(file));
        CHECK(a.shape == std::vector<std::size_t>{2, 3});
        CHECK(a.type == npy::dtype::f32);
        CHECK(a.to_float() == ramp_f(6));
        CHECK(a.to_double() == ramp(6));
    }
    for (const char* file : {"f8_2x3.npy", "f8_be_2x3.npy"}) {
        INFO(file);
        const npy::array a = npy::read(fixture(file));
        CHECK(a.shape == std::vector<std::size_t>{2, 3});
        CHECK(a.type == npy::dtype::f64);
        CHECK(a.to_double() == ramp(6));
        CHECK(a.to_float() == ramp_f(6));
    }
    SECTION("version bytes") {
        CHECK(file_bytes(fixture("f4_2x3_v2.npy"))[6] == std::byte{2});
        CHECK(file_bytes(fixture("f4_2x3_v3.npy"))[6] == std::byte{3});
    }
    SECTION("0-d and empty") {
        const npy::array s = npy::read(fixture("f4_0d.npy"));
        CHECK(s.shape.empty());
        CHECK(s.size() == 1);
        CHECK(s.shape_string() == "()");
        CHECK(s.to_float() == std::vector<float>{3.5f});
        const npy::array e = npy::read(fixture("f4_0x3.npy"));
        CHECK(e.shape == std::vector<std::size_t>{0, 3});
        CHECK(e.size() == 0);
        CHECK(e.to_float().empty());
        CHECK(e.shape_string() == "(0, 3)");
    }
    SECTION("bool") {
        const npy::array b = npy::read(fixture("b1_2x2.npy"));
        CHECK(b.type == npy::dtype::b1);
        CHECK(b.to_bool() == std::vector<std::uint8_t>{1, 0, 0, 1});
        const std::string name = fixture("b1_2x2.npy").string();
        CHECK_NPY_ERROR(b.to_float(), name, "bool", "float32");
        CHECK_NPY_ERROR(b.to_double(), name, "bool", "float64");
        CHECK_NPY_ERROR(npy::read(fixture("f4_2x3.npy")).to_bool(), fixture("f4_2x3.npy").string(),
                        "expected a bool array", "float32");
    }
    SECTION("float64 to float32 rounds to nearest") {
        const npy::array a = npy::read(fixture("f8_special.npy"));
        const std::vector<float> f = a.to_float();
        REQUIRE(f.size() == 6);
        CHECK(bits(f[0]) == bits(static_cast<float>(1.0 / 3)));
        CHECK(f[1] == -2.5f);
        CHECK(bits(f[2]) == bits(std::numeric_limits<float>::infinity()));  // 1e300
        CHECK(bits(f[3]) == bits(-0.0f));                                   // -1e-300
        CHECK(bits(f[4]) == bits(std::numeric_limits<float>::infinity()));
        CHECK(std::isnan(f[5]));
        CHECK(bits(a.to_double()[2]) == bits(1e300));
    }
}

TEST_CASE("npy: float64 to float32 rounding at the edges of the range", "[npy]") {
    constexpr double flt_max = std::numeric_limits<float>::max();
    const double midpoint = 0x1.ffffffp127;  // halfway between FLT_MAX and 2^128: ties to even -> inf
    const double below = std::nextafter(midpoint, 0.0);
    const std::string data =
        raw<double>({midpoint, below, -below, flt_max, 1e39, -1e39, 0x1p-150, 0x1.8p-150, 0x1p-149, 0x1.000002p-126});
    const auto bytes = make_npy(header_for("<f8", "(10,)"), data);
    const std::vector<float> f = npy::parse(bytes, "edge.npy").to_float();
    REQUIRE(f.size() == 10);
    const float inf = std::numeric_limits<float>::infinity();
    const float fmax = std::numeric_limits<float>::max();
    CHECK(bits(f[0]) == bits(inf));
    CHECK(bits(f[1]) == bits(fmax));
    CHECK(bits(f[2]) == bits(-fmax));
    CHECK(bits(f[3]) == bits(fmax));
    CHECK(bits(f[4]) == bits(inf));
    CHECK(bits(f[5]) == bits(-inf));
    CHECK(bits(f[6]) == 0u);  // half the smallest subnormal ties to even: 0
    CHECK(bits(f[7]) == 1u);  // 0.75 of it rounds up
    CHECK(bits(f[8]) == 1u);
    CHECK(bits(f[9]) == bits(0x1.000002p-126f));
}

TEST_CASE("npy: header syntax variants numpy accepts", "[npy]") {
    const std::string two_f8 = raw<double>({1.5, -3.0});
    const std::string two_f4 = raw<float>({1.5f, -3.0f});
    const std::string big_f4 = "\x3f\xc0\x00\x00\xc0\x40\x00\x00"s;  // 1.5, -3.0 big-endian
    const struct {
        std::string header;
        std::string data;
        npy::dtype type;
    } cases[] = {
        {R"({"descr": "<f8", "fortran_order": False, "shape": (2,)})", two_f8, npy::dtype::f64},
        {"{ 'shape' : ( 2 , ) ,\n\t'fortran_order':False,'descr':'<f4',}  \n", two_f4, npy::dtype::f32},
        {"{'descr':'=f4','fortran_order':False,'shape':(2L,)}", two_f4, npy::dtype::f32},
        {"{'descr':'>f4','fortran_order':False,'shape':(2,),}", big_f4, npy::dtype::f32},
        {"{'descr':'<f4','fortran_order':False,'shape':(1, 2)}" + std::string(100, ' ') + "\n", two_f4,
         npy::dtype::f32},
        {"{'descr':'<f4','fortran_order':False,'shape':((2),)}", two_f4, npy::dtype::f32},
        {"{'descr':'<f4','fortran_order':False,'shape':(+2,)}", two_f4, npy::dtype::f32},
        {"{'descr':'<f4','fortran_order':False,'shape':(0002,)}", two_f4, npy::dtype::f32},
        {"{'descr':'\\x3cf4','fortran_order':False,'shape':(2,)}", two_f4, npy::dtype::f32},
        {"{'descr':'<f4','fortran_order':False,'shape':(2,\\\n)}", two_f4, npy::dtype::f32},
        {"{'descr':'|b1','fortran_order':False,'shape':(2,)}", "\x01\x00"s, npy::dtype::b1},
        {"{'descr':'<b1','fortran_order':False,'shape':(2,)}", "\x01\x00"s, npy::dtype::b1},
        {"{'descr':'<i4','fortran_order':False,'shape':(2,)}", raw<std::int32_t>({7, -3}), npy::dtype::i4},
        {"{'descr':'>i4','fortran_order':False,'shape':(2,)}", "\x00\x00\x00\x07\xff\xff\xff\xfd"s, npy::dtype::i4},
    };
    for (const auto& c : cases) {
        INFO("header: " << c.header);
        for (const unsigned major : {1u, 2u, 3u}) {
            const npy::array a = npy::parse(make_npy(c.header, c.data, major), "ok.npy");
            CHECK(a.type == c.type);
            if (c.type == npy::dtype::b1) {
                CHECK(a.to_bool() == std::vector<std::uint8_t>{1, 0});
            } else if (c.type == npy::dtype::i4) {
                CHECK(a.to_int32() == std::vector<std::int32_t>{7, -3});
                CHECK_NPY_ERROR(a.to_float(), "ok.npy", "int32", "float32");
                CHECK_NPY_ERROR(a.to_bool(), "ok.npy", "expected a bool array", "int32");
            } else {
                CHECK(a.to_float() == std::vector<float>{1.5f, -3.0f});
            }
            CHECK(a.size() == 2);
        }
    }
    // A 0-d array, header without the final newline.
    const npy::array s =
        npy::parse(make_npy("{'descr':'<f4','fortran_order':False,'shape':()}", raw<float>({2.0f})), "s");
    CHECK(s.shape.empty());
    CHECK(s.to_float() == std::vector<float>{2.0f});
}

TEST_CASE("npy: refused dtypes name the dtype", "[npy]") {
    CHECK(npy::read(fixture("i4_3.npy")).to_int32() == std::vector<std::int32_t>{0, 1, 2});  // int32 is read
    const struct {
        const char* file;
        const char* descr;
    } cases[] = {
        {"f2_3.npy", "'<f2'"},
        {"unicode_2.npy", "'<U2'"},
        {"object_2.npy", "'|O'"},
        {"structured_2.npy", "[('a', '<f4'), ('b', '<i4')]"},
    };
    for (const auto& c : cases) {
        const fs::path path = fixture(c.file);
        CHECK_NPY_ERROR(npy::read(path), path.string(), "unsupported dtype", c.descr,
                        "(expected float32, float64, bool or int32)");
    }
    CHECK(thrown_message([] { npy::parse(make_npy(header_for("<i8", "(1,)"), "\0\0\0\0\0\0\0\0"sv), "x.npy"); }) ==
          "x.npy: unsupported dtype '<i8' (expected float32, float64, bool or int32)");
    for (const char* descr : {"f4", "float32", "|f4", "<f16", "<c8", "?", "<f4 ", ""}) {
        CHECK_NPY_ERROR(npy::parse(make_npy(header_for(descr, "(1,)"), "\0\0\0\0"sv), "x.npy"), "x.npy",
                        "unsupported dtype");
    }
    CHECK_NPY_ERROR(npy::parse(make_npy("{'descr': None, 'fortran_order': False, 'shape': (1,)}", "\0\0\0\0"sv), "x"),
                    "x", "unsupported dtype None");
    CHECK_NPY_ERROR(
        npy::parse(make_npy("{'descr': [('\xc3\xa9', '<f4')], 'fortran_order': False, 'shape': (1,)}", "\0\0\0\0"sv, 3),
                   "utf8.npy"),
        "utf8.npy", "unsupported dtype [('\\xc3\\xa9', '<f4')]");
}

TEST_CASE("npy: Fortran order is refused", "[npy]") {
    const fs::path path = fixture("fortran_2x3.npy");
    CHECK_NPY_ERROR(npy::read(path), path.string(),
                    "Fortran-order arrays are not supported; save with np.ascontiguousarray");
    CHECK_NPY_ERROR(npy::parse(make_npy(header_for("<f4", "(1,)", "0"), "\0\0\0\0"sv), "x.npy"), "x.npy",
                    "'fortran_order' must be True or False, found 0");
}

TEST_CASE("npy: truncated and oversized data", "[npy]") {
    const std::string six = raw<float>({1, 2, 3, 4, 5, 6});
    const std::string header = header_for("<f4", "(2, 3)");
    CHECK(thrown_message([&] { npy::parse(make_npy(header, six.substr(0, 20)), "t.npy"); }) ==
          "t.npy: truncated: expected 24 bytes of data, found 20");
    CHECK_NPY_ERROR(npy::parse(make_npy(header, six + "\0\0\0\0"s), "t.npy"), "t.npy", "trailing",
                    "expected 24 bytes of data, found 28");
    CHECK_NPY_ERROR(npy::parse(make_npy(header_for("<f8", "(2, 3)"), six), "t.npy"), "t.npy", "truncated",
                    "expected 48 bytes of data, found 24");
    CHECK_NPY_ERROR(npy::parse(make_npy(header_for("<f4", "(0, 3)"), "\0"sv), "t.npy"), "t.npy",
                    "expected 0 bytes of data, found 1");
    // Huge but representable sizes are compared with what is present before anything is allocated.
    CHECK_NPY_ERROR(npy::parse(make_npy(header_for("<f8", "(1000000000, 1000000000)")), "t.npy"), "t.npy",
                    "truncated: expected 8000000000000000000 bytes of data, found 0");
    // Sizes that overflow are refused as such.
    for (const char* shape : {"(4294967296, 4294967296)", "(1152921504606846976,)", "(0, 18446744073709551615)",
                              "(3, 3074457345618258603)"}) {
        CHECK_NPY_ERROR(npy::parse(make_npy(header_for("<f8", shape)), "t.npy"), "t.npy", "too large");
    }
    CHECK_NPY_ERROR(npy::parse(make_npy(header_for("<f4", "(18446744073709551616,)")), "t.npy"), "t.npy",
                    "dimension too large");

    SECTION("truncated preamble and header") {
        const std::vector<std::byte> good = make_npy(header, six);
        for (std::size_t cut : {std::size_t{1}, std::size_t{6}, std::size_t{7}, std::size_t{9}}) {
            INFO("cut at " << cut);
            CHECK_NPY_ERROR(npy::parse(std::span(good).first(cut), "t.npy"), "t.npy", "truncated");
        }
        for (std::size_t cut = 10; cut < 10 + header.size(); cut += 7) {
            INFO("cut at " << cut);
            CHECK_NPY_ERROR(npy::parse(std::span(good).first(cut), "t.npy"), "t.npy", "truncated: header");
        }
        CHECK_NPY_ERROR(npy::parse(std::span<const std::byte>(), "t.npy"), "t.npy", "truncated");
    }
}

TEST_CASE("npy: bad magic and versions", "[npy]") {
    std::vector<std::byte> bytes = make_npy(header_for("<f4", "()"), raw<float>({1.0f}));
    CHECK_NPY_ERROR(npy::parse(std::span(bytes).subspan(1), "m.npy"), "m.npy", "not a .npy file");
    const std::string text = "hello world, this is not numpy";
    CHECK_NPY_ERROR(npy::parse(std::as_bytes(std::span(text)), "m.npy"), "m.npy", "not a .npy file");
    for (const auto& [major, minor] : {std::pair{4, 0}, {0, 0}, {1, 1}, {2, 5}, {255, 255}}) {
        bytes[6] = static_cast<std::byte>(major);
        bytes[7] = static_cast<std::byte>(minor);
        CHECK_NPY_ERROR(npy::parse(bytes, "m.npy"), "m.npy", "unsupported .npy format version",
                        std::to_string(major) + "." + std::to_string(minor));
    }
}

TEST_CASE("npy: malformed headers", "[npy]") {
    const std::string one = raw<float>({1.0f});
    const struct {
        std::string header;
        const char* expect;
    } cases[] = {
        {"", "invalid header"},
        {"   \n", "invalid header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': ()", "expected ',' or '}'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (), ", "invalid header"},
        {"{'descr: '<f4', 'fortran_order': False, 'shape': ()}", "invalid header"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': ()}", "invalid header"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': ()} x", "after the header dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': ()}}", "after the header dict"},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': ()}", "expected ':'"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': ()}", "expected ',' or '}'"},
        {"{'descr': '<f4', 'fortran_order': false, 'shape': ()}", "unexpected name 'false'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1.0,)}", "number syntax"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (0x1,)}", "number syntax"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,,)}", "expected a value"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (- ,)}", "digits after a sign"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}", "expected ',' or ')'"},
        {"{'descr': '<f4\n', 'fortran_order': False, 'shape': ()}", "newline inside a string"},
        {"{'descr': '<f4\\x4', 'fortran_order': False, 'shape': ()}", "\\x escape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(40, '(') + std::string(40, ')') + "}",
         "nesting"},
        {"['descr', '<f4']", "expected a dict, found ['descr', '<f4']"},
        {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
        {"{'fortran_order': False, 'shape': ()}", "missing key 'descr'"},
        {"{'descr': '<f4', 'shape': ()}", "missing key 'fortran_order'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'shape': ()}", "duplicate key 'shape'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", "unexpected key 'extra'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 1: 2}", "unexpected key 1"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': 1}", "'shape' must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", "'shape' must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}",
         "'shape' must be a tuple of non-negative integers, found [1]"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (True,)}", "'shape' must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': ('1',)}", "'shape' must be a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", "negative dimension in shape (-1,)"},
        {"{'descr': '<f4', 'fortran_order': None, 'shape': ()}", "'fortran_order' must be True or False"},
    };
    for (const auto& c : cases) {
        INFO("header: " << c.header);
        CHECK_NPY_ERROR(npy::parse(make_npy(c.header, one), "h.npy"), "h.npy", c.expect);
    }
    SECTION("format 3.0 headers must be UTF-8, 1.0 headers are Latin-1") {
        const std::string header = "{'descr': '<f4\xff', 'fortran_order': False, 'shape': ()}";
        CHECK_NPY_ERROR(npy::parse(make_npy(header, one, 3), "u.npy"), "u.npy", "not valid UTF-8");
        CHECK_NPY_ERROR(npy::parse(make_npy(header, one, 1), "u.npy"), "u.npy", "unsupported dtype '<f4\\xff'");
    }
    SECTION("long values are abbreviated in messages") {
        const std::string header = "{'descr': '" + std::string(5000, 'x') + "', 'fortran_order': False, 'shape': ()}";
        const std::string message = thrown_message([&] { npy::parse(make_npy(header, one), "l.npy"); });
        CHECK(message.size() < 300);
        CHECK(message.find("...") != std::string::npos);
    }
}

TEST_CASE("npy: bool arrays must hold 0 or 1", "[npy]") {
    const npy::array a = npy::parse(make_npy(header_for("|b1", "(4,)"), "\x01\x00\x02\x01"s), "b.npy");
    CHECK_NPY_ERROR(a.to_bool(), "b.npy", "byte value 2 at element 2");
}

TEST_CASE("npy: arrays whose data does not match their shape are refused", "[npy]") {
    npy::array a;
    a.name = "made.npy";
    a.shape = {2, 2};
    a.data.resize(12);
    CHECK_NPY_ERROR(a.to_float(), "made.npy", "does not match shape (2, 2)");
    CHECK_NPY_ERROR(a.to_double(), "made.npy", "does not match");
    a.shape = {std::size_t{1} << 40, std::size_t{1} << 40};
    CHECK_NPY_ERROR(a.size(), "made.npy", "overflows");
    CHECK_NPY_ERROR(a.to_float(), "made.npy", "does not match");
}

TEST_CASE("npy: read errors name the path", "[npy]") {
    temp_dir dir;
    const fs::path missing = dir.path / "missing.npy";
    CHECK_NPY_ERROR(npy::read(missing), missing.string(), "cannot open", "No such file or directory");
    CHECK_NPY_ERROR(npy::read(dir.path), dir.path.string());
    const fs::path bad = dir.path / "bad.npy";
    std::ofstream(bad) << "not numpy";
    CHECK_NPY_ERROR(npy::read(bad), bad.string(), "not a .npy file");
}

TEST_CASE("npy: write refuses mismatched data and leaves no file", "[npy]") {
    temp_dir dir;
    const fs::path file = dir.path / "x.npy";
    const std::vector<std::size_t> shape = {2, 3};
    const std::vector<float> five(5, 1.0f);
    CHECK_NPY_ERROR(npy::write(file, shape, five), file.string(), "(2, 3) holds 6 elements but 5 values");
    CHECK(dir.entries().empty());
    CHECK_NPY_ERROR(npy::serialize(shape, five), "qkv::npy::serialize", "holds 6 elements but 5 values");
    const std::vector<std::size_t> huge = {std::size_t{1} << 62, 0};
    CHECK_NPY_ERROR(npy::write(file, huge, std::span<const float>()), file.string(), "too large");
    CHECK(dir.entries().empty());
}

TEST_CASE("npy: write failures throw, name the path and leave nothing behind", "[npy]") {
    temp_dir dir;
    const std::vector<std::size_t> shape = {2};
    const std::vector<float> data = {1.0f, 2.0f};

    SECTION("missing directory") {
        const fs::path file = dir.path / "no" / "such" / "dir" / "x.npy";
        CHECK_NPY_ERROR(npy::write(file, shape, data), file.string(), "No such file or directory");
        CHECK(dir.entries().empty());
    }
    SECTION("a path through a regular file: no one can create it, root included") {
        // (chmod would not do: CI runs as root, which ignores directory permissions.)
        const fs::path plain = dir.path / "plain";
        std::ofstream(plain) << "a file, not a directory";
        const fs::path file = plain / "x.npy";
#ifdef _WIN32
        const char* why = "";  // Windows reports a missing path
#else
        const char* why = "Not a directory";
#endif
        CHECK_NPY_ERROR(npy::write(file, shape, data), file.string(), "cannot create temporary file", why);
        CHECK(dir.entries() == std::vector<std::string>{"plain"});
        CHECK_NPY_ERROR(npy::read(file), file.string(), "cannot open", why);
    }
    SECTION("target is a directory: the rename fails after the data was written") {
        const fs::path target = dir.path / "target.npy";
        fs::create_directory(target);
        fs::create_directory(target / "child");  // a non-empty directory cannot be replaced
        CHECK_NPY_ERROR(npy::write(target, shape, data), target.string(), "cannot replace");
        CHECK(dir.entries() == std::vector<std::string>{"target.npy"});  // temporary removed
        CHECK(fs::is_directory(target / "child"));
    }
    SECTION("not a file name") {
        CHECK_NPY_ERROR(npy::write(dir.path / "", shape, data), (dir.path / "").string(), "not a file name");
        CHECK(dir.entries().empty());
    }
    SECTION("existing file is replaced only on success") {
        const fs::path file = dir.path / "x.npy";
        npy::write(file, shape, data);
        const std::vector<float> three = {1.0f, 2.0f, 3.0f};
        CHECK_THROWS_AS(npy::write(file, shape, three), npy::error);
        CHECK(npy::read(file).to_float() == data);
        npy::write(file, std::vector<std::size_t>{3}, three);
        CHECK(npy::read(file).to_float() == three);
        CHECK(dir.entries() == std::vector<std::string>{"x.npy"});
    }
}

TEST_CASE("npy: a long file name still gets its temporary file", "[npy]") {
#ifdef _WIN32
    WARN("Windows limits the whole path (MAX_PATH), not the name; not checked");
    return;
#endif
    // 250 characters + ".npy" fits NAME_MAX (255); a temporary named after it would not.
    temp_dir dir;
    const fs::path file = dir.path / (std::string(250, 'n') + ".npy");
    const std::vector<std::size_t> shape = {2};
    const std::vector<float> data = {1.0f, 2.0f};
    npy::write(file, shape, data);
    CHECK(npy::read(file).to_float() == data);
    CHECK(dir.entries().size() == 1);
}

TEST_CASE("npy: float64 is written as np.save writes it", "[npy]") {
    const std::vector<std::size_t> shape = {2, 3};
    const std::vector<double> data = ramp(6);
    CHECK(npy::serialize(shape, data) == file_bytes(fixture("f8_2x3.npy")));
    const std::vector<double> special = {-1e300, 1e-310, std::numeric_limits<double>::infinity(), 0.1};
    const npy::array a = npy::parse(npy::serialize(std::vector<std::size_t>{4}, special), "f8");
    CHECK(a.type == npy::dtype::f64);
    CHECK(a.to_double() == special);

    temp_dir dir;
    const fs::path file = dir.path / "f8.npy";
    npy::write(file, std::vector<std::size_t>{4}, special);
    CHECK(npy::read(file).to_double() == special);
    const std::vector<std::byte> head = npy::header(shape, npy::dtype::f64);
    const std::vector<std::byte> whole = npy::serialize(shape, data);
    CHECK(std::equal(head.begin(), head.end(), whole.begin()));
    CHECK(whole.size() == head.size() + 6 * sizeof(double));
}

#if defined(__SANITIZE_ADDRESS__)
#define QKV_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QKV_TEST_ASAN 1
#endif
#endif

TEST_CASE("npy: read checks the header before the data and reads no more than it declares", "[npy]") {
#ifdef _WIN32
    constexpr std::uintmax_t huge = std::uintmax_t{1} << 26;  // Wine's files may not be sparse
#else
    constexpr std::uintmax_t huge = std::uintmax_t{1} << 36;  // 64 GiB, sparse: reading it whole fails
#endif
    temp_dir dir;
    SECTION("a huge file that is not .npy fails at once") {
        const fs::path big = dir.path / "big.bin";
        { std::ofstream(big) << "not numpy"; }
        fs::resize_file(big, huge);
        CHECK_NPY_ERROR(npy::read(big), big.string(), "not a .npy file");
    }
    SECTION("a valid header followed by far more data than it declares") {
        const fs::path big = dir.path / "trailing.npy";
        const std::vector<std::byte> image = npy::serialize(std::vector<std::size_t>{2}, std::vector<float>{1, 2});
        {
            std::ofstream out(big, std::ios::binary);
            out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
        }
        fs::resize_file(big, huge);
        CHECK_NPY_ERROR(npy::read(big), big.string(), "unexpected trailing data: expected 8 bytes of data");
    }
    SECTION("a header declaring far more data than the file holds") {
        const fs::path file = dir.path / "claims.npy";
        const std::vector<std::byte> image = make_npy(header_for("<f4", "(1099511627776,)"), "\0\0\0\0"sv);
        {
            std::ofstream out(file, std::ios::binary);
            out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
        }
        CHECK_NPY_ERROR(npy::read(file), file.string(), "truncated: expected 4398046511104 bytes of data, found 4");
    }
#if !defined(_WIN32) && !defined(QKV_TEST_ASAN)  // ASan aborts on a 1 TiB allocation instead of throwing
    SECTION("data that cannot be held in memory: the error gives the sizes") {
        // A sparse 1 TiB file whose header declares all of it. Checked only where the kernel
        // refuses an allocation beyond memory (overcommit mode 0 or 2) instead of granting it.
        std::ifstream mode_file("/proc/sys/vm/overcommit_memory");
        int mode = 1;
        mode_file >> mode;
        if (mode == 1) {
            WARN("vm.overcommit_memory is 1: a 1 TiB allocation would succeed; not checked");
        } else {
            const fs::path file = dir.path / "huge.npy";
            const std::vector<std::byte> image = make_npy(header_for("<f4", "(274877906944,)"));
            {
                std::ofstream out(file, std::ios::binary);
                out.write(reinterpret_cast<const char*>(image.data()), static_cast<std::streamsize>(image.size()));
            }
            fs::resize_file(file, image.size() + (std::uintmax_t{1} << 40));
            CHECK_NPY_ERROR(npy::read(file), file.string(), "out of memory: the header declares 1099511627776 bytes",
                            "(274877906944,), float32");
        }
    }
#endif
#ifndef _WIN32
    SECTION("/dev/zero") { CHECK_NPY_ERROR(npy::read("/dev/zero"), "/dev/zero", "not a .npy file"); }
#endif
}

TEST_CASE("npy: headers longer than 65535 bytes use format 2.0", "[npy]") {
    const std::vector<std::size_t> shape(30000, 1);  // "(1, 1, 1, ...)": about 90 kB of header
    const std::vector<float> data = {42.0f};
    const std::vector<std::byte> bytes = npy::serialize(shape, data);
    REQUIRE(bytes.size() > 65536);
    CHECK(bytes[6] == std::byte{2});
    CHECK(bytes[7] == std::byte{0});
    CHECK((bytes.size() - 4) % 64 == 0);
    const npy::array a = npy::parse(bytes, "big-header");
    CHECK(a.shape == shape);
    CHECK(a.to_float() == data);

    const std::vector<std::size_t> small(100, 1);
    CHECK(npy::serialize(small, data)[6] == std::byte{1});
}
