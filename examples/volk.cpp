// volk (the Vulkan loader, opened at run time) for the interop example and tests: its one
// translation unit.
#define VOLK_IMPLEMENTATION
#include <volk.h>
