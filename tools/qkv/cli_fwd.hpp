// CLI11's classes that the tool's headers name without including CLI11 (its header is large):
// the one forward declaration of them.
#pragma once

namespace CLI {
class App;
class Option;
}  // namespace CLI
