// Sanitizer builds only: a dlclose that keeps every library loaded.
//
// The Vulkan loader unloads the driver (lavapipe, LLVM) and the validation layer when the
// instance is destroyed. A small allocation those libraries keep for the life of the process
// then shows up in LeakSanitizer's exit report as "<unknown module>", which no suppression can
// match, so a leak in the driver would be indistinguishable from one in qkv. With the libraries
// kept loaded, LeakSanitizer names them and .ci/lsan.supp suppresses exactly those, while a leak
// in qkv's own code still fails the test.
//
// Linked (as a shared library, so it sits in the global symbol scope ahead of libc) only into the
// Vulkan test executables and the qkv tool of a QKV_SANITIZE=address build; never part of the
// library.
extern "C" {
__attribute__((visibility("default"))) int dlclose(void* handle);
__attribute__((visibility("default"))) int dlclose(void* handle) {
    static_cast<void>(handle);
    return 0;
}
}
