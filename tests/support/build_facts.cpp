// What the tests need to know of this build, compiled once (support/families.hpp declares it): a
// change of the build's configuration recompiles this file alone, not every test.
#ifndef QKV_TEST_COOPMAT_SHADERS
#define QKV_TEST_COOPMAT_SHADERS 0  // tests/CMakeLists.txt: whether the cooperative-matrix shaders are built
#endif

namespace qkv_test {

bool coopmat_shaders_built();
bool coopmat_shaders_built() { return QKV_TEST_COOPMAT_SHADERS != 0; }

}  // namespace qkv_test
