// Writing all of the results or none (see output_files.hpp).
#include "output_files.hpp"

#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "npy/npy.hpp"

namespace qkv::cli {

void write_all(const std::vector<output_file>& files) {
    std::vector<std::string> written;
    for (const output_file& f : files) {
        if (f.path.empty()) continue;
        try {
            qkv::npy::write(qkv::npy::path_from_utf8(f.path), f.shape, f.data);
        } catch (const qkv::npy::error& e) {
            for (const std::string& path : written) {
                std::error_code ignored;
                std::filesystem::remove(qkv::npy::path_from_utf8(path), ignored);
            }
            throw std::runtime_error(e.what());
        }
        written.push_back(f.path);
    }
}

}  // namespace qkv::cli
